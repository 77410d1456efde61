#include "runtime/rank_group.h"

#include "common/error.h"
#include "runtime/device.h"

#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

namespace spark {

std::vector<Communicator *> RankGroup::communicators() const {
    std::vector<Communicator *> c;
    for (const auto & p : comms) c.push_back(p.get());
    return c;
}

namespace {

// The first failure of a group's ranks; a rank that fails aborts its communicator, so that no other
// rank waits for it in a collective.
class RankErrors {
public:
    explicit RankErrors(const std::vector<Communicator *> & comms) : comms_(comms) {}

    void run(int r, const std::function<void(int)> & fn) {
        try {
            fn(r);
        } catch (...) {
            std::exception_ptr e     = std::current_exception();
            bool               abort = false;
            try {
                std::rethrow_exception(e);
            } catch (const Error & err) {
                abort = err.status() == SPARK_ERR_ABORTED;
            } catch (...) {
            }
            {
                std::lock_guard<std::mutex> lock(mutex_);
                // An error of the rank's own wins over the aborts it causes in the others.
                if (!first_ || (first_is_abort_ && !abort)) first_ = e, first_is_abort_ = abort;
            }
            if (comms_[size_t(r)]) comms_[size_t(r)]->abort("another rank of the split model failed");
        }
    }
    void rethrow() {
        if (first_) std::rethrow_exception(first_);
    }

private:
    const std::vector<Communicator *> & comms_;
    std::mutex                          mutex_;
    std::exception_ptr                  first_;
    bool                                first_is_abort_ = true;
};

}  // namespace

void run_ranks(const std::vector<Communicator *> & comms, const std::function<void(int)> & fn) {
    const int                n = int(comms.size());
    RankErrors               errors(comms);
    std::vector<std::thread> threads;
    threads.reserve(size_t(n > 0 ? n - 1 : 0));
    for (int r = 1; r < n; ++r) threads.emplace_back([&errors, &fn, r] { errors.run(r, fn); });
    if (n > 0) errors.run(0, fn);
    for (std::thread & t : threads) t.join();
    errors.rethrow();
}

RankThreads::RankThreads(int n_ranks) {
    for (int r = 1; r < n_ranks; ++r) threads_.emplace_back([this, r] { loop(r); });
}

RankThreads::~RankThreads() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    start_.notify_all();
    for (std::thread & t : threads_) t.join();
}

void RankThreads::loop(int rank) {
    uint64_t seen = 0;
    for (;;) {
        std::unique_lock<std::mutex> lock(mutex_);
        start_.wait(lock, [&] { return stop_ || round_ != seen; });
        if (stop_) return;
        seen                                = round_;
        const std::function<void(int)> body = body_;
        lock.unlock();
        body(rank);
        lock.lock();
        if (--pending_ == 0) done_.notify_one();
    }
}

void RankThreads::run(const std::vector<Communicator *> & comms, const std::function<void(int)> & fn) {
    SPARK_ASSERT(comms.size() == threads_.size() + 1);
    RankErrors errors(comms);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        body_    = [&errors, &fn](int r) { errors.run(r, fn); };
        pending_ = int(threads_.size());
        ++round_;
    }
    start_.notify_all();
    errors.run(0, fn);
    {
        std::unique_lock<std::mutex> lock(mutex_);
        done_.wait(lock, [&] { return pending_ == 0; });
        body_ = nullptr;
    }
    errors.rethrow();
}

RankGroup load_rank_group(const std::string & path, const spark_model_params & params, SplitMode mode, int size, const std::vector<int> & devices) {
    if (size < 2 || size > 64) fail(SPARK_ERR_INVALID_ARGUMENT, "a split model needs 2 to 64 ranks, not %d", size);
    if (mode == SplitMode::None) fail(SPARK_ERR_INVALID_ARGUMENT, "a split model needs a split mode (tensor or expert)");
    if (!devices.empty() && int(devices.size()) != size)
        fail(SPARK_ERR_INVALID_ARGUMENT, "%d devices given for a model split over %d ranks", int(devices.size()), size);
    RankGroup g;
    if (params.device == SPARK_DEVICE_CPU) {
        g.comms = make_in_process_group(size);
    } else {
        std::vector<int> ids = devices;
        for (int r = 0; ids.size() < size_t(size); ++r) ids.push_back(params.device_index + r);
        g.comms = make_device_group(ids);
    }
    g.ranks.resize(size_t(size));
    run_ranks(g.communicators(), [&](int r) {
        spark_model_params p = params;
        if (!devices.empty()) p.device_index = devices[size_t(r)];
        else p.device_index = params.device_index + r;
        p.load_tokenizer = params.load_tokenizer && r == 0;  // the API reads rank 0's
        Shard s;
        s.rank = r, s.size = size, s.mode = mode, s.comm = g.comms[size_t(r)].get();
        g.ranks[size_t(r)] = load_model(path, p, nullptr, s);
    });
    return g;
}

namespace {

SplitMode split_mode_of(const spark_model_params & params) {
    // Read as the integer the host stored: a value outside the enum's must be refused, not loaded
    // as the enum (undefined behaviour).
    static_assert(sizeof(params.split_mode) == sizeof(int32_t));
    int32_t mode = 0;
    std::memcpy(&mode, &params.split_mode, sizeof mode);
    switch (mode) {
        case SPARK_SPLIT_TENSOR: return SplitMode::Tensor;
        case SPARK_SPLIT_EXPERT: return SplitMode::Expert;
        default: fail(SPARK_ERR_INVALID_ARGUMENT, "split_mode %d is not SPARK_SPLIT_TENSOR or SPARK_SPLIT_EXPERT", mode);
    }
}

// The whole model's shape in a split rank's info; the bytes stay one rank's (what each device
// holds and reads).
void describe_split(Model & m, const spark_model_params & params) {
    const HParams &    f = m.shard.full;
    spark_model_info & i = m.info;
    i.n_head = int32_t(f.n_head), i.n_head_kv = int32_t(f.n_head_kv), i.n_devices = m.shard.size, i.split_mode = int32_t(params.split_mode);
}

}  // namespace

std::unique_ptr<Model> load_split_model(const std::string & path, const spark_model_params & params) {
    const int n = params.n_devices;
    if (n > 8) fail(SPARK_ERR_INVALID_ARGUMENT, "n_devices %d: a model is split over at most 8 devices of a process", n);
    if (params.dist_size > 1) fail(SPARK_ERR_INVALID_ARGUMENT, "n_devices %d with dist_size %d: a process of a group of processes holds one device", n, params.dist_size);
    const SplitMode mode = split_mode_of(params);
    std::vector<int> devices;
    if (params.device != SPARK_DEVICE_CPU)
        for (int r = 0; r < n; ++r) {
            for (int q = 0; q < r; ++q)
                if (params.devices[q] == params.devices[r])
                    fail(SPARK_ERR_INVALID_ARGUMENT, "device %d is given to ranks %d and %d: a split model needs a device per rank", params.devices[r], q, r);
            devices.push_back(params.devices[r]);
        }
    RankGroup              g    = load_rank_group(path, params, mode, n, devices);
    std::unique_ptr<Model> root = std::move(g.ranks[0]);
    for (size_t r = 1; r < g.ranks.size(); ++r) root->peers.push_back(std::move(g.ranks[r]));
    g.ranks.clear();
    root->comms = std::move(g.comms);
    describe_split(*root, params);
    return root;
}

std::unique_ptr<Model> load_process_rank(const std::string & path, const spark_model_params & params) {
    const int n = params.dist_size, r = params.dist_rank;
    if (n > 64 || r < 0 || r >= n) fail(SPARK_ERR_INVALID_ARGUMENT, "dist_rank %d of dist_size %d: not a rank of a group of 2 to 64 processes", r, n);
    if (params.device != SPARK_DEVICE_CUDA) fail(SPARK_ERR_INVALID_ARGUMENT, "a model split over processes runs on CUDA devices (device = SPARK_DEVICE_CUDA)");
    Shard s;
    s.rank = r, s.size = n, s.mode = split_mode_of(params);
    std::unique_ptr<Communicator> comm = make_device_rank(params.dist_id, r, n, params.device_index);
    s.comm                             = comm.get();
    std::unique_ptr<Model> m;
    try {
        m = load_model(path, params, nullptr, s);
    } catch (...) {
        comm->abort("this rank could not load the model");  // the others' first collective ends
        throw;
    }
    m->comms.push_back(std::move(comm));
    describe_split(*m, params);
    return m;
}

}  // namespace spark
