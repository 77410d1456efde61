// A small persistent thread pool for the CPU backend: parallel_for splits [0, n) into contiguous
// chunks, one per worker, and blocks until all are done. The calling thread works too.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace spark::cpu {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool &) = delete;
    ThreadPool & operator=(const ThreadPool &) = delete;

    int size() const { return n_threads_; }

    // fn(begin, end, thread_index) over a partition of [0, n) into at most size() chunks of at least
    // `grain` items. Exceptions thrown by fn are rethrown on the calling thread.
    void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int)> & fn);

private:
    void worker(int index);

    int                      n_threads_;
    std::vector<std::thread> workers_;
    std::mutex               mutex_;
    std::condition_variable  wake_, done_;
    const std::function<void(int64_t, int64_t, int)> * job_ = nullptr;
    int64_t                  n_ = 0, chunk_ = 0;
    int                      n_chunks_ = 0;
    uint64_t                 generation_ = 0;
    int                      pending_ = 0;
    bool                     stop_ = false;
    std::exception_ptr       error_;
};

}  // namespace spark::cpu
