// The NCCL communicator (comm_nccl.h). NCCL is opened at run time: the build needs nccl.h only, for
// the types and for the exact signatures of the few functions resolved with dlsym, so that libspark
// does not depend on libnccl and a host without it fails only when it asks for several GPUs.
#include "backends/cuda/comm_nccl.h"

#include "common/error.h"

#ifdef SPARK_HAS_NCCL

#include "backends/cuda/cuda_common.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>

namespace spark::cuda {

namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(NcclUniqueId), "ncclUniqueId is 128 bytes (NCCL_UNIQUE_ID_BYTES)");

// Graph capture of collectives and send / recv came with NCCL 2.9 (version codes are
// major * 10000 + minor * 100 + patch since then, smaller before).
constexpr int kMinNcclVersion = 20900;

// The NCCL calls spark makes, typed by nccl.h's own declarations.
struct NcclApi {
    decltype(&::ncclGetVersion)     GetVersion     = nullptr;
    decltype(&::ncclGetErrorString) GetErrorString = nullptr;
    decltype(&::ncclGetLastError)   GetLastError   = nullptr;  // NCCL 2.13+; optional
    decltype(&::ncclGetUniqueId)    GetUniqueId    = nullptr;
    decltype(&::ncclCommInitAll)    CommInitAll    = nullptr;
    decltype(&::ncclCommInitRank)   CommInitRank   = nullptr;
    decltype(&::ncclCommDestroy)    CommDestroy    = nullptr;
    decltype(&::ncclCommAbort)      CommAbort      = nullptr;
    decltype(&::ncclAllReduce)      AllReduce      = nullptr;
    decltype(&::ncclAllGather)      AllGather      = nullptr;
    decltype(&::ncclSend)           Send           = nullptr;
    decltype(&::ncclRecv)           Recv           = nullptr;
    decltype(&::ncclGroupStart)     GroupStart     = nullptr;
    decltype(&::ncclGroupEnd)       GroupEnd       = nullptr;
};

struct Loaded {
    NcclApi     api;
    std::string error;  // why NCCL cannot be used; empty when it can
};

std::string dl_error() {
    const char * e = dlerror();
    return e ? e : "unknown error";
}

Loaded load_nccl() {
    Loaded      out;
    void *      handle = nullptr;
    std::string from, tried;
    const auto  open = [&](const std::string & path, int extra_flags, const char * what) {
        dlerror();
        handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | extra_flags);
        if (handle) from = path;
        else if (what) tried += std::string(tried.empty() ? "" : "; ") + what + ": " + dl_error();
        return handle != nullptr;
    };

    if (const char * env = std::getenv("SPARK_NCCL_LIBRARY"); env && *env) {
        std::string path = env;
        struct stat st{};
        if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) path += "/libnccl.so.2";
        // An explicit choice that fails is reported, not replaced by another copy.
        if (!open(path, 0, nullptr)) {
            out.error = strfmt("NCCL (libnccl.so.2) not found: SPARK_NCCL_LIBRARY names %s, which cannot be loaded: %s",
                               path.c_str(), dl_error().c_str());
            return out;
        }
    }
    // A copy already in the process (a host that uses PyTorch, say) is the one to share.
    if (!handle) open("libnccl.so.2", RTLD_NOLOAD, nullptr);
    const std::string configured = SPARK_NCCL_LIBRARY_DIR;
    if (!handle && !configured.empty()) open(configured + "/libnccl.so.2", 0, "where spark was configured");
    if (!handle) open("libnccl.so.2", 0, "on the loader's path");
    if (!handle) {
        out.error = strfmt("NCCL (libnccl.so.2) not found: %s. Several GPUs need NCCL: pip install nvidia-nccl-cu13 "
                           "(it lies in site-packages/nvidia/nccl/lib) and set SPARK_NCCL_LIBRARY to it",
                           tried.c_str());
        return out;
    }

    std::string missing;
    const auto  resolve = [&](auto & fn, const char * name, bool required) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
        if (!fn && required) missing += std::string(missing.empty() ? "" : ", ") + name;
    };
    NcclApi & a = out.api;
    resolve(a.GetVersion, "ncclGetVersion", true);
    resolve(a.GetErrorString, "ncclGetErrorString", true);
    resolve(a.GetLastError, "ncclGetLastError", false);
    resolve(a.GetUniqueId, "ncclGetUniqueId", true);
    resolve(a.CommInitAll, "ncclCommInitAll", true);
    resolve(a.CommInitRank, "ncclCommInitRank", true);
    resolve(a.CommDestroy, "ncclCommDestroy", true);
    resolve(a.CommAbort, "ncclCommAbort", true);
    resolve(a.AllReduce, "ncclAllReduce", true);
    resolve(a.AllGather, "ncclAllGather", true);
    resolve(a.Send, "ncclSend", true);
    resolve(a.Recv, "ncclRecv", true);
    resolve(a.GroupStart, "ncclGroupStart", true);
    resolve(a.GroupEnd, "ncclGroupEnd", true);
    int version = 0;
    if (missing.empty() && (a.GetVersion(&version) != ncclSuccess || version < kMinNcclVersion))
        out.error = strfmt("NCCL from %s is version code %d: spark needs NCCL 2.9 or newer", from.c_str(), version);
    else if (!missing.empty())
        out.error = strfmt("NCCL from %s lacks %s", from.c_str(), missing.c_str());
    // The library stays loaded for the process (NCCL keeps threads of its own); not dlclose'd.
    return out;
}

// Opened once, at first use; an error is kept and reported at every use.
const NcclApi & nccl() {
    static const Loaded loaded = load_nccl();
    if (!loaded.error.empty()) fail(SPARK_ERR_UNSUPPORTED, "%s", loaded.error.c_str());
    return loaded.api;
}

std::string nccl_reason(ncclResult_t r) {
    const NcclApi & a = nccl();
    std::string     s = a.GetErrorString(r);
    if (a.GetLastError) {
        const char * last = a.GetLastError(nullptr);  // the argument is unused by NCCL
        if (last && *last) s += std::string(" (") + last + ")";
    }
    return s;
}

void check_init(ncclResult_t r, const char * call) {
    if (r != ncclSuccess) fail(SPARK_ERR_DEVICE, "%s failed: %s", call, nccl_reason(r).c_str());
}

// The device of the calling thread, put back when the factory returns.
class CurrentDevice {
public:
    CurrentDevice() { SPARK_CUDA_CHECK(cudaGetDevice(&saved_)); }
    ~CurrentDevice() { cudaSetDevice(saved_); }

private:
    int saved_ = 0;
};

void check_device(int device) {
    int count = 0;
    SPARK_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (device < 0 || device >= count)
        fail(SPARK_ERR_INVALID_ARGUMENT, "CUDA device %d does not exist (this process sees %d)", device, count);
}

// What the ranks of one process share: a rank that ends the group tells the others.
struct GroupState {
    std::mutex  mutex;
    bool        broken = false;
    std::string reason;
};

bool overlap(const void * a, size_t a_bytes, const void * b, size_t b_bytes) {
    const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
    return x < y + b_bytes && y < x + a_bytes;
}

class NcclRank final : public Communicator {
public:
    NcclRank(ncclComm_t comm, int rank, int size, std::shared_ptr<GroupState> group)
        : comm_(comm), rank_(rank), size_(size), group_(std::move(group)) {}
    ~NcclRank() override {
        if (!comm_) return;
        bool broken = false;
        {
            std::lock_guard<std::mutex> lock(group_->mutex);
            broken = group_->broken;
        }
        // ncclCommDestroy flushes what is pending, which may wait for a rank that has gone.
        if (broken) nccl().CommAbort(comm_);
        else nccl().CommDestroy(comm_);
    }

    int  rank() const override { return rank_; }
    int  size() const override { return size_; }
    void set_stream(void * stream) override { stream_ = static_cast<cudaStream_t>(stream); }

    void all_reduce_sum(float * data, size_t n) override {
        check_open();
        if (n) check(nccl().AllReduce(data, data, n, ncclFloat, ncclSum, comm_, stream_), "ncclAllReduce");
    }

    void all_gather(const float * in, float * out, size_t n) override {
        check_open();
        if (!n) return;
        const size_t bytes = n * sizeof(float);
        // NCCL reads `in` at out + rank n (in place) or apart from `out`; elsewhere it is copied first.
        float * tmp = nullptr;
        if (in != out + size_t(rank_) * n && overlap(in, bytes, out, bytes * size_t(size_)))
            in = tmp = stream_copy(in, bytes);
        const ncclResult_t r = nccl().AllGather(in, out, n, ncclFloat, comm_, stream_);
        if (tmp) SPARK_CUDA_CHECK(cudaFreeAsync(tmp, stream_));  // after the gather, in stream order
        check(r, "ncclAllGather");
    }

    void all_to_all(const float * in, float * out, size_t n) override {
        check_open();
        if (!n) return;
        const size_t bytes = n * sizeof(float) * size_t(size_);
        // A block may arrive before the one sent from the same place has left: in place goes
        // through a copy.
        float * tmp = nullptr;
        if (overlap(in, bytes, out, bytes)) in = tmp = stream_copy(in, bytes);
        const NcclApi & a = nccl();
        ncclResult_t    r = a.GroupStart();
        if (r == ncclSuccess) {
            for (int p = 0; p < size_ && r == ncclSuccess; ++p) {
                r = a.Send(in + size_t(p) * n, n, ncclFloat, p, comm_, stream_);
                if (r == ncclSuccess) r = a.Recv(out + size_t(p) * n, n, ncclFloat, p, comm_, stream_);
            }
            const ncclResult_t end = a.GroupEnd();  // closes the group whatever happened inside it
            if (r == ncclSuccess) r = end;
        }
        if (tmp) SPARK_CUDA_CHECK(cudaFreeAsync(tmp, stream_));  // after the exchange, in stream order
        check(r, "ncclSend/ncclRecv (all-to-all)");
    }

    void abort(const char * why) override { end(why ? why : "(no reason given)"); }

private:
    // Throws once this rank or, in a group of one process, any of its ranks has ended.
    void check_open() {
        {
            std::lock_guard<std::mutex> lock(group_->mutex);
            if (group_->broken && reason_.empty()) reason_ = group_->reason;
        }
        if (reason_.empty()) return;
        end(reason_);
        fail(SPARK_ERR_ABORTED, "the rank group was aborted: %s", reason_.c_str());
    }

    void check(ncclResult_t r, const char * call) {
        if (r == ncclSuccess) return;
        const std::string why = strfmt("%s failed on rank %d: %s", call, rank_, nccl_reason(r).c_str());
        end(why);
        fail(SPARK_ERR_DEVICE, "%s", why.c_str());
    }

    // Ends this rank's communicator (at most once) and marks the group.
    void end(const std::string & why) {
        {
            std::lock_guard<std::mutex> lock(group_->mutex);
            if (!group_->broken) group_->reason = why;
            group_->broken = true;
            if (reason_.empty()) reason_ = group_->reason;
        }
        if (comm_) nccl().CommAbort(comm_);  // its result says nothing more: the rank is over
        comm_ = nullptr;
    }

    // A stream-ordered copy of `bytes` of `src` (freed by the caller with cudaFreeAsync): capturable.
    float * stream_copy(const float * src, size_t bytes) {
        void * tmp = nullptr;
        SPARK_CUDA_CHECK(cudaMallocAsync(&tmp, bytes, stream_));
        const cudaError_t err = cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, stream_);
        if (err != cudaSuccess) {
            cudaFreeAsync(tmp, stream_);
            SPARK_CUDA_CHECK(err);
        }
        return static_cast<float *>(tmp);
    }

    ncclComm_t                  comm_;
    int                         rank_, size_;
    std::shared_ptr<GroupState> group_;
    cudaStream_t                stream_ = nullptr;
    std::string                 reason_;  // why this rank ended; empty while it is open
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<int> & devices) {
    const NcclApi & a = nccl();
    if (devices.empty()) fail(SPARK_ERR_INVALID_ARGUMENT, "a group of GPUs needs at least one device");
    for (size_t i = 0; i < devices.size(); ++i) {
        check_device(devices[i]);
        for (size_t j = 0; j < i; ++j)
            if (devices[j] == devices[i])
                fail(SPARK_ERR_INVALID_ARGUMENT, "device %d appears twice in the group (one rank per GPU)", devices[i]);
    }
    std::vector<ncclComm_t> comms(devices.size(), nullptr);
    {
        CurrentDevice keep;  // ncclCommInitAll moves between the devices
        check_init(a.CommInitAll(comms.data(), int(devices.size()), devices.data()), "ncclCommInitAll");
    }
    auto                                       state = std::make_shared<GroupState>();
    std::vector<std::unique_ptr<Communicator>> ranks;
    for (size_t r = 0; r < comms.size(); ++r) ranks.push_back(std::make_unique<NcclRank>(comms[r], int(r), int(comms.size()), state));
    return ranks;
}

NcclUniqueId nccl_unique_id() {
    ncclUniqueId id;
    check_init(nccl().GetUniqueId(&id), "ncclGetUniqueId");
    NcclUniqueId out;
    std::memcpy(out.data(), &id, out.size());
    return out;
}

std::unique_ptr<Communicator> make_nccl_rank(const uint8_t id[128], int rank, int size, int device) {
    const NcclApi & a = nccl();
    if (!id) fail(SPARK_ERR_INVALID_ARGUMENT, "no NCCL unique id");
    if (size < 1 || rank < 0 || rank >= size) fail(SPARK_ERR_INVALID_ARGUMENT, "rank %d of a group of %d does not exist", rank, size);
    check_device(device);
    ncclUniqueId uid;
    std::memcpy(&uid, id, sizeof uid);
    ncclComm_t comm = nullptr;
    {
        CurrentDevice keep;
        SPARK_CUDA_CHECK(cudaSetDevice(device));
        check_init(a.CommInitRank(&comm, size, uid, rank), "ncclCommInitRank");
    }
    return std::make_unique<NcclRank>(comm, rank, size, std::make_shared<GroupState>());
}

}  // namespace spark::cuda

#else  // no NCCL in this build: the same factories, refusing

namespace spark::cuda {

namespace {
[[noreturn]] void no_nccl() {
    fail(SPARK_ERR_UNSUPPORTED, "this build of spark has no NCCL (built with SPARK_NCCL=OFF, or nccl.h was not found "
                                "when it was configured), so it cannot run on several GPUs");
}
}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<int> &) { no_nccl(); }
NcclUniqueId                               nccl_unique_id() { no_nccl(); }
std::unique_ptr<Communicator>              make_nccl_rank(const uint8_t *, int, int, int) { no_nccl(); }

}  // namespace spark::cuda

#endif
