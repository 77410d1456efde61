// The RoPE frequency table the rope kernels take as a kernel parameter (host and device; so a
// captured CUDA graph carries it): inv_freq[i] = 1 / theta^(2i / n_rot), evaluated by the very host
// expression of the CPU backend (src/backends/cpu/ops_elementwise.cpp, op_rope), so the angles are
// bit-identical to the CPU's. Used by the ROPE kernels (elementwise/rope.cu) and by the attention
// decode kernel's fused q/k norm + RoPE (attention/attention_op.cpp).
#pragma once

#include <cmath>

namespace spark::cuda {

constexpr int kMaxRotHalf = 256;  // n_rot <= 512

struct RopeFreqs {
    float inv_freq[kMaxRotHalf];
};

// n_rot even, 2 <= n_rot <= 2 * kMaxRotHalf (the callers check).
inline RopeFreqs rope_freqs(float theta, int n_rot) {
    RopeFreqs f{};
    for (int i = 0; i < n_rot / 2; ++i) f.inv_freq[i] = 1.0f / std::pow(theta, float(2 * i) / float(n_rot));
    return f;
}

}  // namespace spark::cuda
