#include "backends/cuda/weight_arena.h"

#include "backends/cuda/cuda_common.h"
#include "common/error.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>

namespace spark::cuda {

namespace {

// The driver's virtual-memory calls, found through the runtime (libspark does not link libcuda:
// a CPU-only user of a CUDA build must be able to load it without a driver).
struct Vmm {
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long)               = nullptr;
    CUresult (*address_free)(CUdeviceptr, size_t)                                                     = nullptr;
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long) = nullptr;
    CUresult (*release)(CUmemGenericAllocationHandle)                                                 = nullptr;
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)    = nullptr;
    CUresult (*unmap)(CUdeviceptr, size_t)                                                            = nullptr;
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t)                      = nullptr;
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags)  = nullptr;
    CUresult (*device_get)(CUdevice *, int)                                                           = nullptr;
    CUresult (*attribute)(int *, CUdevice_attribute, CUdevice)                                        = nullptr;
    bool     loaded                                                                                   = false;
};

const Vmm & vmm() {
    static Vmm v;
    static std::once_flag once;
    std::call_once(once, [] {
        bool ok  = true;
        auto get = [&](const char * name, auto & fn) {
            void *                           p      = nullptr;
            cudaDriverEntryPointQueryResult  status = cudaDriverEntryPointSymbolNotFound;
            if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &status) != cudaSuccess || status != cudaDriverEntryPointSuccess || !p) {
                cudaGetLastError();
                ok = false;
                return;
            }
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
        };
        get("cuMemAddressReserve", v.reserve);
        get("cuMemAddressFree", v.address_free);
        get("cuMemCreate", v.create);
        get("cuMemRelease", v.release);
        get("cuMemMap", v.map);
        get("cuMemUnmap", v.unmap);
        get("cuMemSetAccess", v.set_access);
        get("cuMemGetAllocationGranularity", v.granularity);
        get("cuDeviceGet", v.device_get);
        get("cuDeviceGetAttribute", v.attribute);
        v.loaded = ok;
    });
    return v;
}

CUmemAllocationProp device_prop(int device) {
    CUmemAllocationProp prop{};
    prop.type          = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id   = device;
    return prop;
}

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

constexpr size_t kAlign        = 256;                 // every weight part starts on a 256-byte line
constexpr size_t kChunkBytes   = size_t(256) << 20;   // fallback: chunk size,
constexpr size_t kOwnChunkFrom = size_t(32) << 20;    // and parts this large get a chunk of their own
constexpr size_t kGrowBytes    = size_t(1) << 30;     // take_usable's mapping step

[[noreturn]] void out_of_memory(size_t bytes) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaGetLastError();
    fail(SPARK_ERR_OUT_OF_MEMORY, "out of GPU memory: the weights need %.1f MiB (%.1f MiB free of %.1f MiB)", double(bytes) / 1048576.0,
         double(free_b) / 1048576.0, double(total_b) / 1048576.0);
}

}  // namespace

WeightArena::WeightArena(int device, size_t reserve) : device_(device) {
    const char * env = std::getenv("SPARK_CUDA_VMM");  // "0": the fallback, for A/B runs and its test
    if (env && std::strcmp(env, "0") == 0) return;
    const Vmm & v = vmm();
    if (!v.loaded) return;
    CUdevice dev       = 0;
    int      supported = 0;
    if (v.device_get(&dev, device) != CUDA_SUCCESS ||
        v.attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) != CUDA_SUCCESS || !supported)
        return;
    const CUmemAllocationProp prop = device_prop(device);
    if (v.granularity(&granule_, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS || granule_ == 0) return;
    reserve_       = round_up(std::max<size_t>(reserve, granule_), granule_);
    CUdeviceptr va = 0;
    if (v.reserve(&va, reserve_, 0, 0, 0) != CUDA_SUCCESS) return;  // no address space: chunks
    data_ = reinterpret_cast<void *>(va);
    vmm_  = true;
}

WeightArena::~WeightArena() {
    cudaSetDevice(device_);
    cudaDeviceSynchronize();  // unmapping does not wait for kernels still reading the weights
    if (vmm_) {
        const Vmm & v  = vmm();
        const auto  va = reinterpret_cast<CUdeviceptr>(data_);
        if (mapped_) v.unmap(va, mapped_);
        for (unsigned long long h : handles_) v.release(CUmemGenericAllocationHandle(h));
        v.address_free(va, reserve_);
    }
    for (const Chunk & c : chunks_) cudaFree(c.base);
}

void * WeightArena::take(size_t bytes) {
    bytes = round_up(std::max<size_t>(bytes, 1), kAlign);
    if (!vmm_) return take_chunked(bytes);
    if (bytes > reserve_ - used_) out_of_memory(used_ + bytes);
    void * p = static_cast<char *>(data_) + used_;
    used_ += bytes;
    return p;
}

void * WeightArena::take_chunked(size_t bytes) {
    auto allocate = [&](size_t size) {
        Chunk c;
        c.size = size;
        if (cudaMalloc(&c.base, size) != cudaSuccess) out_of_memory(size);
        chunks_.push_back(c);
        return &chunks_.back();
    };
    used_ += bytes;
    if (bytes >= kOwnChunkFrom) {
        Chunk * c = allocate(bytes);
        c->used   = bytes;
        return c->base;
    }
    Chunk * c = nullptr;
    for (Chunk & k : chunks_)  // the open chunk is the last shared one
        if (k.size == kChunkBytes && k.size - k.used >= bytes) c = &k;
    if (!c) c = allocate(kChunkBytes);
    void * p = static_cast<char *>(c->base) + c->used;
    c->used += bytes;
    return p;
}

bool WeightArena::map_to(size_t end) {
    const Vmm &               v    = vmm();
    const CUmemAllocationProp prop = device_prop(device_);
    const size_t              size = end - mapped_;
    CUmemGenericAllocationHandle h = 0;
    if (v.create(&h, size, &prop, 0) != CUDA_SUCCESS) return false;
    const auto va = reinterpret_cast<CUdeviceptr>(data_) + mapped_;
    if (v.map(va, size, 0, h, 0) != CUDA_SUCCESS) {
        v.release(h);
        fail(SPARK_ERR_DEVICE, "cannot map %.1f MiB of GPU memory for the weights", double(size) / 1048576.0);
    }
    handles_.push_back(h);
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags    = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (v.set_access(va, size, &access, 1) != CUDA_SUCCESS) {
        v.unmap(va, size);  // the handle is released by the destructor
        fail(SPARK_ERR_DEVICE, "cannot make %.1f MiB of mapped GPU memory accessible", double(size) / 1048576.0);
    }
    mapped_ += size;
    size_  = mapped_;
    return true;
}

void WeightArena::commit() {
    if (!vmm_ || used_ <= mapped_) return;
    const size_t end = round_up(used_, granule_);
    if (!map_to(end)) out_of_memory(end - mapped_);
}

void * WeightArena::take_usable(size_t bytes) {
    void * p = take(bytes);
    if (vmm_ && used_ > mapped_) {
        // Steps double up to kGrowBytes: a tiny model maps little more than it takes, a large one
        // ~1 GiB at a time.
        const size_t step  = std::clamp(mapped_, granule_, kGrowBytes);
        const size_t ahead = std::min(std::max(round_up(used_, granule_), round_up(mapped_ + step, granule_)), reserve_);
        if (!map_to(ahead)) commit();  // near the device's end: only what was taken
    }
    return p;
}

}  // namespace spark::cuda
