// ROPE: NEOX ("rotate half") rotary embedding of the first n_rot dims of every head of x [hd, nh, T]
// at positions pos [T]; dims n_rot..hd are copied.
//
// Frequencies are bit-identical to the CPU backend's: the launcher evaluates the very same host
// expression inv_freq[i] = 1.0f / std::pow(theta, float(2i) / float(n_rot)) and passes the table by
// value as a kernel parameter (so a captured CUDA graph carries it). On the device the angle is
// the same single float multiply pos * inv_freq[i]; sin/cos are the precise sincosf (not the
// __sinf intrinsic), and the rotation is evaluated without FMA contraction, in the CPU's order.
//
// One block per (token, group of kHeadsPerBlock heads): the block computes the token's half cos/sin
// values once into shared memory, then rotates its heads.
#include "backends/cuda/elementwise/ew_common.cuh"

#include <cmath>

namespace spark::cuda {

namespace {

constexpr int kMaxRotHalf    = 256;  // n_rot <= 512
constexpr int kHeadsPerBlock = 4;
constexpr int kThreads       = 128;

struct RopeFreqs {
    float inv_freq[kMaxRotHalf];
};

struct RopeArgs {
    const char *    x = nullptr;
    char *          o = nullptr;
    const int32_t * pos = nullptr;
    int64_t         x_nb1 = 0, x_nb2 = 0, o_nb1 = 0, o_nb2 = 0;
    int64_t         hd = 0, nh = 0;
    int             n_rot = 0;
};

__global__ void rope_kernel(const RopeArgs args, const RopeFreqs freqs) {
    __shared__ float s_cos[kMaxRotHalf];
    __shared__ float s_sin[kMaxRotHalf];
    const int64_t tok  = blockIdx.x;
    const int     half = args.n_rot / 2;
    const float   p    = float(args.pos[tok]);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float s, c;
        sincosf(__fmul_rn(p, freqs.inv_freq[i]), &s, &c);
        s_sin[i] = s;
        s_cos[i] = c;
    }
    __syncthreads();

    const int64_t h0       = int64_t(blockIdx.y) * kHeadsPerBlock;
    const int64_t nheads   = min(int64_t(kHeadsPerBlock), args.nh - h0);
    const int64_t per_head = half + (args.hd - args.n_rot);  // rotation pairs + copied dims
    for (int64_t item = threadIdx.x; item < nheads * per_head; item += blockDim.x) {
        const int64_t h = h0 + item / per_head;
        const int64_t j = item % per_head;
        const float * x = reinterpret_cast<const float *>(args.x + h * args.x_nb1 + tok * args.x_nb2);
        float *       o = reinterpret_cast<float *>(args.o + h * args.o_nb1 + tok * args.o_nb2);
        if (j < half) {
            const float c = s_cos[j], s = s_sin[j];
            const float x0 = x[j], x1 = x[j + half];
            o[j]        = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
            o[j + half] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
        } else {
            const int64_t i = args.n_rot + (j - half);
            o[i]            = x[i];
        }
    }
}

}  // namespace

void op_rope(const Tensor & t, const OpContext & ctx) {
    const Tensor & x   = *t.src[0];
    const Tensor & pos = *t.src[1];
    ew::require_f32_rows(x, "ROPE");
    ew::require_f32_rows(t, "ROPE");
    ew::require(ew::same_shape(x, t), "ROPE", "output shape differs from the input");
    ew::require(x.ne[3] == 1, "ROPE", "input must be [head_dim, n_head, n_tokens]");
    ew::require(pos.type == DType::I32 && pos.nb[0] == sizeof(int32_t) && pos.ne[0] == x.ne[2], "ROPE",
                "positions must be contiguous I32 [n_tokens]");
    const int n_rot = t.ip[0];
    ew::require(n_rot > 0 && n_rot % 2 == 0 && n_rot <= x.ne[0], "ROPE", "n_rot must be even and within head_dim");
    ew::require(n_rot / 2 <= kMaxRotHalf, "ROPE", "n_rot above 512 is not supported");
    const int64_t n_tok = x.ne[2], nh = x.ne[1];
    if (n_tok == 0 || nh == 0) return;
    const int64_t head_groups = ceil_div(nh, kHeadsPerBlock);
    ew::require(n_tok <= 0x7fffffff && head_groups <= 65535, "ROPE", "too many tokens or heads for one launch");

    // Exactly the CPU backend's table (src/backends/cpu/ops_elementwise.cpp, op_rope).
    RopeFreqs     freqs{};
    const float   theta = t.fp[0];
    const int     half  = n_rot / 2;
    for (int i = 0; i < half; ++i) freqs.inv_freq[i] = 1.0f / std::pow(theta, float(2 * i) / float(n_rot));

    RopeArgs args;
    args.x     = static_cast<const char *>(x.data);
    args.o     = static_cast<char *>(t.data);
    args.pos   = static_cast<const int32_t *>(pos.data);
    args.x_nb1 = int64_t(x.nb[1]);
    args.x_nb2 = int64_t(x.nb[2]);
    args.o_nb1 = int64_t(t.nb[1]);
    args.o_nb2 = int64_t(t.nb[2]);
    args.hd    = x.ne[0];
    args.nh    = nh;
    args.n_rot = n_rot;
    const dim3 grid{unsigned(n_tok), unsigned(head_groups), 1u};
    rope_kernel<<<grid, kThreads, 0, ctx.stream>>>(args, freqs);
    SPARK_CUDA_CHECK_LAUNCH();
}

}  // namespace spark::cuda
