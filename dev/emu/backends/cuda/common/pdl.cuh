// Emulator stand-in for src/backends/cuda/common/pdl.cuh (found first on the include path of every
// kernel lab in dev/kernels: -Idev/emu comes before -Isrc): one model for every kernel.
//
// The model of one launch with programmatic dependent launch (PDL), armed by the test around it:
//   arm      before the launch the test names the launch's dependent inputs (buffers an earlier
//            kernel wrote: activations, expert ids, logits, partials, the KV cache...) and,
//            optionally, its outputs. Inputs are saved and filled with a poison (0xFF bytes: NaN in
//            f32 / f16 / bf16, -1 in integers; or a byte the test picks): "the previous grid has not
//            completed yet". Outputs are snapshotted.
//   wait()   the grid's first wait() is "the previous grid completes now": the inputs get their
//            contents back. A kernel that reads an input before waiting computes from poison and the
//            test's comparison with its reference fails. At that moment every input must still hold
//            its poison and every output its snapshot, otherwise the kernel wrote global memory
//            before waiting (an earlier kernel may still be reading it): the check reports it.
//            Every thread of every block must execute wait() before it exits (counted per block and
//            thread; the check names the first thread that did not).
//   launch_dependents()  recorded per thread (before or after wait(), either is fine); the check
//            fails when no thread of the grid called it (the kernels are meant to trigger early).
//   check    after the launch: Guard::check(kernel) prints "FAIL pdl <kernel>: ..." for each
//            broken rule and counts it (failures()); the inputs are restored even if no thread
//            waited.
// Not armed (no Guard alive), wait() and launch_dependents() are no-ops.
//
// Limits: blocks run one after another and the threads of a block switch only at barriers and warp
// collectives, so only what happens before the grid's first wait() (in whichever thread and block
// the scheduler runs first) is caught: a read or write before wait() in a thread that runs after
// another thread already waited goes unnoticed by the poison (the per-thread wait count still
// requires every thread to wait). The random warp and block orders of the emulators vary which
// thread runs first from seed to seed. Writes to buffers the test does not arm, and reads of a
// poisoned input whose result does not reach the compared outputs, are not seen. The memory model
// (visibility without wait, fences), the timing of the trigger (when the next grid may start) and
// chains of more than two kernels are not modelled. One Guard covers exactly one launch.
#pragma once

#include <cuda_runtime.h>  // the emulator's: threadIdx, blockIdx, blockDim, gridDim

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

namespace spark::cuda::pdl {

namespace model {

struct Region {
    void *  p      = nullptr;
    size_t  bytes  = 0;
    bool    output = false;  // false: a dependent input (poisoned until the first wait)
    uint8_t poison = 0xFF;
};
// A dependent input (written by an earlier kernel), poisoned with `poison` bytes until the first wait.
inline Region in(const void * p, size_t bytes, uint8_t poison = 0xFF) { return Region{const_cast<void *>(p), bytes, false, poison}; }
// An output: must not change before the first wait.
inline Region out(void * p, size_t bytes) { return Region{p, bytes, true, 0}; }

struct State {
    bool                              armed = false, restored = false;
    std::vector<Region>               regions;
    std::vector<size_t>               index;  // per region: its position in the guard's list
    std::vector<std::vector<uint8_t>> saved;  // per region: contents (inputs) or snapshot (outputs)
    std::vector<uint8_t>              flags;  // per (block, thread): 1 waited, 2 triggered
    unsigned                          grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};
    bool                              dims_known = false, dims_changed = false;
    std::string                       early_writes;  // regions changed before the first wait
    int                               failures = 0, checks = 0;
};
inline State & S() {
    static State s;
    return s;
}
// Failed checks so far (each emulator adds them to its exit status).
inline int failures() { return S().failures; }
inline int checks() { return S().checks; }

inline size_t thread_slot() {
    State & s = S();
    if (!s.dims_known) {
        s.grid[0] = gridDim.x, s.grid[1] = gridDim.y, s.grid[2] = gridDim.z;
        s.block[0] = blockDim.x, s.block[1] = blockDim.y, s.block[2] = blockDim.z;
        s.dims_known = true;
        s.flags.assign(size_t(s.grid[0]) * s.grid[1] * s.grid[2] * s.block[0] * s.block[1] * s.block[2], 0);
    } else if (s.grid[0] != gridDim.x || s.grid[1] != gridDim.y || s.grid[2] != gridDim.z || s.block[0] != blockDim.x ||
               s.block[1] != blockDim.y || s.block[2] != blockDim.z) {
        s.dims_changed = true;  // a second launch under one guard
        return SIZE_MAX;
    }
    const size_t b = blockIdx.x + size_t(s.grid[0]) * (blockIdx.y + size_t(s.grid[1]) * blockIdx.z);
    const size_t t = threadIdx.x + size_t(s.block[0]) * (threadIdx.y + size_t(s.block[1]) * threadIdx.z);
    return b * (size_t(s.block[0]) * s.block[1] * s.block[2]) + t;
}

// The previous grid completes: inputs back, and nothing may have been written before.
inline void restore() {
    State & s = S();
    for (size_t i = s.regions.size(); i-- > 0;) {
        const Region & r = s.regions[i];
        auto *         p = static_cast<uint8_t *>(r.p);
        bool           same = true;
        if (r.output) same = std::memcmp(p, s.saved[i].data(), r.bytes) == 0;
        else
            for (size_t j = 0; j < r.bytes && same; ++j) same = p[j] == r.poison;
        if (!same)
            s.early_writes += (s.early_writes.empty() ? "" : ", ") + std::string(r.output ? "output" : "input") + " #" + std::to_string(s.index[i]) +
                              " of the guard's list";
        if (!r.output) std::memcpy(p, s.saved[i].data(), r.bytes);
    }
    s.restored = true;
}

// The emulator's die() (a deadlock, a bad address) during an armed launch says so.
inline void note_on_die() {
    const State & s = S();
    if (!s.armed) return;
    std::fprintf(stderr, "emu: ... during a launch armed by the PDL model (%s): a thread that read a poisoned input before "
                 "pdl::wait() may have diverged from the others\n",
                 s.restored ? "the grid's first pdl::wait() has run" : "no thread has called pdl::wait() yet");
}

inline void arm(const std::vector<Region> & regions) {
    State & s = S();
    if (s.armed) {
        std::fprintf(stderr, "pdl model: armed twice (a Guard was not checked)\n");
        std::abort();
    }
    const int failures = s.failures, checks = s.checks;
    s          = State{};
    s.failures = failures;
    s.checks   = checks;
    s.armed    = true;
    emu::die_note = &note_on_die;
    for (size_t i = 0; i < regions.size(); ++i) {
        const Region & r = regions[i];
        if (!r.p || !r.bytes) continue;  // an absent buffer
        s.regions.push_back(r);
        s.index.push_back(i);
        const auto * p = static_cast<const uint8_t *>(r.p);
        s.saved.emplace_back(p, p + r.bytes);
        if (!r.output) std::memset(r.p, r.poison, r.bytes);
    }
}

// The broken rules of the armed launch ("" when none); disarms and restores the inputs.
inline std::string finish() {
    State & s = S();
    if (!s.armed) return "not armed";
    std::string why;
    auto        add = [&](const std::string & w) { why += (why.empty() ? "" : "; ") + w; };
    if (!s.restored) {
        restore();
        s.early_writes.clear();  // no wait at all: reported below
    }
    if (s.dims_changed) add("more than one launch under one guard");
    const unsigned g[3] = {s.dims_known ? s.grid[0] : gridDim.x, s.dims_known ? s.grid[1] : gridDim.y, s.dims_known ? s.grid[2] : gridDim.z};
    const unsigned b[3] = {s.dims_known ? s.block[0] : blockDim.x, s.dims_known ? s.block[1] : blockDim.y,
                           s.dims_known ? s.block[2] : blockDim.z};
    const size_t   nt = size_t(b[0]) * b[1] * b[2], n = size_t(g[0]) * g[1] * g[2] * nt;
    s.flags.resize(n, 0);
    size_t no_wait = 0, first = 0, triggered = 0;
    for (size_t i = 0; i < n; ++i) {
        if (!(s.flags[i] & 1) && no_wait++ == 0) first = i;
        if (s.flags[i] & 2) ++triggered;
    }
    if (no_wait) {
        const size_t bl = first / nt, th = first % nt;
        char         buf[200];
        std::snprintf(buf, sizeof buf, "%zu of %zu threads exited without pdl::wait() (first: block %zu,%zu,%zu thread %zu,%zu,%zu)", no_wait, n,
                      bl % g[0], bl / g[0] % g[1], bl / g[0] / g[1], th % b[0], th / b[0] % b[1], th / b[0] / b[1]);
        add(buf);
    }
    if (!triggered) add("no thread called pdl::launch_dependents()");
    if (!s.early_writes.empty()) add("global memory written before the first pdl::wait() (" + s.early_writes + ")");
    s.armed = false;
    s.regions.clear();
    s.saved.clear();
    return why;
}

// Arms the model for the one launch that follows; check() after it.
class Guard {
public:
    Guard(std::initializer_list<Region> regions) { arm(std::vector<Region>(regions)); }
    explicit Guard(const std::vector<Region> & regions) { arm(regions); }
    Guard(const Guard &)             = delete;
    Guard & operator=(const Guard &) = delete;
    ~Guard() {
        if (!done_) {
            std::fprintf(stderr, "pdl model: Guard destroyed without check()\n");
            std::abort();
        }
    }
    // Counts and prints a failure ("FAIL pdl <kernel>: ...") when a rule was broken.
    bool check(const std::string & kernel) {
        const std::string why = problems();
        ++S().checks;
        if (why.empty()) return true;
        ++S().failures;
        std::printf("FAIL pdl %s: %s\n", kernel.c_str(), why.c_str());
        std::fflush(stdout);
        return false;
    }
    // The broken rules, not counted (for the model's self-tests).
    std::string problems() {
        if (done_) return "checked twice";
        done_ = true;
        return finish();
    }

private:
    bool done_ = false;
};

}  // namespace model

inline void wait() {
    model::State & s = model::S();
    if (!s.armed) return;
    const size_t i = model::thread_slot();
    if (i == SIZE_MAX) return;
    s.flags[i] |= 1;
    if (!s.restored) model::restore();
}

inline void launch_dependents() {
    model::State & s = model::S();
    if (!s.armed) return;
    const size_t i = model::thread_slot();
    if (i == SIZE_MAX) return;
    s.flags[i] |= 2;
}

}  // namespace spark::cuda::pdl
