// ATTENTION on CUDA: validates the node (graph.h, Graph::attention), fills AttnParams, takes the
// decode workspace and enqueues the kernels (attention.h); with a layer's q / k norm + RoPE folded
// into the decode kernel where it applies (op_attention_norm_rope). Host code only; never
// synchronises.
#include "backends/cuda/attention/attention.h"
#include "backends/cuda/common/kernel_args.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/ops.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace spark::cuda {

namespace {

bool aligned16(const void * p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Validates the ATTENTION node t, with q and k its sources or (a fused norm + RoPE) the inputs of
// their norms, and fills the kernels' parameters; n_tok = 0: nothing to do.
attn::AttnParams attention_params(const Tensor & t, const Tensor & q, const Tensor & k, const OpContext & ctx) {
    const Tensor & v  = *t.src[2];
    const Tensor & kc = *t.src[3];
    const Tensor & vc = *t.src[4];
    const Tensor & ps = *t.src[5];
    const Tensor & sq = *t.src[6];
    const Tensor & bt = *t.src[7];

    const int64_t hd = q.ne[0], n_head = q.ne[1], n_tok = q.ne[2], n_kv = k.ne[1];
    // The kernels read and write f16 bits (attention.h); the backend allocates F16 caches (caps()).
    if (kc.type != DType::F16 || vc.type != DType::F16)
        fail(SPARK_ERR_UNSUPPORTED, "attention (CUDA): the KV cache must be F16 (got %s / %s)", dtype_name(kc.type), dtype_name(vc.type));
    if (!attn::head_dim_supported(int(hd)))
        fail(SPARK_ERR_UNSUPPORTED, "attention (CUDA): head_dim %lld is not supported (64, 128 or 256)", (long long)hd);
    if (!f32_rows(q) || !f32_rows(k) || !f32_rows(v) || q.ne[3] != 1 || k.ne[3] != 1 || v.ne[3] != 1)
        fail(SPARK_ERR_UNSUPPORTED, "attention (CUDA): q, k, v must be F32 with contiguous rows");
    SPARK_ASSERT(n_kv > 0 && n_head % n_kv == 0 && k.ne[0] == hd && v.ne[0] == hd && v.ne[1] == n_kv);
    SPARK_ASSERT(k.ne[2] == n_tok && v.ne[2] == n_tok);
    attn::AttnParams p;
    if (n_tok == 0) return p;

    const int64_t page_size = kc.ne[1], n_pages = kc.ne[2];
    SPARK_ASSERT(kc.ne[0] == hd * n_kv && vc.ne[0] == kc.ne[0] && vc.ne[1] == page_size && vc.ne[2] == n_pages);
    if (!kc.is_contiguous() || !vc.is_contiguous() || !aligned16(kc.data) || !aligned16(vc.data))
        fail(SPARK_ERR_UNSUPPORTED, "attention (CUDA): the KV cache must be contiguous and 16-byte aligned");
    const int tile = std::max(attn::decode_tile(int(hd)), attn::prefill_tile(int(hd)));
    if (page_size % tile != 0)
        fail(SPARK_ERR_UNSUPPORTED, "attention (CUDA): KV page size %lld is not a multiple of %d", (long long)page_size, tile);
    SPARK_ASSERT(ps.type == DType::I32 && sq.type == DType::I32 && bt.type == DType::I32);
    SPARK_ASSERT(ps.ne[0] == n_tok && sq.ne[0] == n_tok && ps.is_contiguous() && sq.is_contiguous() && bt.is_contiguous());
    SPARK_ASSERT(t.type == DType::F32 && t.nb[0] == 4 && t.ne[0] == hd * n_head && t.ne[1] == n_tok);
    // Index arithmetic inside the kernels uses 32-bit ints for positions, rows and pages.
    if (bt.ne[0] * page_size > INT32_MAX || n_tok * n_head > INT32_MAX || n_pages > INT32_MAX)
        fail(SPARK_ERR_UNSUPPORTED, "attention (CUDA): cache or batch too large");

    std::tie(p.q, p.q_nb1, p.q_nb2) = head_rows(q);
    std::tie(p.k, p.k_nb1, p.k_nb2) = head_rows(k);
    std::tie(p.v, p.v_nb1, p.v_nb2) = head_rows(v);
    p.k_cache     = static_cast<uint16_t *>(kc.data);
    p.v_cache     = static_cast<uint16_t *>(vc.data);
    p.pos         = static_cast<const int32_t *>(ps.data);
    p.seq         = static_cast<const int32_t *>(sq.data);
    p.block_table = static_cast<const int32_t *>(bt.data);
    p.out         = static_cast<float *>(t.data);
    p.out_nb1     = int64_t(t.nb[1]);
    p.n_tok       = int(n_tok);
    p.n_head      = int(n_head);
    p.n_kv        = int(n_kv);
    p.group       = int(n_head / n_kv);
    p.head_dim    = int(hd);
    p.page_size   = int(page_size);
    p.n_pages     = int(n_pages);
    p.max_pages   = int(bt.ne[0]);
    p.n_slots     = int(bt.ne[1]);
    p.scale_log2  = t.fp[0] * 1.4426950408889634f;
    return p;
}

// Plans the step (decode or prefill), takes the decode workspace and enqueues the kernels.
void enqueue(attn::AttnParams p, const OpContext & ctx, const RopeFreqs * freqs) {
    const int smem_need = p.n_tok <= attn::kDecodeMaxTokens ? attn::decode_smem(p.head_dim) : attn::prefill_smem(p.head_dim);
    if (smem_need > ctx.props->max_smem_per_block)
        fail(SPARK_ERR_UNSUPPORTED, "attention (CUDA): head_dim %d needs %d bytes of shared memory per block, the device has %d",
             p.head_dim, smem_need, ctx.props->max_smem_per_block);
    const int            per_sm = p.n_tok <= attn::kDecodeMaxTokens ? attn::decode_blocks_per_sm(p.head_dim) : 1;
    const attn::AttnPlan plan   = attn::plan_attention(p.head_dim, p.n_tok, p.n_head, p.n_kv, p.max_pages, p.page_size,
                                                       ctx.props->sm_count, per_sm);
    p.n_splits = plan.n_splits;
    if (plan.workspace_bytes) {
        float * ws = static_cast<float *>(ctx.workspace->get(plan.workspace_bytes));
        p.part_o   = ws;
        p.part_ml  = ws + int64_t(plan.n_splits) * p.n_tok * p.n_head * p.head_dim;
    }
    attn::launch_attention(p, plan, ctx.stream, freqs);
}

// The weight of a q / k RMS_NORM as the fused kernel reads it ([head_dim] F32, contiguous), or
// false when it has another form.
bool norm_weight_of(const Tensor & norm, int64_t hd, const float *& w) {
    w               = nullptr;
    const Tensor * t = norm.src[1];
    if (!t) return true;
    if (t->type != DType::F32 || t->ne[0] != hd || t->nrows() != 1 || t->nb[0] != sizeof(float)) return false;
    w = static_cast<const float *>(t->data);
    return true;
}

// SPARK_ATTN_NORM_ROPE=0: the q / k norm + RoPE pair runs as its own launch (A/B timing).
bool norm_rope_fusion_enabled() {
    static const bool on = [] {
        const char * e = std::getenv("SPARK_ATTN_NORM_ROPE");
        return !(e && std::string(e) == "0");
    }();
    return on;
}

}  // namespace

void op_attention(const Tensor & t, const OpContext & ctx) {
    const attn::AttnParams p = attention_params(t, *t.src[0], *t.src[1], ctx);
    if (p.n_tok > 0) enqueue(p, ctx, nullptr);
}

void op_attention_norm_rope(const Tensor & norm_q, const Tensor & rope_q, const Tensor & norm_k, const Tensor & rope_k,
                            const Tensor & attn, const OpContext & ctx) {
    SPARK_ASSERT(attn.op == Op::ATTENTION && attn.src[0] == &rope_q && attn.src[1] == &rope_k);
    SPARK_ASSERT(rope_q.op == Op::ROPE && rope_k.op == Op::ROPE && rope_q.src[0] == &norm_q && rope_k.src[0] == &norm_k);
    SPARK_ASSERT(norm_q.op == Op::RMS_NORM && norm_k.op == Op::RMS_NORM);
    const Tensor & xq = *norm_q.src[0];
    const Tensor & xk = *norm_k.src[0];
    const int64_t  hd = rope_q.ne[0];
    attn::NormRope nr;
    nr.on  = true;
    nr.eps = norm_q.fp[0];
    nr.zc  = norm_q.ip[0] != 0;
    // One decode launch: every dim rotates, q and k normalise and rotate alike at the attention's
    // positions, plain norms (neither gated nor split over ranks) over F32 rows shaped as their outputs.
    const bool fusable = norm_rope_fusion_enabled() && rope_q.ne[2] <= attn::kDecodeMaxTokens && rope_q.ip[0] == hd &&
                         rope_k.ip[0] == hd && rope_k.ne[0] == hd && rope_q.fp[0] == rope_k.fp[0] && rope_q.src[1] == attn.src[5] &&
                         rope_k.src[1] == attn.src[5] && norm_k.fp[0] == nr.eps && (norm_k.ip[0] != 0) == nr.zc && !norm_q.src[2] &&
                         !norm_k.src[2] && !norm_q.src[3] && !norm_k.src[3] && hd / 2 <= kMaxRotHalf && f32_rows(xq) && f32_rows(xk) &&
                         f32_rows(norm_q) && f32_rows(norm_k) &&
                         xq.ne[0] == hd && xk.ne[0] == hd && xq.ne[1] == rope_q.ne[1] && xk.ne[1] == rope_k.ne[1] &&
                         xq.ne[2] == rope_q.ne[2] && xk.ne[2] == rope_k.ne[2] && norm_weight_of(norm_q, hd, nr.q_w) &&
                         norm_weight_of(norm_k, hd, nr.k_w) &&
                         // every block reads all of this step's k rows of its KV head: no output may lie on them
                         !overlaps(attn, xq) && !overlaps(attn, xk);
    if (!fusable) {
        op_rms_norm_rope_pair(norm_q, rope_q, norm_k, rope_k, ctx);
        op_attention(attn, ctx);
        return;
    }
    attn::AttnParams p = attention_params(attn, xq, xk, ctx);
    if (p.n_tok == 0) return;
    p.norm_rope             = nr;
    const RopeFreqs freqs = rope_freqs(rope_q.fp[0], int(hd));
    enqueue(p, ctx, &freqs);
}

}  // namespace spark::cuda
