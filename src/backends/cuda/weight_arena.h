// Device memory for the weights of one load, in one contiguous range instead of a cudaMalloc per
// weight and scale (~37K of them for a 30B-A3B MoE: seconds of allocation at load, and memory
// scattered over the whole device).
//
// With the driver's virtual memory management (every Linux GPU spark supports), the arena reserves
// an address range first, hands out final addresses while the loader sizes the weights, and backs
// exactly the bytes handed out with physical memory at commit(): one allocation, no slack, and an
// out-of-memory error before any byte is read from disk. Without it (SPARK_CUDA_VMM=0, or a driver
// that lacks it) the arena falls back to chunks of cudaMalloc taken as it goes.
#pragma once

#include "backends/backend.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace spark::cuda {

class WeightArena final : public Buffer {
public:
    // `reserve`: the most bytes the arena may hand out (the device's memory is the natural bound).
    WeightArena(int device, size_t reserve);
    ~WeightArena() override;
    WeightArena(const WeightArena &)             = delete;
    WeightArena & operator=(const WeightArena &) = delete;

    // Final address of `bytes` (256-byte aligned). Memory is usable only after commit() (VMM) — the
    // fallback allocates at once. Throws SPARK_ERR_OUT_OF_MEMORY.
    void * take(size_t bytes);
    // Backs every byte handed out so far with device memory. Throws SPARK_ERR_OUT_OF_MEMORY.
    void   commit();
    // take() whose memory is usable at once, for weights a kernel writes as they are made (synthetic
    // models): VMM backs the range ahead in doubling steps of up to 1 GiB, so that 100K weights map
    // a few hundred regions rather than one each; the last step shrinks to what fits.
    void * take_usable(size_t bytes);
    size_t used() const { return used_; }
    bool   virtual_memory() const { return vmm_; }

private:
    struct Chunk {
        void * base = nullptr;
        size_t size = 0, used = 0;
    };
    void * take_chunked(size_t bytes);
    // VMM: backs [mapped_, end) with one physical allocation; false when the device lacks the memory.
    bool   map_to(size_t end);

    int    device_;
    bool   vmm_      = false;
    size_t reserve_  = 0;       // VMM: reserved range
    size_t granule_  = 0;       // VMM: allocation granularity
    size_t used_     = 0;       // bytes handed out (VMM: offset of the next take)
    size_t mapped_   = 0;       // VMM: bytes backed
    std::vector<unsigned long long> handles_;  // VMM: physical allocations, mapped in order
    std::vector<Chunk>              chunks_;   // fallback
};

}  // namespace spark::cuda
