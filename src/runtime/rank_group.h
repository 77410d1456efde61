// A model split over the ranks of one process (docs/DISTRIBUTED.md): one Model per rank, each on
// its own backend (a GPU each, or the CPU), joined by a communicator per rank. Rank 0's model is
// the one the API hands out; the others follow every step it runs (Context).
#pragma once

#include "backends/comm.h"
#include "runtime/model.h"

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <memory>
#include <string>
#include <vector>

namespace spark {

struct RankGroup {
    std::vector<std::unique_ptr<Communicator>> comms;  // outlive the models that hold them
    std::vector<std::unique_ptr<Model>>        ranks;

    RankGroup() = default;
    RankGroup(RankGroup &&) = default;
    ~RankGroup() { ranks.clear(); }
    std::vector<Communicator *> communicators() const;
};

// Runs fn(rank) for the ranks of a group at once: rank 0 on the calling thread, the others on
// threads of their own. A rank that throws aborts its communicator, so that the others' collectives
// end instead of waiting for it; the first error is rethrown (not the aborts it caused).
void run_ranks(const std::vector<Communicator *> & comms, const std::function<void(int rank)> & fn);

// The threads of ranks 1.. kept for the life of a split model's context: each step hands them their
// rank's work (as run_ranks, the same errors) instead of starting threads, tens of microseconds a
// step on the critical path of a batch-1 decode.
class RankThreads {
public:
    explicit RankThreads(int n_ranks);
    ~RankThreads();
    RankThreads(const RankThreads &)             = delete;
    RankThreads & operator=(const RankThreads &) = delete;

    void run(const std::vector<Communicator *> & comms, const std::function<void(int rank)> & fn);

private:
    void loop(int rank);

    std::mutex                      mutex_;
    std::condition_variable         start_, done_;
    std::function<void(int)>        body_;  // this round's work, with the group's error handling
    uint64_t                        round_   = 0;
    int                             pending_ = 0;
    bool                            stop_    = false;
    std::vector<std::thread>        threads_;
};

// Loads `path` split `mode` over `size` ranks of this process, the ranks' parts loading at once.
// CPU: the in-process group; CUDA: a GPU per rank (params.device_index + rank, or `devices`), NCCL.
RankGroup load_rank_group(const std::string & path, const spark_model_params & params, SplitMode mode, int size,
                          const std::vector<int> & devices = {});

// spark_model_load with params.n_devices > 1: the rank group as one Model, rank 0's, which owns
// the communicators and the other ranks (Model::peers); its info describes the whole model (head
// counts) and one rank's bytes.
std::unique_ptr<Model> load_split_model(const std::string & path, const spark_model_params & params);

// spark_model_load with params.dist_size > 1: this process's rank of a model split over several
// processes (one GPU each), joined through params.dist_id.
std::unique_ptr<Model> load_process_rank(const std::string & path, const spark_model_params & params);

}  // namespace spark
