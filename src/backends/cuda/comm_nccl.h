// The NCCL communicator (backends/comm.h, docs/DISTRIBUTED.md): one rank per GPU, every call
// enqueued on the stream given by set_stream (a cudaStream_t of the rank's GPU; buffers are device
// memory of that GPU) and returning without waiting, so that a step's collectives are captured in its
// CUDA graph with the kernels around them. The calls neither synchronise nor allocate device memory,
// except all_to_all in place and all_gather with `in` inside `out` away from out + rank * n, which
// take a stream-ordered temporary (cudaMallocAsync, capturable too). Make one call of each kind
// outside a capture first: NCCL connects the ranks' peers at their first use.
//
// libnccl.so.2 is opened at the first factory call (dlopen), from $SPARK_NCCL_LIBRARY (the library
// or its directory), else the copy already loaded in the process, else the directory found when
// spark was configured, else the loader's search path; without it a factory throws
// SPARK_ERR_UNSUPPORTED ("NCCL (libnccl.so.2) not found: ..."). A build without NCCL (SPARK_NCCL=OFF
// or no nccl.h) has the same factories, which throw SPARK_ERR_UNSUPPORTED, so callers need no #ifdef.
//
// A failing NCCL call throws SPARK_ERR_DEVICE naming the call and NCCL's reason, and ends the rank
// like abort(). abort() ends this rank's communicator (ncclCommAbort) and, in a group of one
// process, marks the group so that the other ranks' next calls end theirs and throw too. NCCL cannot
// cancel work already enqueued on a peer's stream that waits for a rank that has gone, nor tell
// ranks of other processes: their host application must (docs/DISTRIBUTED.md).
#pragma once

#include "backends/comm.h"

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

namespace spark::cuda {

// The 128 bytes of an ncclUniqueId, which rank 0 makes and every rank of a group of several
// processes passes to make_nccl_rank (tools/common/rendezvous.h carries it over TCP).
using NcclUniqueId = std::array<uint8_t, 128>;

// One process, several GPUs (ncclCommInitAll): one communicator per device, rank r on devices[r].
// The devices are distinct CUDA device indices. Each rank's calls come from its own thread, as NCCL
// requires of ranks that are not grouped (their first calls wait for their peers).
std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<int> & devices);

// A new unique id for a group of several processes (ncclGetUniqueId), made by rank 0 only.
NcclUniqueId nccl_unique_id();

// This process's rank of a group of `size` processes (ncclCommInitRank, with `device` current
// meanwhile): returns once every rank has joined.
std::unique_ptr<Communicator> make_nccl_rank(const uint8_t id[128], int rank, int size, int device);

}  // namespace spark::cuda
