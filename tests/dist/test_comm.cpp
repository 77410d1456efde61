// The in-process rank group (backends/comm.h), ranks as threads: every collective against a
// reference made from all ranks' inputs, exactly (sums in rank order, so every rank holds the same
// bits), in place and not, over many rounds of changing sizes; and a group that never waits for a
// rank that has gone (a disagreeing call, an abort).
#include "backends/comm.h"
#include "common/error.h"

#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

using namespace spark;

namespace {

// Runs body(rank) on one thread per rank; returns each rank's error status (SPARK_OK: none).
std::vector<spark_status> run_ranks(std::vector<std::unique_ptr<Communicator>> & group, const std::function<void(Communicator &)> & body) {
    std::vector<spark_status> status(group.size(), SPARK_OK);
    std::vector<std::thread>  threads;
    for (size_t r = 0; r < group.size(); ++r)
        threads.emplace_back([&, r] {
            try {
                body(*group[r]);
            } catch (const Error & e) {
                status[r] = e.status();
            }
        });
    for (std::thread & t : threads) t.join();
    return status;
}

// A value no two (round, rank, index) share in its low bits, with a fraction so that sums round.
float input(int round, int rank, size_t i) { return float(round * 131 + rank * 17 + int(i % 997)) * 0.3183099f - 40.0f; }

}  // namespace

TEST_CASE("rank group: all-reduce, all-gather and all-to-all give every rank the reference, exactly") {
    for (int size : {1, 2, 3, 4}) {
        CAPTURE(size);
        auto                     group = make_in_process_group(size);
        std::atomic<int>         wrong{0};
        const std::vector<spark_status> status = run_ranks(group, [&](Communicator & c) {
            for (int round = 0; round < 60; ++round) {
                const size_t n = size_t((round * 37) % 300);  // 0 included
                // all-reduce, in place
                std::vector<float> x(n);
                for (size_t i = 0; i < n; ++i) x[i] = input(round, c.rank(), i);
                c.all_reduce_sum(x.data(), n);
                for (size_t i = 0; i < n; ++i) {
                    float want = 0.0f;
                    for (int r = 0; r < size; ++r) want += input(round, r, i);
                    if (std::memcmp(&want, &x[i], sizeof want) != 0) ++wrong;
                }
                // all-gather, the input inside the output (in place)
                std::vector<float> g(n * size_t(size));
                for (size_t i = 0; i < n; ++i) g[size_t(c.rank()) * n + i] = input(round, c.rank(), i) + 1.0f;
                c.all_gather(g.data() + size_t(c.rank()) * n, g.data(), n);
                for (int r = 0; r < size; ++r)
                    for (size_t i = 0; i < n; ++i)
                        if (g[size_t(r) * n + i] != input(round, r, i) + 1.0f) ++wrong;
                // all-to-all: block p of rank r's input goes to rank p
                std::vector<float> in(n * size_t(size)), out(n * size_t(size));
                for (int p = 0; p < size; ++p)
                    for (size_t i = 0; i < n; ++i) in[size_t(p) * n + i] = input(round, c.rank() * 64 + p, i);
                c.all_to_all(in.data(), (round % 2 ? in : out).data(), n);  // odd rounds in place
                const std::vector<float> & got = round % 2 ? in : out;
                for (int r = 0; r < size; ++r)
                    for (size_t i = 0; i < n; ++i)
                        if (got[size_t(r) * n + i] != input(round, r * 64 + c.rank(), i)) ++wrong;
            }
        });
        for (spark_status s : status) CHECK(s == SPARK_OK);
        CHECK(wrong.load() == 0);
    }
}

TEST_CASE("rank group: calls that disagree end the group on every rank instead of hanging") {
    auto group = make_in_process_group(3);
    const std::vector<spark_status> status = run_ranks(group, [&](Communicator & c) {
        std::vector<float> x(8, 1.0f);
        c.all_reduce_sum(x.data(), c.rank() == 2 ? 7 : 8);  // rank 2's size differs
    });
    for (spark_status s : status) CHECK(s == SPARK_ERR_ABORTED);
    // and every later call fails at once
    const std::vector<spark_status> later = run_ranks(group, [&](Communicator & c) {
        float v = 1.0f;
        c.all_reduce_sum(&v, 1);
    });
    for (spark_status s : later) CHECK(s == SPARK_ERR_ABORTED);

    auto mixed = make_in_process_group(2);  // another collective on one rank
    const std::vector<spark_status> st2 = run_ranks(mixed, [&](Communicator & c) {
        std::vector<float> x(4, 1.0f), y(8);
        if (c.rank() == 0) c.all_reduce_sum(x.data(), 4);
        else c.all_gather(x.data(), y.data(), 4);
    });
    for (spark_status s : st2) CHECK(s == SPARK_ERR_ABORTED);
}

TEST_CASE("rank group: a rank that aborts releases the others, whenever they arrive") {
    for (int trial = 0; trial < 20; ++trial) {
        auto group = make_in_process_group(4);
        const std::vector<spark_status> status = run_ranks(group, [&](Communicator & c) {
            if (c.rank() == trial % 4) {
                c.abort("rank failed while loading");
                return;
            }
            float v = 1.0f;
            for (int i = 0; i < 3; ++i) c.all_reduce_sum(&v, 1);
        });
        for (int r = 0; r < 4; ++r) CHECK(status[size_t(r)] == (r == trial % 4 ? SPARK_OK : SPARK_ERR_ABORTED));
    }
    try {
        auto group = make_in_process_group(2);
        group[0]->abort("the reason");
        float v = 0.0f;
        group[1]->all_reduce_sum(&v, 1);
        FAIL("no error");
    } catch (const Error & e) {
        CHECK(std::string(e.what()).find("the reason") != std::string::npos);
    }
}

TEST_CASE("rank group: sizes outside 1..64 are refused") {
    for (int bad : {0, -1, 65}) {
        try {
            make_in_process_group(bad);
            FAIL("no error for " << bad);
        } catch (const Error & e) {
            CHECK(e.status() == SPARK_ERR_INVALID_ARGUMENT);
        }
    }
}
