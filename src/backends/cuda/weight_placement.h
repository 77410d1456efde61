// Where a model's weights live on the GPU: copied into device memory (discrete GPUs: their own
// memory is the fast one), or used in place from the mapped checkpoint file when the GPU's memory
// *is* the host's (DGX Spark GB10's unified LPDDR5X, Jetson): a copy there would only double the
// memory a model takes while it loads (a 60 GB model would need 120 GB: the page cache and the
// copy), and the GPU reads the file's pages as fast as any other.
//
// Only weights the kernels read in the checkpoint's own layout go in place (NVFP4, FP8, BF16 / F16
// / F32; data and scales 16-byte aligned inside one mapped file): INT4 is repacked into the
// kernels' layout at load and is copied on every GPU. NVFP4 in place keeps the checkpoint's
// row-major codes (copied, they are stored in 16 x 128 tiles: device_weight.h). The decision is a pure function of the
// device's and the host's properties (tested with injected ones); SPARK_WEIGHTS_IN_PLACE=0/1
// overrides it (1 on a discrete GPU reads the weights over PCIe: for testing the path only).
#pragma once

#include <cstdint>

namespace spark::cuda {

struct MemoryFacts {
    bool     integrated       = false;  // cudaDevAttrIntegrated: the GPU is part of the host's SoC
    bool     host_page_tables = false;  // cudaDevAttrPageableMemoryAccessUsesHostPageTables (ATS)
    uint64_t device_bytes     = 0;      // the device's memory (totalGlobalMem)
    uint64_t host_bytes       = 0;      // the host's physical memory
};

enum class WeightPlacement { Device, InPlace };

// In place when the GPU shares the host's memory: an integrated GPU, or one that walks the host's
// page tables and reports (nearly) the host's memory as its own (GB10; not a GH200, whose HBM is its
// own and faster than the host's LPDDR it could also reach). override: -1 auto, 0 never, 1 always.
constexpr WeightPlacement choose_weight_placement(const MemoryFacts & f, int override) {
    if (override == 0) return WeightPlacement::Device;
    if (override == 1) return WeightPlacement::InPlace;
    const bool shared = f.integrated || (f.host_page_tables && f.host_bytes > 0 && f.device_bytes >= f.host_bytes / 10 * 9);
    return shared ? WeightPlacement::InPlace : WeightPlacement::Device;
}

// SPARK_WEIGHTS_IN_PLACE as an override for choose_weight_placement (-1 when unset).
int weights_in_place_override();

// The facts of CUDA device `device` and of this host.
MemoryFacts memory_facts(int device);

}  // namespace spark::cuda
