// CPU dequantization of canonical weights (src/quant/qweight.h) to float32: the CPU backend's
// inner loop for quantized matmuls (it dequantizes tiles of rows, then multiplies with Eigen) and
// the oracle the CUDA kernels are compared with.
//
// Results are exact: float32 arithmetic in the order the producers' reference dequantizers use,
//   NVFP4  e2m1 * (f32(block_scale) * global_scale)       (vLLM nvfp4_emulation_utils.py
//                                                         `dequantize_to_dtype`; ModelOpt
//                                                         nvfp4_tensor.py `dequantize`)
//   INT4   scale * (q - zero),  zero = stored + offset    (auto-round qlinear_torch_zp.py;
//                                                         AutoAWQ packing_utils.py)
//   FP8    f32(e4m3) * scale[n / block_n][k / block_k]    (DeepSeek-V3 inference/kernel.py
//                                                         `weight_dequant_kernel`; compressed-
//                                                         tensors lifecycle/forward.py `_dequantize`)
//
// Nothing is validated here (the loader validates shapes). Preconditions on a QWeight `w`:
//   all formats: 0 <= row0, row0 + n_rows <= w.n; `out` holds n_rows * w.k floats.
//   NVFP4: k % 16 == 0.
//   INT4:  k % 8 == 0; n % 8 == 0 when zeros != nullptr; group_size > 0 (= k for per-channel);
//          n_groups = ceil(k / group_size) (or, with g_idx, > every g_idx[k]).
//          zeros == nullptr means symmetric: the effective zero is 8 and zero_offset is not added.
//   FP8:   block_n > 0, block_k > 0.
#pragma once

#include <cstdint>

#include "quant/qweight.h"

namespace spark {

// Rows [row0, row0 + n_rows) of the logical [N][K] weight, row-major, K floats per row.
// Thread-safe; blocks of 16-64 rows are the intended granularity (INT4 reads its [K/8][N] words
// one contiguous run of n_rows per packed row).
void dequantize_rows(const QWeight & w, int64_t row0, int64_t n_rows, float * out);

// A dense vector (norm weights, biases) to float32: format is F32, F16 or BF16.
void dense_to_f32(WeightFormat format, const void * src, int64_t count, float * out);

}  // namespace spark
