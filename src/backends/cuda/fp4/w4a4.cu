// The generic part of the W4A4 NVFP4 path: the launcher of the activation quantizer
// (fp4/quantize_nvfp4_kernels.cuh, compiled for every target; on sm_120a / sm_121a it rounds with
// the hardware convert, elsewhere with the software encoder, to the same bytes) and the dispatch to
// the sm_120-family GEMM (fp4/gemm_w4a4_sm120.cu).
#include "backends/cuda/fp4/w4a4.h"

#include "backends/cuda/common/arch.h"
#include "backends/cuda/common/launch.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/fp4/quantize_nvfp4_kernels.cuh"
#include "common/error.h"

namespace spark::cuda {

namespace {

int current_cc() {
    int dev = 0, major = 0, minor = 0;
    SPARK_CUDA_CHECK(cudaGetDevice(&dev));
    SPARK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    SPARK_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major * 100 + minor * 10;
}

}  // namespace

bool w4a4_compiled() {
#if defined(SPARK_CUDA_BUILT_SM120)
    return true;
#else
    return false;
#endif
}

bool w4a4_available(int cc) { return w4a4_compiled() && cc_has_fp4_mma_sync(cc); }

bool w4a4_runs_here(int cc) {
#if defined(SPARK_CUDA_BUILT_SM120)
    return w4a4_device(cc, cc_has_fp4_mma_sync(cc) && fp4_detail::gemm_nvfp4_w4a4_sm120_runs_here());
#else
    return w4a4_device(cc, false);
#endif
}

const char * nvfp4_quantizer_path(int cc) {
    // The generic library carries sm_120a/sm_121a code exactly when the family was built.
    return w4a4_available(cc) ? "hardware cvt (cvt.rn.satfinite.e2m1x2.f32)" : "software (formats.h f32_to_e2m1)";
}

void quantize_activations_nvfp4(const float * x, int64_t rows, int64_t k, int64_t row_stride, float global_scale, uint8_t * codes,
                                uint8_t * scales, cudaStream_t stream) {
    if (rows < 0 || k < 0) fail(SPARK_ERR_INVALID_ARGUMENT, "quantize_activations_nvfp4: negative shape");
    if (k % fp4::kNvfp4Block != 0) fail(SPARK_ERR_UNSUPPORTED, "quantize_activations_nvfp4: k = %lld is not a multiple of 16", (long long) k);
    if (rows == 0 || k == 0) return;
    if (row_stride < k) fail(SPARK_ERR_INVALID_ARGUMENT, "quantize_activations_nvfp4: row stride %lld < k %lld", (long long) row_stride, (long long) k);
    if (!x || !codes || !scales) fail(SPARK_ERR_INVALID_ARGUMENT, "quantize_activations_nvfp4: null buffer");
    if (reinterpret_cast<uintptr_t>(codes) % 8 != 0) fail(SPARK_ERR_UNSUPPORTED, "quantize_activations_nvfp4: codes must be 8-byte aligned");
    if (reinterpret_cast<uintptr_t>(x) % 4 != 0) fail(SPARK_ERR_UNSUPPORTED, "quantize_activations_nvfp4: x must be 4-byte aligned");
    const bool    vec    = fp4::quantize_nvfp4_vec(x, row_stride);
    const int64_t total  = rows * (k / fp4::kNvfp4Block);
    const int64_t blocks = fp4::quantize_nvfp4_blocks(total);
    if (vec) launch(fp4::quantize_nvfp4_kernel<true>, unsigned(blocks), fp4::kQuantThreads, 0, stream, x, rows, k, row_stride, global_scale, codes, scales);
    else launch(fp4::quantize_nvfp4_kernel<false>, unsigned(blocks), fp4::kQuantThreads, 0, stream, x, rows, k, row_stride, global_scale, codes, scales);
    SPARK_CUDA_CHECK_LAUNCH();
}

void gemm_nvfp4_w4a4(const DeviceWeight & w, const uint8_t * a_codes, const uint8_t * a_scales, float a_global, int64_t rows, float * y,
                     int64_t y_stride, cudaStream_t stream) {
    if (w.format != WeightFormat::NVFP4) fail(SPARK_ERR_UNSUPPORTED, "gemm_nvfp4_w4a4: the weight is not NVFP4");
    if (rows < 0) fail(SPARK_ERR_INVALID_ARGUMENT, "gemm_nvfp4_w4a4: negative row count");
    if (w.k % 64 != 0) fail(SPARK_ERR_UNSUPPORTED, "gemm_nvfp4_w4a4: K = %lld is not a multiple of 64 (one FP4 MMA step)", (long long) w.k);
    if (rows == 0 || w.n == 0) return;
    if (y_stride < w.n) fail(SPARK_ERR_INVALID_ARGUMENT, "gemm_nvfp4_w4a4: y stride %lld < N %lld", (long long) y_stride, (long long) w.n);
    if (!a_codes || !a_scales || !y || !w.data || !w.scales) fail(SPARK_ERR_INVALID_ARGUMENT, "gemm_nvfp4_w4a4: null buffer");
    for (const void * p : {static_cast<const void *>(a_codes), static_cast<const void *>(a_scales), w.data, w.scales})
        if (reinterpret_cast<uintptr_t>(p) % 4 != 0) fail(SPARK_ERR_UNSUPPORTED, "gemm_nvfp4_w4a4: code and scale buffers must be 4-byte aligned");
    const int cc = current_cc();
    if (!w4a4_available(cc))
        fail(SPARK_ERR_UNSUPPORTED, "gemm_nvfp4_w4a4: needs a compute capability 12.x GPU and a build with sm_120a/sm_121a (device %d.%d, %s)",
             cc / 100, cc % 100 / 10, w4a4_compiled() ? "family compiled" : "family not compiled");
#if defined(SPARK_CUDA_BUILT_SM120)
    if (!fp4_detail::gemm_nvfp4_w4a4_sm120_runs_here())
        fail(SPARK_ERR_UNSUPPORTED, "gemm_nvfp4_w4a4: this build has no cubin for sm_%d%da (SPARK_CUDA_ARCHS)", cc / 100, cc % 100 / 10);
    fp4_detail::gemm_nvfp4_w4a4_sm120(w, a_codes, a_scales, a_global, rows, y, y_stride, stream);
#else
    (void) a_global;
    (void) y_stride;
    (void) stream;
#endif
}

}  // namespace spark::cuda
