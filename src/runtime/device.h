// Backend selection for a model: the CPU reference or a CUDA device.
#pragma once

#include "backends/backend.h"
#include "backends/comm.h"

#include <spark/spark.h>

#include <memory>
#include <vector>

namespace spark {

// Creates the backend the params ask for (AUTO: CUDA device 0 when usable, else the CPU) and
// reports which one in `kind`. Throws SPARK_ERR_UNSUPPORTED when CUDA was asked for but is not
// available (not compiled in, no device, compute capability below 8.0).
std::unique_ptr<Backend> make_backend(const spark_model_params & params, spark_device_kind & kind);

// The communicators of a group of GPUs of this process, one per device in rank order (NCCL).
// Throws SPARK_ERR_UNSUPPORTED where this build has no CUDA backend or no NCCL.
std::vector<std::unique_ptr<Communicator>> make_device_group(const std::vector<int> & devices);
// One rank of a group of processes (several hosts) on `device`, joined through the group's id;
// and a new id (rank 0). SPARK_ERR_UNSUPPORTED without CUDA or NCCL.
std::unique_ptr<Communicator> make_device_rank(const uint8_t id[128], int rank, int size, int device);
void                          make_device_group_id(uint8_t out[128]);

}  // namespace spark
