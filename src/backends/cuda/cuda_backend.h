// The CUDA backend's entry points for the runtime (host code; no CUDA headers needed to include it).
#pragma once

#include "backends/backend.h"

#include <spark/spark.h>

#include <memory>

namespace spark {

// Throws SPARK_ERR_UNSUPPORTED for no device / a bad index / compute capability below 8.0.
std::unique_ptr<Backend> make_cuda_backend(int device_index);
bool                     cuda_device_usable(int device_index);
int                      cuda_device_count();
// Fills `out`; throws like make_cuda_backend.
void                     cuda_device_describe(int device_index, spark_device_info & out);

}  // namespace spark
