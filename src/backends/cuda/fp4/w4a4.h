// W4A4 NVFP4 on Blackwell GeForce / DGX Spark (sm_120a, sm_121a): activations are quantized on the
// fly to NVFP4 and multiplied with NVFP4 weights by the block-scaled FP4 tensor-core MMA. Host
// interface (plain C++; no kernels in this header). docs/SM120.md says what was run and what was
// only compiled.
//
// Like the op launchers, every function here only enqueues work on `stream`: it never
// synchronises, never allocates and never reads device memory on the host, so it can be captured
// into a CUDA graph. Errors (unsupported shapes, misaligned buffers, no sm_12x code in this build or
// for this device) are thrown as spark::Error.
#pragma once

#include "backends/cuda/common/arch.h"
#include "backends/cuda/device_weight.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace spark::cuda {

// The W4A4 dispatch's device half, as data (DeviceProps::w4a4; the dispatch tests inject both): a
// 12.x device and a cubin of this build for its exact arch-specific target (an sm_120a cubin runs
// only on 12.0, an sm_121a one only on 12.1).
constexpr bool w4a4_device(int cc, bool cubin_for_device) { return cc_has_fp4_mma_sync(cc) && cubin_for_device; }
// w4a4_device for the current device (capability cc) with this build.
bool w4a4_runs_here(int cc);

// True when this build contains sm_120a / sm_121a code (CMake builds the *_sm120.cu family and
// defines SPARK_CUDA_BUILT_SM120 for the generic library).
bool w4a4_compiled();
// Compiled, and `cc` (major * 100 + minor * 10) is in the 12.x family.
bool w4a4_available(int cc);
// Which encoder quantize_activations_nvfp4 uses on a device of capability `cc`: "hardware cvt
// (cvt.rn.satfinite.e2m1x2.f32)" or "software (formats.h f32_to_e2m1)". Both produce the same bytes.
const char * nvfp4_quantizer_path(int cc);

// x: [rows][k] float32 (device), rows `row_stride` floats apart (row_stride >= k, 16-byte aligned
// rows take vector loads); k % 16 == 0. Writes codes [rows][k/2] (element 2i in the low nibble of
// byte i; `codes` 8-byte aligned) and E4M3 scales [rows][k/16], as defined bit for bit by
// fp4/nvfp4_act_ref.h (global_scale is a multiplier: x ~ e2m1 * e4m3(scale) * global_scale).
void quantize_activations_nvfp4(const float * x, int64_t rows, int64_t k, int64_t row_stride, float global_scale, uint8_t * codes,
                                uint8_t * scales, cudaStream_t stream);

// y[r][n] = sum_k A[r][k] * W[n][k] for r < rows, n < w.n, with
//   A[r][k] = e2m1(a_codes) * e4m3(a_scales) * a_global     (the layout quantize_activations_nvfp4 writes)
//   W[n][k] = e2m1(w.data)  * e4m3(w.scales) * w.global_scale
// float32 accumulation; y rows are `y_stride` floats apart. Needs w.format == NVFP4, K % 64 == 0,
// 4-byte aligned code and scale buffers, and a 12.x device with this build's sm_120a/sm_121a code;
// otherwise throws SPARK_ERR_UNSUPPORTED.
void gemm_nvfp4_w4a4(const DeviceWeight & w, const uint8_t * a_codes, const uint8_t * a_scales, float a_global, int64_t rows, float * y,
                     int64_t y_stride, cudaStream_t stream);

namespace fp4_detail {
// Defined in fp4/gemm_w4a4_sm120.cu (compiled only for sm_120a / sm_121a); arguments already checked.
void gemm_nvfp4_w4a4_sm120(const DeviceWeight & w, const uint8_t * a_codes, const uint8_t * a_scales, float a_global, int64_t rows,
                           float * y, int64_t y_stride, cudaStream_t stream);
// Whether the current device can run the kernel (this build has a cubin for its exact 12.x target).
bool gemm_nvfp4_w4a4_sm120_runs_here();
}  // namespace fp4_detail

}  // namespace spark::cuda
