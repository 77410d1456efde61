// A parallel loop for the load path's independent pieces of work (the shards' headers, a MoE
// layer's experts), with the error a serial loop would give.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <thread>
#include <vector>

namespace spark {

// The threads a load step uses: `requested` when positive, else the hardware threads, at most 16
// (the H100 machine's 16 cores stream a Qwen3-Next-80B file ~10% faster than 8 do; docs/PERF.md).
inline int load_threads(int requested) {
    if (requested > 0) return requested;
    return int(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 16));
}

// Runs fn(i) for every i in [0, n) on up to n_threads threads, the caller's among them. Indices are
// handed out in order and none after a failure, so every index below the first failing one has run:
// the exception rethrown (that of the lowest failing index) is the one a serial loop would throw.
template <typename Fn> void parallel_for(size_t n, int n_threads, Fn && fn) {
    std::vector<std::exception_ptr> errors(n);
    std::atomic<size_t>             next{0};
    std::atomic<bool>               failed{false};
    auto                            work = [&] {
        for (size_t i; !failed.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < n;) {
            try {
                fn(i);
            } catch (...) {
                errors[i] = std::current_exception();
                failed    = true;
            }
        }
    };
    std::vector<std::thread> threads;
    for (size_t t = 1; t < std::min<size_t>(n, size_t(std::max(n_threads, 1))); ++t) threads.emplace_back(work);
    work();
    for (std::thread & t : threads) t.join();
    for (const std::exception_ptr & e : errors)
        if (e) std::rethrow_exception(e);
}

}  // namespace spark
