#include "backends/cpu/thread_pool.h"

#include <algorithm>
#include <exception>

namespace spark::cpu {

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    for (auto & t : workers_) t.join();
}

void ThreadPool::worker(int index) {
    uint64_t seen = 0;
    for (;;) {
        const std::function<void(int64_t, int64_t, int)> * job;
        int64_t begin, end;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen  = generation_;
            job   = job_;
            begin = std::min(n_, int64_t(index) * chunk_);
            end   = std::min(n_, begin + chunk_);
            if (index >= n_chunks_) begin = end;
        }
        if (begin < end) {
            try {
                (*job)(begin, end, index);
            } catch (...) {
                std::lock_guard<std::mutex> lock(mutex_);
                if (!error_) error_ = std::current_exception();
            }
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (--pending_ == 0) done_.notify_one();
        }
    }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int)> & fn) {
    if (n <= 0) return;
    grain          = std::max<int64_t>(grain, 1);
    int64_t chunks = std::min<int64_t>(n_threads_, (n + grain - 1) / grain);
    if (chunks <= 1) {
        fn(0, n, 0);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        job_      = &fn;
        n_        = n;
        chunk_    = (n + chunks - 1) / chunks;
        n_chunks_ = int(chunks);
        pending_  = n_threads_ - 1;
        error_    = nullptr;
        ++generation_;
    }
    wake_.notify_all();
    std::exception_ptr local;
    try {
        fn(0, std::min(n, chunk_), 0);
    } catch (...) {
        local = std::current_exception();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    if (local) std::rethrow_exception(local);
    if (error_) std::rethrow_exception(error_);
}

}  // namespace spark::cpu
