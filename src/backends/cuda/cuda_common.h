// Error checking of the CUDA backend (host side; includes no kernels). The launch helpers are in
// common/launch.h.
#pragma once

#include "common/error.h"

#include <cuda_runtime.h>

#include <cstdint>

// Any CUDA error becomes spark::Error(SPARK_ERR_DEVICE) (or SPARK_ERR_OUT_OF_MEMORY), with the call
// and location in the message; never an abort.
#define SPARK_CUDA_CHECK(call)                                                                               \
    do {                                                                                                     \
        cudaError_t err_ = (call);                                                                           \
        if (err_ != cudaSuccess) ::spark::cuda::throw_cuda_error(err_, #call, __FILE__, __LINE__);           \
    } while (0)

// After a kernel launch: reports launch-configuration errors.
#define SPARK_CUDA_CHECK_LAUNCH() SPARK_CUDA_CHECK(cudaGetLastError())

namespace spark::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char * call, const char * file, int line);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace spark::cuda
