#include "runtime/device.h"

#include "common/error.h"

#include <cstring>

#if SPARK_HAS_CUDA
#include "backends/cuda/comm_nccl.h"
#include "backends/cuda/cuda_backend.h"
#endif

namespace spark {

std::unique_ptr<Backend> make_backend(const spark_model_params & params, spark_device_kind & kind) {
    switch (params.device) {
        case SPARK_DEVICE_CPU:
            kind = SPARK_DEVICE_CPU;
            return make_cpu_backend(params.n_threads);
        case SPARK_DEVICE_CUDA:
#if SPARK_HAS_CUDA
            kind = SPARK_DEVICE_CUDA;
            return make_cuda_backend(params.device_index);
#else
            fail(SPARK_ERR_UNSUPPORTED, "this build of spark has no CUDA backend (configure with nvcc available)");
#endif
        case SPARK_DEVICE_AUTO:
#if SPARK_HAS_CUDA
            if (cuda_device_usable(params.device_index)) {
                kind = SPARK_DEVICE_CUDA;
                return make_cuda_backend(params.device_index);
            }
#endif
            kind = SPARK_DEVICE_CPU;
            return make_cpu_backend(params.n_threads);
    }
    fail(SPARK_ERR_INVALID_ARGUMENT, "unknown device kind %d", int(params.device));
}

std::vector<std::unique_ptr<Communicator>> make_device_group(const std::vector<int> & devices) {
#if SPARK_HAS_CUDA
    return cuda::make_nccl_group(devices);  // SPARK_ERR_UNSUPPORTED without NCCL
#else
    (void) devices;
    fail(SPARK_ERR_UNSUPPORTED, "this build of spark has no CUDA backend: a model cannot be split over GPUs");
#endif
}

std::unique_ptr<Communicator> make_device_rank(const uint8_t id[128], int rank, int size, int device) {
#if SPARK_HAS_CUDA
    return cuda::make_nccl_rank(id, rank, size, device);
#else
    (void) id, (void) rank, (void) size, (void) device;
    fail(SPARK_ERR_UNSUPPORTED, "this build of spark has no CUDA backend: a model cannot be split over processes");
#endif
}

void make_device_group_id(uint8_t out[128]) {
#if SPARK_HAS_CUDA
    const cuda::NcclUniqueId id = cuda::nccl_unique_id();
    std::memcpy(out, id.data(), id.size());
#else
    (void) out;
    fail(SPARK_ERR_UNSUPPORTED, "this build of spark has no CUDA backend: a model cannot be split over processes");
#endif
}

}  // namespace spark

extern "C" {

SPARK_API int32_t spark_cuda_device_count(void) {
#if SPARK_HAS_CUDA
    return spark::cuda_device_count();
#else
    return 0;
#endif
}

SPARK_API spark_status spark_cuda_device_info(int32_t index, spark_device_info * out) {
    return spark::api_guard([&] {
        if (!out) spark::fail(SPARK_ERR_INVALID_ARGUMENT, "spark_cuda_device_info: out is NULL");
#if SPARK_HAS_CUDA
        spark::cuda_device_describe(index, *out);
#else
        (void) index;
        spark::fail(SPARK_ERR_UNSUPPORTED, "this build of spark has no CUDA backend");
#endif
    });
}

}  // extern "C"
