// One rank's view of a group of ranks that split a model (docs/DISTRIBUTED.md): the collectives a
// tensor- or expert-parallel step needs. A backend's implementation orders each call on its own
// stream (NCCL) or runs it in the calling thread (the in-process group, for the CPU backend).
//
// Every rank of a group must make the same calls with the same sizes in the same order. A call
// that cannot complete (a peer aborted, or the sizes disagree) throws a spark error on every rank
// of the group, and every later call does too: a group never waits for a rank that has gone.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace spark {

class Communicator {
public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    // A backend whose calls run on a stream (NCCL: a cudaStream_t) is given it once, before the
    // first call; every call is then enqueued on it and returns without waiting, and its buffers are
    // device memory of this rank's GPU. The calls run in the calling thread otherwise, on host memory.
    virtual void set_stream(void * stream) { (void)stream; }

    // data[i] = the sum of every rank's data[i], so that every rank holds the same bits: added in
    // rank order (the in-process group) or in NCCL's order. In place.
    virtual void all_reduce_sum(float * data, size_t n) = 0;
    // out[r * n + i] = rank r's in[i]. `in` may lie inside `out`.
    virtual void all_gather(const float * in, float * out, size_t n) = 0;
    // out[p * n + i] = rank p's in[rank() * n + i]: block p of every rank's `in` goes to rank p
    // (experts' dispatch and combine). `in` and `out` hold size() * n floats and may be the same.
    virtual void all_to_all(const float * in, float * out, size_t n) = 0;

    // Ends the group: every rank's waiting and later calls throw SPARK_ERR_ABORTED with `why`. A
    // rank that fails between collectives calls it, so that its peers do not wait for it.
    virtual void abort(const char * why) = 0;
};

// `size` ranks of one process (threads), one communicator each, in rank order (1 <= size <= 64).
std::vector<std::unique_ptr<Communicator>> make_in_process_group(int size);

}  // namespace spark
