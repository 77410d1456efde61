// pdl_enabled() and PdlStep (launch.h): whether this device's kernels use programmatic dependent
// launch.
#include "backends/cuda/common/launch.h"

#include <atomic>
#include <cstdlib>
#include <string>

namespace spark::cuda {

namespace {
thread_local bool t_step_allows_pdl = true;
}

PdlStep::PdlStep(bool on) : previous_(t_step_allows_pdl) { t_step_allows_pdl = on; }
PdlStep::~PdlStep() { t_step_allows_pdl = previous_; }

bool pdl_enabled() {
    static const bool env_on = [] {
        const char * e = std::getenv("SPARK_PDL");
        return !(e && std::string(e) == "0");
    }();
    if (!env_on || !t_step_allows_pdl) return false;  // (prefill launches skip the device query)
    constexpr int         kMaxDevices = 64;
    static std::atomic<int> state[kMaxDevices] = {};  // 0 unknown, 1 off, 2 on
    int                   dev          = 0;
    SPARK_CUDA_CHECK(cudaGetDevice(&dev));
    if (dev < 0 || dev >= kMaxDevices) return false;
    int s = state[dev].load(std::memory_order_relaxed);
    if (s == 0) {
        int major = 0;
        SPARK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        s = major >= 9 ? 2 : 1;
        state[dev].store(s, std::memory_order_relaxed);
    }
    return s == 2;
}

}  // namespace spark::cuda
