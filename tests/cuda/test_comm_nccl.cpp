// The NCCL communicator (backends/cuda/comm_nccl.h) on this machine's GPUs: groups of 1 (every GPU
// machine), 2 and 4 (where there are that many GPUs; fewer: the case says so and checks nothing).
// Every collective against the expectation computed on the host, exactly: the inputs are integers
// below 2^24 whose sums over four ranks are exact in whatever order NCCL adds them, distinct for
// every (round, rank, block, index), so that a wrong peer, block or offset shows. Also: the calls
// captured in a CUDA graph and replayed on new inputs, the ranks of several "processes"
// (nccl_unique_id + make_nccl_rank, here threads), and abort. Every rank runs on a thread of its own
// with its device current, as NCCL requires of ranks that are not grouped.
#include "backends/cuda/comm_nccl.h"
#include "common/error.h"

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace spark;
using spark::cuda::make_nccl_group;
using spark::cuda::make_nccl_rank;
using spark::cuda::nccl_unique_id;

#ifdef SPARK_HAS_NCCL

namespace {

int visible_gpus() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    cudaGetLastError();
    return n;
}

// Integers below 2^24 (see the top), also summed over four ranks: distinct per round (of 16), per
// rank or rank and block (up to 16, 4096 apart) and per index (i % 4093 < 4096).
float value(int round, int rank, size_t i) { return float(int(i % 4093) + 4096 * (rank + 1) + 131072 * (round % 16)); }

// A CUDA failure inside a rank's thread: thrown, caught by run_ranks, reported by the case.
void cuda_ok(cudaError_t e, const char * what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Device floats of the current device, moved on `stream` (a non-blocking stream does not wait for
// the legacy default stream's copies).
struct DevFloats {
    float *      p = nullptr;
    size_t       n = 0;
    cudaStream_t s = nullptr;
    DevFloats(size_t count, cudaStream_t stream) : n(count), s(stream) { cuda_ok(cudaMalloc(&p, (count ? count : 1) * sizeof(float)), "cudaMalloc"); }
    ~DevFloats() { cudaFree(p); }
    DevFloats(const DevFloats &)             = delete;
    DevFloats & operator=(const DevFloats &) = delete;
    void up(const std::vector<float> & v) {
        cuda_ok(cudaMemcpyAsync(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice, s), "upload");
        cuda_ok(cudaStreamSynchronize(s), "upload");
    }
    std::vector<float> down() const {
        std::vector<float> v(n);
        cuda_ok(cudaMemcpyAsync(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost, s), "download");
        cuda_ok(cudaStreamSynchronize(s), "download");
        return v;
    }
};

// A group over `devices`, one non-blocking stream per rank given to its communicator once.
struct Ranks {
    std::vector<int>                           devices;
    std::vector<std::unique_ptr<Communicator>> comms;
    std::vector<cudaStream_t>                  streams;

    explicit Ranks(std::vector<int> devs) : devices(std::move(devs)) { adopt(make_nccl_group(devices)); }
    Ranks(std::vector<int> devs, std::vector<std::unique_ptr<Communicator>> group) : devices(std::move(devs)) { adopt(std::move(group)); }
    ~Ranks() {
        comms.clear();
        for (size_t r = 0; r < streams.size(); ++r) {
            cudaSetDevice(devices[r]);
            cudaStreamDestroy(streams[r]);
        }
    }

    // body(rank) on one thread per rank, its device current; each rank's failure ("": none).
    std::vector<std::string> run(const std::function<void(int)> & body) {
        std::vector<std::string> failure(comms.size());
        std::vector<std::thread> threads;
        for (size_t r = 0; r < comms.size(); ++r)
            threads.emplace_back([&, r] {
                try {
                    cuda_ok(cudaSetDevice(devices[r]), "cudaSetDevice");
                    body(int(r));
                } catch (const std::exception & e) {
                    failure[r] = e.what();
                }
            });
        for (std::thread & t : threads) t.join();
        return failure;
    }

private:
    void adopt(std::vector<std::unique_ptr<Communicator>> group) {
        comms = std::move(group);
        REQUIRE(comms.size() == devices.size());
        for (size_t r = 0; r < comms.size(); ++r) {
            REQUIRE(comms[r]->rank() == int(r));
            REQUIRE(comms[r]->size() == int(comms.size()));
            cudaStream_t s = nullptr;
            REQUIRE(cudaSetDevice(devices[r]) == cudaSuccess);
            REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
            streams.push_back(s);
            comms[r]->set_stream(s);
        }
    }
};

std::vector<int> first_devices(int n) {
    std::vector<int> d;
    for (int i = 0; i < n; ++i) d.push_back(i);
    return d;
}

// The group sizes this machine can run, out of 1, 2 and 4; says which it cannot.
std::vector<int> group_sizes() {
    const int        gpus = visible_gpus();
    std::vector<int> sizes;
    for (int s : {1, 2, 4}) {
        if (s <= gpus) sizes.push_back(s);
        else MESSAGE("a group of " << s << " GPUs is not checked: this machine has " << gpus);
    }
    return sizes;
}

void check_no_failure(const std::vector<std::string> & failure) {
    for (size_t r = 0; r < failure.size(); ++r) CHECK_MESSAGE(failure[r].empty(), "rank " << r << ": " << failure[r]);
}

// One round of every collective on rank `r` of `c` (size n per rank), out of place and in place;
// counts the values that differ from the host's expectation.
void every_collective(Communicator & c, cudaStream_t s, int round, size_t n, std::atomic<int> & wrong) {
    const int    r = c.rank(), size = c.size();
    const size_t all = n * size_t(size);
    // all-reduce, in place
    DevFloats          x(n, s);
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = value(round, r, i);
    x.up(h);
    c.all_reduce_sum(x.p, n);
    std::vector<float> got = x.down();
    for (size_t i = 0; i < n; ++i) {
        float want = 0.0f;
        for (int q = 0; q < size; ++q) want += value(round, q, i);
        if (got[i] != want) ++wrong;
    }
    // all-gather: apart, then in place (in = out + r n), then from a place inside `out` that is not
    // its own (the communicator copies it first)
    for (int variant = 0; variant < 3; ++variant) {
        DevFloats          in(n, s), out(all, s);
        std::vector<float> mine(n), init(all, -1.0f);
        for (size_t i = 0; i < n; ++i) mine[i] = value(round + variant, r, i) + 1.0f;
        const float * src = in.p;
        if (variant == 0) in.up(mine);
        else {
            const size_t at = variant == 1 ? size_t(r) * n : size_t((r + 1) % size) * n;
            std::copy(mine.begin(), mine.end(), init.begin() + std::ptrdiff_t(at));
            src = out.p + at;
        }
        out.up(init);
        c.all_gather(src, out.p, n);
        got = out.down();
        for (int q = 0; q < size; ++q)
            for (size_t i = 0; i < n; ++i)
                if (got[size_t(q) * n + i] != value(round + variant, q, i) + 1.0f) ++wrong;
    }
    // all-to-all: block p of rank q's input goes to rank p; apart, then in place
    for (int in_place = 0; in_place < 2; ++in_place) {
        DevFloats          in(all, s), out(all, s);
        std::vector<float> hin(all);
        for (int p = 0; p < size; ++p)
            for (size_t i = 0; i < n; ++i) hin[size_t(p) * n + i] = value(round, r * size + p, i);
        in.up(hin);
        c.all_to_all(in.p, in_place ? in.p : out.p, n);
        got = in_place ? in.down() : out.down();
        for (int q = 0; q < size; ++q)
            for (size_t i = 0; i < n; ++i)
                if (got[size_t(q) * n + i] != value(round, q * size + r, i)) ++wrong;
    }
}

}  // namespace

TEST_CASE("nccl: all-reduce, all-gather and all-to-all give every rank the host's expectation, exactly") {
    for (int size : group_sizes()) {
        CAPTURE(size);
        Ranks            ranks(first_devices(size));
        std::atomic<int> wrong{0};
        check_no_failure(ranks.run([&](int r) {
            int round = 0;
            for (size_t n : {size_t(1), size_t(7), size_t(1000), size_t(0), size_t(1) << 20 | 3})
                every_collective(*ranks.comms[size_t(r)], ranks.streams[size_t(r)], round++, n, wrong);
        }));
        CHECK(wrong.load() == 0);
    }
}

TEST_CASE("nccl: an all-reduce and an in-place all-to-all captured in a CUDA graph, replayed on new inputs") {
    for (int size : group_sizes()) {
        CAPTURE(size);
        Ranks            ranks(first_devices(size));
        std::atomic<int> wrong{0};
        check_no_failure(ranks.run([&](int r) {
            Communicator & c = *ranks.comms[size_t(r)];
            cudaStream_t   s = ranks.streams[size_t(r)];
            const size_t   n = 4099, all = n * size_t(size);
            DevFloats      x(n, s), y(all, s);
            // the first calls outside the capture: NCCL connects the peers at their first use
            every_collective(c, s, 0, 16, wrong);

            cudaGraph_t     graph = nullptr;
            cudaGraphExec_t exec  = nullptr;
            cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
            c.all_reduce_sum(x.p, n);
            c.all_to_all(y.p, y.p, n);
            cuda_ok(cudaStreamEndCapture(s, &graph), "cudaStreamEndCapture");
            cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
            for (int replay = 1; replay <= 2; ++replay) {
                std::vector<float> hx(n), hy(all);
                for (size_t i = 0; i < n; ++i) hx[i] = value(replay, r, i);
                for (int p = 0; p < size; ++p)
                    for (size_t i = 0; i < n; ++i) hy[size_t(p) * n + i] = value(replay, r * size + p, i);
                x.up(hx);
                y.up(hy);
                cuda_ok(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
                cuda_ok(cudaStreamSynchronize(s), "replay");
                const std::vector<float> gx = x.down(), gy = y.down();
                for (size_t i = 0; i < n; ++i) {
                    float want = 0.0f;
                    for (int q = 0; q < size; ++q) want += value(replay, q, i);
                    if (gx[i] != want) ++wrong;
                }
                for (int q = 0; q < size; ++q)
                    for (size_t i = 0; i < n; ++i)
                        if (gy[size_t(q) * n + i] != value(replay, q * size + r, i)) ++wrong;
            }
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
        }));
        CHECK(wrong.load() == 0);
    }
}

TEST_CASE("nccl: ranks of a group of processes (nccl_unique_id, make_nccl_rank), here one thread each") {
    for (int size : group_sizes()) {
        CAPTURE(size);
        const cuda::NcclUniqueId                   id = nccl_unique_id();
        std::vector<std::unique_ptr<Communicator>> joined(static_cast<size_t>(size));
        std::vector<std::string>                   failure(static_cast<size_t>(size));
        std::vector<std::thread>                   threads;
        for (int r = 0; r < size; ++r)  // every rank must join at once: ncclCommInitRank waits for all
            threads.emplace_back([&, r] {
                try {
                    joined[size_t(r)] = make_nccl_rank(id.data(), r, size, r);
                } catch (const std::exception & e) {
                    failure[size_t(r)] = e.what();
                }
            });
        for (std::thread & t : threads) t.join();
        check_no_failure(failure);
        for (const auto & c : joined) REQUIRE(c);
        Ranks            ranks(first_devices(size), std::move(joined));
        std::atomic<int> wrong{0};
        check_no_failure(ranks.run([&](int r) { every_collective(*ranks.comms[size_t(r)], ranks.streams[size_t(r)], 3, 5000, wrong); }));
        CHECK(wrong.load() == 0);
    }
}

TEST_CASE("nccl: abort ends the group: the later calls of every rank throw SPARK_ERR_ABORTED with the reason") {
    for (int size : group_sizes()) {
        if (size > 2) continue;
        CAPTURE(size);
        Ranks            ranks(first_devices(size));
        std::atomic<int> wrong{0};
        check_no_failure(ranks.run([&](int r) { every_collective(*ranks.comms[size_t(r)], ranks.streams[size_t(r)], 0, 64, wrong); }));
        CHECK(wrong.load() == 0);
        ranks.comms[0]->abort("rank 0 failed while loading");
        // No call below enqueues anything: each throws before it reaches NCCL.
        for (size_t r = 0; r < ranks.comms.size(); ++r) {
            CAPTURE(r);
            REQUIRE(cudaSetDevice(ranks.devices[r]) == cudaSuccess);
            for (int call = 0; call < 2; ++call) {
                try {
                    if (call == 0) ranks.comms[r]->all_reduce_sum(nullptr, 8);
                    else ranks.comms[r]->all_to_all(nullptr, nullptr, 8);
                    FAIL("no error after abort");
                } catch (const Error & e) {
                    CHECK(e.status() == SPARK_ERR_ABORTED);
                    CHECK(std::string(e.what()).find("rank 0 failed while loading") != std::string::npos);
                }
            }
        }
    }
}

TEST_CASE("nccl: the factories refuse what cannot be a group") {
    const int gpus = visible_gpus();
    const auto status_of = [](const std::function<void()> & f) {
        try {
            f();
        } catch (const Error & e) {
            return e.status();
        }
        return SPARK_OK;
    };
    CHECK(status_of([] { make_nccl_group({}); }) == SPARK_ERR_INVALID_ARGUMENT);
    CHECK(status_of([&] { make_nccl_group({gpus}); }) == SPARK_ERR_INVALID_ARGUMENT);
    CHECK(status_of([] { make_nccl_group({0, 0}); }) == SPARK_ERR_INVALID_ARGUMENT);
    const cuda::NcclUniqueId id = nccl_unique_id();
    CHECK(status_of([&] { make_nccl_rank(id.data(), 2, 2, 0); }) == SPARK_ERR_INVALID_ARGUMENT);
    CHECK(status_of([&] { make_nccl_rank(id.data(), 0, 1, -1); }) == SPARK_ERR_INVALID_ARGUMENT);
    CHECK(status_of([&] { make_nccl_rank(nullptr, 0, 1, 0); }) == SPARK_ERR_INVALID_ARGUMENT);
}

#else  // a build without NCCL: the factories exist and say so

TEST_CASE("nccl: a build without NCCL refuses a group with SPARK_ERR_UNSUPPORTED") {
    MESSAGE("this build has no NCCL (SPARK_NCCL=OFF or no nccl.h): the NCCL communicator is not checked");
    for (int call = 0; call < 3; ++call) {
        try {
            if (call == 0) make_nccl_group({0});
            else if (call == 1) nccl_unique_id();
            else make_nccl_rank(std::vector<uint8_t>(128).data(), 0, 1, 0);
            FAIL("no error");
        } catch (const Error & e) {
            CHECK(e.status() == SPARK_ERR_UNSUPPORTED);
            CHECK(std::string(e.what()).find("no NCCL") != std::string::npos);
        }
    }
}

#endif
