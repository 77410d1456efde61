// CONV1D_SSM and GATED_DELTA on CUDA: node validation and launches (design: ssm.h).
#include "backends/cuda/common/kernel_args.h"
#include "backends/cuda/common/launch.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/ops.h"
#include "backends/cuda/ssm/ssm_kernels.cuh"

namespace spark::cuda {

namespace ssm {

void launch_conv1d(const ConvParams & p, bool one_token_per_seq, cudaStream_t stream) {
    if (p.n_seqs <= 0 || p.C <= 0) return;
    if (p.K < 2 || p.K > kConvMaxK) fail(SPARK_ERR_UNSUPPORTED, "conv1d_ssm (CUDA): kernel size %d is not supported (2..%d)", p.K, kConvMaxK);
    SPARK_ASSERT(p.R >= 1 && p.pos);
    if (p.n_seqs > 65535) fail(SPARK_ERR_UNSUPPORTED, "conv1d_ssm (CUDA): %d sequences in one step", p.n_seqs);
    const dim3 block = one_token_per_seq ? dim3(256, 1) : dim3(32, 8);
    const dim3 grid(unsigned((p.C + block.x - 1) / block.x), unsigned(p.n_seqs));
    launch(conv1d_ssm_kernel, grid, block, 0, stream, p);
    SPARK_CUDA_CHECK_LAUNCH();
}

void launch_gated_delta(const GdnParams & p, cudaStream_t stream) {
    if (p.n_seqs <= 0) return;
    SPARK_ASSERT(p.R >= 1 && p.pos);
    if (p.dv % kGdnCols != 0)
        fail(SPARK_ERR_UNSUPPORTED, "gated_delta (CUDA): value head dim %d is not a multiple of %d", p.dv, kGdnCols);
    if (p.n_seqs > 65535) fail(SPARK_ERR_UNSUPPORTED, "gated_delta (CUDA): %d sequences in one step", p.n_seqs);
    const dim3 grid(unsigned(p.n_vh * (p.dv / kGdnCols)), unsigned(p.n_seqs));
    switch (p.dk) {
        case 64: launch(gated_delta_kernel<64>, grid, kGdnThreads, 0, stream, p); break;
        case 128: launch(gated_delta_kernel<128>, grid, kGdnThreads, 0, stream, p); break;
        default: fail(SPARK_ERR_UNSUPPORTED, "gated_delta (CUDA): key head dim %d is not supported (64, 128)", p.dk);
    }
    SPARK_CUDA_CHECK_LAUNCH();
}

}  // namespace ssm

namespace {
// A ring state [state_size, R, n_slots] (graph.h: "Recurrent state with rollback") and the step's
// positions, which the kernels index by token.
void check_state_and_pos(const Tensor & st, int64_t state_size, const Tensor & pos, int64_t n_tok) {
    SPARK_ASSERT(st.ne[0] == state_size && st.ne[3] == 1);
    SPARK_ASSERT(st.ne[1] >= 1 && st.ne[1] <= INT32_MAX && st.ne[2] <= INT32_MAX);
    SPARK_ASSERT(pos.type == DType::I32 && pos.is_contiguous() && pos.ne[0] >= n_tok);
}
}  // namespace

void op_conv1d_ssm(const Tensor & t, const OpContext & ctx) {
    const Tensor & w   = *t.src[1];
    const Tensor & st  = *t.src[2];
    const Tensor & pos = *t.src[5];
    const Tensor & rg  = *t.src[7];
    if (w.type != DType::F32 || !w.is_contiguous() || st.type != DType::F32 || !st.is_contiguous())
        fail(SPARK_ERR_UNSUPPORTED, "conv1d_ssm (CUDA): w and the state must be F32 and contiguous");
    SPARK_ASSERT(rg.type == DType::I32 && rg.ne[0] == 3 && rg.is_contiguous());
    SPARK_ASSERT(t.type == DType::F32 && t.nb[0] == 4 && t.ne[2] == 1 && t.ne[3] == 1);
    const int64_t C = t.ne[0], K = w.ne[0], T = t.ne[1];
    SPARK_ASSERT(w.ne[1] == C);
    check_state_and_pos(st, (K - 1) * C, pos, T);
    if (C > INT32_MAX / 2) fail(SPARK_ERR_UNSUPPORTED, "conv1d_ssm (CUDA): %lld channels", (long long)C);
    ssm::ConvParams p;
    SPARK_ASSERT(t.ip[0] >= 1 && t.ip[0] <= ssm::kConvMaxParts);
    p.n_parts = t.ip[0];
    int64_t channels = 0;
    for (int i = 0; i < p.n_parts; ++i) {  // [len, groups, T] parts (graph.h)
        const Tensor & x = *t.src[kConvPartSrc[i]];
        if (!f32_rows(x)) fail(SPARK_ERR_UNSUPPORTED, "conv1d_ssm (CUDA): x must be F32 with contiguous rows");
        SPARK_ASSERT(x.ne[2] == T && x.ne[3] == 1);
        std::tie(p.part[i].x, p.part[i].nb1, p.part[i].nb2) = head_rows(x);
        p.part[i].len    = int(x.ne[0]);
        p.part[i].groups = int(x.ne[1]);
        channels += x.ne[0] * x.ne[1];
    }
    SPARK_ASSERT(channels == C);
    p.w       = static_cast<const float *>(w.data);
    p.state   = static_cast<float *>(st.data);
    p.ranges  = static_cast<const int32_t *>(rg.data);
    p.pos     = static_cast<const int32_t *>(pos.data);
    p.out     = static_cast<float *>(t.data);
    p.out_nb1 = int64_t(t.nb[1]);
    p.C       = int(C);
    p.K       = int(K);
    p.R       = int(st.ne[1]);
    p.n_slots = int(st.ne[2]);
    p.n_seqs  = int(rg.ne[1]);
    // Every sequence of a step has at least one token, so T == S means one token each (decode).
    ssm::launch_conv1d(p, T == rg.ne[1], ctx.stream);
}

void op_gated_delta(const Tensor & t, const OpContext & ctx) {
    const Tensor & q   = *t.src[0];
    const Tensor & k   = *t.src[1];
    const Tensor & v   = *t.src[2];
    const Tensor & a   = *t.src[3];
    const Tensor & b   = *t.src[4];
    const Tensor & Al  = *t.src[5];
    const Tensor & dt  = *t.src[6];
    const Tensor & st  = *t.src[7];
    const Tensor & rg  = *t.src[8];
    const Tensor & pos = *t.src[9];
    if (!f32_rows(q) || !f32_rows(k) || !f32_rows(v) || !f32_rows(a) || !f32_rows(b) || Al.type != DType::F32 ||
        dt.type != DType::F32 || !Al.is_contiguous() || !dt.is_contiguous() || st.type != DType::F32 || !st.is_contiguous())
        fail(SPARK_ERR_UNSUPPORTED, "gated_delta (CUDA): inputs and state must be F32 with contiguous rows");
    SPARK_ASSERT(rg.type == DType::I32 && rg.ne[0] == 3 && rg.is_contiguous());
    SPARK_ASSERT(t.type == DType::F32 && t.nb[0] == 4);
    const int64_t dk = q.ne[0], n_kh = q.ne[1], dv = v.ne[0], n_vh = v.ne[1];
    SPARK_ASSERT(n_kh > 0 && n_vh % n_kh == 0);
    check_state_and_pos(st, dk * dv * n_vh, pos, q.ne[2]);
    ssm::GdnParams p;
    std::tie(p.q, p.q_nb1, p.q_nb2) = head_rows(q);
    std::tie(p.k, p.k_nb1, p.k_nb2) = head_rows(k);
    std::tie(p.v, p.v_nb1, p.v_nb2) = head_rows(v);
    SPARK_ASSERT(a.ne[0] * a.ne[1] == n_vh && b.ne[0] * b.ne[1] == n_vh && a.ne[2] == q.ne[2] && b.ne[2] == q.ne[2]);
    p.a       = static_cast<const char *>(a.data);  // [r, groups, T] (graph.h)
    p.a_nbg   = int64_t(a.nb[1]);
    p.a_nbt   = int64_t(a.nb[2]);
    p.a_r     = int(a.ne[0]);
    p.b       = static_cast<const char *>(b.data);
    p.b_nbg   = int64_t(b.nb[1]);
    p.b_nbt   = int64_t(b.nb[2]);
    p.b_r     = int(b.ne[0]);
    p.qk_l2norm = t.ip[0] != 0;
    p.qk_eps    = t.fp[0];
    p.q_scale   = t.fp[1];
    p.A_log   = static_cast<const float *>(Al.data);
    p.dt_bias = static_cast<const float *>(dt.data);
    p.state   = static_cast<float *>(st.data);
    p.ranges  = static_cast<const int32_t *>(rg.data);
    p.pos     = static_cast<const int32_t *>(pos.data);
    p.out     = static_cast<float *>(t.data);
    p.out_nb1 = int64_t(t.nb[1]);
    p.out_nb2 = int64_t(t.nb[2]);
    p.dk      = int(dk);
    p.dv      = int(dv);
    p.n_kh    = int(n_kh);
    p.n_vh    = int(n_vh);
    p.R       = int(st.ne[1]);
    p.n_slots = int(st.ne[2]);
    p.n_seqs  = int(rg.ne[1]);
    ssm::launch_gated_delta(p, ctx.stream);
}

}  // namespace spark::cuda
