#include "backends/cuda/weight_placement.h"

#include "backends/cuda/cuda_common.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace spark::cuda {

int weights_in_place_override() {
    const char * e = std::getenv("SPARK_WEIGHTS_IN_PLACE");
    if (!e || !*e) return -1;
    return std::string(e) == "0" ? 0 : 1;
}

MemoryFacts memory_facts(int device) {
    MemoryFacts f;
    int         integrated = 0, page_tables = 0;
    if (cudaDeviceGetAttribute(&integrated, cudaDevAttrIntegrated, device) != cudaSuccess) integrated = 0;
    if (cudaDeviceGetAttribute(&page_tables, cudaDevAttrPageableMemoryAccessUsesHostPageTables, device) != cudaSuccess) page_tables = 0;
    cudaGetLastError();
    f.integrated       = integrated != 0;
    f.host_page_tables = page_tables != 0;
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, device) == cudaSuccess) f.device_bytes = uint64_t(p.totalGlobalMem);
    cudaGetLastError();
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) f.host_bytes = uint64_t(pages) * uint64_t(page);
    return f;
}

}  // namespace spark::cuda
