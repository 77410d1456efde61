// Loading a model's weights at the speed of the disk (or of memory, when the file is cached).
//
// add() plans each weight (plan_weight_upload: validation, device sizes) and takes its final
// addresses from the arena, so the architecture gets usable QWeights at once. commit() backs the
// arena with memory and streams every byte with a few threads. Each thread owns a CUDA stream and two
// pinned staging slots: it reads a piece of the file into one slot (HostReader: pread of the file
// behind the mapping) while the copy of the other slot to the GPU runs; INT4 weights land in the
// thread's scratch buffer and are repacked into the kernels' layout on the GPU. Jobs are taken
// in file order, so the threads read neighbouring ranges and the disk sees a few long sequential
// streams. Host memory stays at the staging slots: nothing of the model is copied on the host.
#include "backends/cuda/weight_batch.h"

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/ops.h"
#include "backends/cuda/weight_arena.h"
#include "common/error.h"
#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace spark::cuda {

namespace {

constexpr size_t kSlotBytes      = size_t(16) << 20;  // one read and one copy to the GPU
constexpr size_t kJobBytes       = size_t(16) << 20;  // plain weights are split into jobs of this size,
constexpr size_t kGroupBytes     = size_t(16) << 20;  // and neighbouring jobs grouped up to this size
constexpr size_t kBytesPerWorker = size_t(64) << 20;  // no more threads than this many bytes each
constexpr size_t kProgressStep   = size_t(64) << 20;  // progress is reported in steps of this many bytes

// A host range and where it goes: a device address, or an offset into the job's scratch buffer, or
// (tile_kc > 0) row-major bytes [tile_at, tile_at + bytes) of a tile-major 4-bit weight whose data
// starts at dst (each slot goes through the lane's device stage and tile_w4_chunks).
struct Piece {
    const void * src     = nullptr;
    size_t       bytes   = 0;
    void *       dst     = nullptr;
    size_t       scratch = 0;  // when the job repacks
    int64_t      tile_kc = 0;  // 16-byte chunks a row of the tile-major weight
    size_t       tile_at = 0;
};

struct Job {
    std::vector<Piece> pieces;
    bool               repack = false;  // INT4: pieces go to scratch, then repack_int4 into layout
    DeviceWeight       layout;
    int32_t            zero_offset   = 0;
    size_t             scratch_bytes = 0;
    size_t             words = 0, scales = 0, zeros = 0;  // scratch offsets (zeros: 0 = none)
    std::shared_ptr<std::vector<int32_t>> perm;          // keeps an act-order permutation's host copy alive
    const void *       order() const { return pieces.front().src; }
};

// One thread's CUDA resources, released in its destructor.
struct Lane {
    int          device;
    cudaStream_t stream = nullptr;
    void *       slot[2]{};
    cudaEvent_t  free[2]{};  // recorded after the copy out of the slot
    void *       scratch       = nullptr;  // INT4 jobs' host-layout bytes, reused job after job
    size_t       scratch_bytes = 0;        // (the stream orders each repack before the next copy in)
    void *       stage[2]{};               // device copies of packed slots (small INT4 weights)

    // Small INT4 weights packed into one slot: items at the start, their bytes after; one copy and
    // one repack launch for all of them.
    struct Pack {
        int                         slot = -1;  // -1: none open
        size_t                      used = 0;
        std::vector<Int4RepackItem> items;
        int64_t                     blocks = 0;
    } pack;

    Lane(int dev, size_t slot_bytes) : device(dev) {
        SPARK_CUDA_CHECK(cudaSetDevice(device));
        SPARK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        for (int i = 0; i < 2; ++i) {
            SPARK_CUDA_CHECK(cudaMallocHost(&slot[i], slot_bytes));
            SPARK_CUDA_CHECK(cudaMalloc(&stage[i], slot_bytes));
            SPARK_CUDA_CHECK(cudaEventCreateWithFlags(&free[i], cudaEventDisableTiming));
        }
    }
    uint8_t * scratch_for(size_t bytes) {
        if (bytes > scratch_bytes) {
            SPARK_CUDA_CHECK(cudaStreamSynchronize(stream));  // the old one may still be read
            if (scratch) cudaFree(scratch);
            scratch       = nullptr;
            scratch_bytes = 0;
            SPARK_CUDA_CHECK(cudaMalloc(&scratch, bytes));
            scratch_bytes = bytes;
        }
        return static_cast<uint8_t *>(scratch);
    }
    ~Lane() {
        if (stream) cudaStreamSynchronize(stream);
        for (int i = 0; i < 2; ++i) {
            if (free[i]) cudaEventDestroy(free[i]);
            if (slot[i]) cudaFreeHost(slot[i]);
            if (stage[i]) cudaFree(stage[i]);
        }
        if (scratch) cudaFree(scratch);
        if (stream) cudaStreamDestroy(stream);
    }
};

// A file mapping registered with the device for weights used in place (weight_placement.h): mapped
// into the device's address space, read-only, until the model (whose storage holds this) goes, which
// is before its source unmaps the file.
class HostRegistration final : public Buffer {
public:
    HostRegistration(int device, const void * base, size_t bytes) : device_(device) {
        data_ = const_cast<void *>(base);
        size_ = bytes;
    }
    ~HostRegistration() override {
        cudaSetDevice(device_);
        cudaHostUnregister(data_);
    }

private:
    int device_;
};

class CudaWeightBatch final : public WeightBatch {
public:
    CudaWeightBatch(int device, size_t device_memory, int n_threads, std::vector<std::unique_ptr<Buffer>> & storage,
                    std::function<QWeight(const QWeight &, const DeviceWeight &)> remember, const HostReader * in_place)
        : device_(device), n_threads_(n_threads), remember_(std::move(remember)), storage_(&storage), in_place_(in_place) {
        auto arena = std::make_unique<WeightArena>(device, device_memory);
        arena_     = arena.get();
        storage.push_back(std::move(arena));  // owned by the model: freed with it, also after a failed load
        int page_tables = 0;
        if (in_place_ && cudaDeviceGetAttribute(&page_tables, cudaDevAttrPageableMemoryAccessUsesHostPageTables, device) != cudaSuccess)
            page_tables = 0;
        cudaGetLastError();
        host_page_tables_ = page_tables != 0;
    }

    QWeight add(const QWeight & host) override {
        SPARK_CUDA_CHECK(cudaSetDevice(device_));  // the arena's fallback allocates as it goes
        WeightUploadPlan plan = plan_weight_upload(host);
        if (in_place(host, plan)) return remember_(host, plan.layout);
        place_weight_upload(plan, &CudaWeightBatch::take, arena_);
        const DeviceWeight & d = plan.layout;
        if (!plan.repack) {
            add_plain(host.data, plan.host.data, const_cast<void *>(d.data), d.tiled ? d.k / 32 : 0);
            if (plan.host.scales) add_plain(host.scales, plan.host.scales, const_cast<void *>(d.scales));
        } else {
            Job j;
            j.repack        = true;
            j.layout        = d;
            j.zero_offset   = host.zero_offset;
            j.words         = 0;
            j.scales        = round_up(plan.host.data);
            j.zeros         = plan.host.zeros ? j.scales + round_up(plan.host.scales) : 0;
            j.scratch_bytes = j.scales + round_up(plan.host.scales) + round_up(plan.host.zeros);
            j.pieces.push_back({host.data, plan.host.data, nullptr, j.words});
            j.pieces.push_back({host.scales, plan.host.scales, nullptr, j.scales});
            if (plan.host.zeros) j.pieces.push_back({host.zeros, plan.host.zeros, nullptr, j.zeros});
            if (!plan.perm.empty()) {
                j.perm = std::make_shared<std::vector<int32_t>>(std::move(plan.perm));
                j.pieces.push_back({j.perm->data(), j.perm->size() * sizeof(int32_t), const_cast<int32_t *>(d.perm), 0});
            }
            for (const Piece & p : j.pieces) bytes_ += p.bytes;
            jobs_.push_back(std::move(j));
        }
        return remember_(host, d);
    }

    void * add_copy(const void * host, size_t bytes) override {
        SPARK_CUDA_CHECK(cudaSetDevice(device_));
        void * dst = arena_->take(bytes);
        copies_.emplace_back(static_cast<const uint8_t *>(host), static_cast<const uint8_t *>(host) + bytes);
        add_plain(copies_.back().data(), bytes, dst);
        return dst;
    }

    uint64_t bytes() const override { return bytes_; }
    uint64_t bytes_in_place() const override { return bytes_in_place_; }

    void commit(const HostReader & reader, const WeightProgress & progress) override {
        SPARK_CUDA_CHECK(cudaSetDevice(device_));
        arena_->commit();
        // File order (the jobs' first source addresses: one mapping per file, increasing offsets).
        std::stable_sort(jobs_.begin(), jobs_.end(), [](const Job & a, const Job & b) { return std::less<const void *>()(a.order(), b.order()); });
        // A thread takes a group of neighbouring jobs and asks for the whole span at once, so that
        // each thread reads one region of the file ahead of itself in large requests.
        groups_.clear();
        for (size_t i = 0, bytes = 0; i < jobs_.size(); ++i) {
            if (groups_.empty() || bytes >= kGroupBytes) groups_.push_back({i, i}), bytes = 0;
            groups_.back().second = i + 1;
            for (const Piece & p : jobs_[i].pieces) bytes += p.bytes;
        }
        size_t largest = 0;
        for (const Job & j : jobs_)
            for (const Piece & p : j.pieces) largest = std::max(largest, p.bytes);
        const size_t slot_bytes = std::min(kSlotBytes, (largest + 4095) / 4096 * 4096);
        const int    n_workers  = int(std::clamp<uint64_t>(bytes_ / kBytesPerWorker, 1, uint64_t(load_threads(n_threads_))));

        Shared sh;
        sh.reader     = &reader;
        sh.slot_bytes = slot_bytes;
        sh.total      = bytes_;
        std::vector<std::thread> workers;
        auto stop_and_join = [&] {
            sh.stop = true;
            for (std::thread & t : workers)
                if (t.joinable()) t.join();
        };
        try {
            for (int i = 0; i < n_workers; ++i) workers.emplace_back([this, &sh] { work(sh); });
            // Report each advance on this (the loading) thread until every worker has returned.
            std::unique_lock<std::mutex> lock(sh.mutex);
            uint64_t                     reported = 0;
            for (;;) {
                sh.changed.wait(lock, [&] { return sh.done != reported || sh.finished == n_workers; });
                if (sh.done != reported && !sh.error && !sh.stop) {
                    reported = sh.done;
                    lock.unlock();
                    const bool go_on = !progress || progress(reported, bytes_);
                    lock.lock();
                    if (!go_on) sh.cancelled = sh.stop = true;
                } else if (sh.finished == n_workers) {
                    break;
                } else {
                    reported = sh.done;  // after an error or a stop: nothing more is reported
                }
            }
            lock.unlock();
            stop_and_join();
        } catch (...) {
            stop_and_join();  // the progress callback threw (cancel) or a thread could not start
            throw;
        }
        if (sh.error) std::rethrow_exception(sh.error);
        if (sh.cancelled) fail(SPARK_ERR_ABORTED, "model loading was cancelled by the progress callback");
        if (sh.done != bytes_) fail(SPARK_ERR_INTERNAL, "weight upload moved %llu of %llu bytes", (unsigned long long) sh.done, (unsigned long long) bytes_);
    }

private:
    struct Shared {
        const HostReader *      reader = nullptr;
        size_t                  slot_bytes = 0;
        std::atomic<size_t>     next{0};
        std::atomic<bool>       stop{false};       // every thread stops taking work
        bool                    cancelled = false; // by the progress callback (loading thread only)
        std::mutex              mutex;
        std::condition_variable changed;
        std::atomic<uint64_t>   done{0};       // bytes moved
        uint64_t                total    = 0;
        int                     finished = 0;  // threads that have returned (guarded by mutex)
        std::exception_ptr      error;         // the first failure (guarded by mutex)

        // Counts moved bytes; wakes the loading thread every kProgressStep and at the end (waking it
        // for each of Qwen3-Next's 300K pieces cost more than the copies).
        void advance(uint64_t n) {
            const uint64_t before = done.fetch_add(n);
            if ((before + n) / kProgressStep == before / kProgressStep && before + n != total) return;
            std::lock_guard<std::mutex> lock(mutex);
            changed.notify_all();
        }
    };

    static size_t round_up(size_t v) { return (v + 255) / 256 * 256; }
    static void * take(void * arena, size_t bytes) { return static_cast<WeightArena *>(arena)->take(bytes); }

    // Plain bytes to a final address, split so that several threads share a large tensor; tile_kc > 0:
    // the row-major bytes of a tile-major 4-bit weight at dst (kJobBytes is a multiple of 16).
    void add_plain(const void * src, size_t bytes, void * dst, int64_t tile_kc = 0) {
        for (size_t off = 0; off < bytes; off += kJobBytes) {
            Job   j;
            Piece p{static_cast<const uint8_t *>(src) + off, std::min(kJobBytes, bytes - off), static_cast<uint8_t *>(dst) + off, 0};
            if (tile_kc > 0) p.dst = dst, p.tile_kc = tile_kc, p.tile_at = off;
            j.pieces.push_back(p);
            jobs_.push_back(std::move(j));
        }
        bytes_ += bytes;
    }

    void work(Shared & sh) {
        try {
            Lane lane(device_, sh.slot_bytes);
            int  turn = 0;
            for (size_t g = sh.next++; g < groups_.size() && !sh.stop; g = sh.next++) {
                const auto [first, last] = groups_[g];
                const auto * begin = static_cast<const uint8_t *>(jobs_[first].order());
                const Piece & tail = jobs_[last - 1].pieces.back();
                const auto *  end  = static_cast<const uint8_t *>(tail.src) + tail.bytes;
                if (end > begin && size_t(end - begin) <= 2 * kGroupBytes + kSlotBytes) sh.reader->prefetch(begin, size_t(end - begin));
                for (size_t i = first; i < last && !sh.stop; ++i) {
                    if (packable(jobs_[i], sh.slot_bytes)) {
                        pack(jobs_[i], lane, turn, sh);
                    } else {
                        flush(lane);  // run() takes the next slot, which may be the open pack's
                        run(jobs_[i], lane, turn, sh);
                    }
                }
                flush(lane);
            }
            SPARK_CUDA_CHECK(cudaStreamSynchronize(lane.stream));
        } catch (...) {
            std::lock_guard<std::mutex> lock(sh.mutex);
            if (!sh.error) sh.error = std::current_exception();
            sh.stop = true;
        }
        std::lock_guard<std::mutex> lock(sh.mutex);
        ++sh.finished;
        sh.changed.notify_all();
    }

    static constexpr size_t kPackItems  = 128;
    static constexpr size_t kPackHeader = (kPackItems * sizeof(Int4RepackItem) + 255) / 256 * 256;

    static bool packable(const Job & job, size_t slot_bytes) {
        return job.repack && !job.perm && kPackHeader + job.scratch_bytes <= slot_bytes;
    }

    // Reads a small INT4 weight into the lane's open pack (opening or flushing one as needed).
    void pack(const Job & job, Lane & lane, int & turn, Shared & sh) {
        Lane::Pack & p = lane.pack;
        if (p.slot >= 0 && (p.used + job.scratch_bytes > sh.slot_bytes || p.items.size() == kPackItems)) flush(lane);
        if (p.slot < 0) {
            p.slot = turn++ & 1;
            SPARK_CUDA_CHECK(cudaEventSynchronize(lane.free[p.slot]));  // its previous copy is done
            p.used = kPackHeader;
        }
        auto * host  = static_cast<uint8_t *>(lane.slot[p.slot]) + p.used;
        auto * stage = static_cast<uint8_t *>(lane.stage[p.slot]) + p.used;
        for (const Piece & piece : job.pieces) {
            sh.reader->read(host + piece.scratch, piece.src, piece.bytes);
            sh.advance(piece.bytes);
        }
        Int4RepackItem it;
        it.words       = reinterpret_cast<const uint32_t *>(stage + job.words);
        it.scales      = reinterpret_cast<const uint16_t *>(stage + job.scales);
        it.zeros       = job.zeros ? reinterpret_cast<const uint32_t *>(stage + job.zeros) : nullptr;
        it.dst_words   = static_cast<uint32_t *>(const_cast<void *>(job.layout.data));
        it.dst_scales  = static_cast<uint16_t *>(const_cast<void *>(job.layout.scales));
        it.dst_zeros   = const_cast<uint8_t *>(job.layout.zeros);
        it.n           = job.layout.n;
        it.k8          = job.layout.k / 8;
        it.tiled       = job.layout.tiled;
        it.groups      = job.layout.n_groups;
        it.zero_offset = job.zero_offset;
        it.first_block = p.blocks;
        p.blocks += int4_repack_blocks(it);
        p.items.push_back(it);
        p.used += round_up(job.scratch_bytes);
    }

    // Copies the open pack to the GPU and repacks every weight in it with one launch.
    void flush(Lane & lane) {
        Lane::Pack & p = lane.pack;
        if (p.slot < 0) return;
        std::memcpy(lane.slot[p.slot], p.items.data(), p.items.size() * sizeof(Int4RepackItem));
        SPARK_CUDA_CHECK(cudaMemcpyAsync(lane.stage[p.slot], lane.slot[p.slot], p.used, cudaMemcpyHostToDevice, lane.stream));
        repack_int4_many(static_cast<const Int4RepackItem *>(lane.stage[p.slot]), int(p.items.size()), p.blocks, lane.stream);
        SPARK_CUDA_CHECK(cudaEventRecord(lane.free[p.slot], lane.stream));
        p = Lane::Pack{};
    }

    void run(const Job & job, Lane & lane, int & turn, Shared & sh) {
        uint8_t * scratch = job.repack ? lane.scratch_for(job.scratch_bytes) : nullptr;
        for (const Piece & p : job.pieces) {
            uint8_t * dst = job.repack && p.dst == nullptr ? scratch + p.scratch : static_cast<uint8_t *>(p.dst);
            for (size_t off = 0; off < p.bytes && !sh.stop; off += sh.slot_bytes) {
                const size_t n    = std::min(sh.slot_bytes, p.bytes - off);
                const int    slot = turn++ & 1;
                SPARK_CUDA_CHECK(cudaEventSynchronize(lane.free[slot]));  // its previous copy is done
                sh.reader->read(lane.slot[slot], static_cast<const uint8_t *>(p.src) + off, n);
                if (p.tile_kc > 0) {  // (slots are a multiple of 4096 bytes: whole chunks)
                    SPARK_CUDA_CHECK(cudaMemcpyAsync(lane.stage[slot], lane.slot[slot], n, cudaMemcpyHostToDevice, lane.stream));
                    tile_w4_chunks(lane.stage[slot], int64_t((p.tile_at + off) / 16), int64_t(n / 16), p.tile_kc, dst, lane.stream);
                } else {
                    SPARK_CUDA_CHECK(cudaMemcpyAsync(dst + off, lane.slot[slot], n, cudaMemcpyHostToDevice, lane.stream));
                }
                SPARK_CUDA_CHECK(cudaEventRecord(lane.free[slot], lane.stream));
                sh.advance(n);
            }
        }
        if (job.repack && !sh.stop)
            repack_int4(job.layout, scratch + job.words, scratch + job.scales, job.zeros ? scratch + job.zeros : nullptr, job.zero_offset, lane.stream);
    }

    int                                                           device_;
    int                                                           n_threads_;
    std::function<QWeight(const QWeight &, const DeviceWeight &)> remember_;
    std::vector<std::unique_ptr<Buffer>> *                        storage_;
    const HostReader *                                            in_place_;  // non-null: weights may stay in the file's mapping
    bool                                                          host_page_tables_ = false;
    std::unordered_map<const void *, const char *>                mapped_;  // mapping base -> its device address (nullptr: not mappable)
    uint64_t                                                      bytes_in_place_ = 0;

    // In place (weight_placement.h): a weight the kernels read in the checkpoint's layout (no
    // repack), whose data and scales lie 16-byte aligned in the source's file mappings, points into
    // them (each mapping registered with the device once) and has nothing to move at commit. False:
    // the weight is copied as usual.
    bool in_place(const QWeight & host, WeightUploadPlan & plan) {
        if (!in_place_ || plan.repack || !plan.perm.empty() || plan.host.zeros || plan.host.g_idx) return false;
        const void * parts[2] = {host.data, host.scales};
        const size_t sizes[2] = {plan.host.data, plan.host.scales};
        const char * dev[2]   = {nullptr, nullptr};
        for (int i = 0; i < 2; ++i) {
            if (sizes[i] == 0) continue;
            if (reinterpret_cast<uintptr_t>(parts[i]) % 16 != 0) return false;  // (the kernels' 16-byte loads)
            const HostReader::Mapping m = in_place_->mapping(parts[i], sizes[i]);
            const char *              d = m.base ? device_address(m) : nullptr;
            if (!d) return false;
            dev[i] = d + (static_cast<const char *>(parts[i]) - static_cast<const char *>(m.base));
        }
        plan.layout.data   = dev[0];
        plan.layout.scales = dev[1];
        plan.layout.tiled  = false;  // the checkpoint's bytes as they are: row-major
        bytes_in_place_ += sizes[0] + sizes[1];
        return true;
    }

    // The device address of a mapping: the host's own on a GPU that walks its page tables, else the
    // mapping registered read-only (its pages read ahead first). nullptr when it cannot be.
    const char * device_address(const HostReader::Mapping & m) {
        auto it = mapped_.find(m.base);
        if (it != mapped_.end()) return it->second;
        const char * d = nullptr;
        if (host_page_tables_) {
            d = static_cast<const char *>(m.base);
        } else {
            in_place_->prefetch(m.base, m.bytes);  // the registration faults every page in: let the disk run ahead
            void * base = const_cast<void *>(m.base);
            if (cudaHostRegister(base, m.bytes, cudaHostRegisterMapped | cudaHostRegisterReadOnly) == cudaSuccess) {
                storage_->push_back(std::make_unique<HostRegistration>(device_, m.base, m.bytes));
                void * dp = nullptr;
                if (cudaHostGetDevicePointer(&dp, base, 0) == cudaSuccess) d = static_cast<const char *>(dp);
            }
            cudaGetLastError();  // a mapping that cannot be registered is copied instead
        }
        mapped_[m.base] = d;
        return d;
    }
    WeightArena *                                                 arena_ = nullptr;
    std::vector<Job>                                              jobs_;
    std::vector<std::pair<size_t, size_t>>                        groups_;  // [first, last) jobs, in file order
    std::deque<std::vector<uint8_t>>                              copies_;  // add_copy's host bytes (stable addresses)
    uint64_t                                                      bytes_ = 0;
};

}  // namespace

std::unique_ptr<WeightBatch> make_weight_batch(int device, size_t device_memory, int n_threads, std::vector<std::unique_ptr<Buffer>> & storage,
                                               std::function<QWeight(const QWeight &, const DeviceWeight &)> remember,
                                               const HostReader * in_place) {
    return std::make_unique<CudaWeightBatch>(device, device_memory, n_threads, storage, std::move(remember), in_place);
}

}  // namespace spark::cuda
