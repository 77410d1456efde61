// The tools' TCP rendezvous (tools/common/rendezvous.h), ranks as threads on the loopback, on
// ephemeral ports only (rank 0 binds port 0 and tells the others the port it got). Every wait ends
// on an event, never on a sleep: the long deadlines below are never reached when the code is right,
// and the short one (200 ms) is the point of its case.
#include "rendezvous.h"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace spark_cli;

namespace {

constexpr std::chrono::milliseconds kLong{30000};  // a case that reaches it has failed anyway

// 128 bytes like an NCCL unique id, zeros included.
std::vector<uint8_t> id_blob() {
    std::vector<uint8_t> b(128);
    for (size_t i = 0; i < b.size(); ++i) b[i] = uint8_t(i * 37 + 11);
    b[5] = b[77] = 0;
    return b;
}

// A loopback socket bound to an ephemeral port: listening or not (then connections are refused and
// the port stays reserved).
struct LoopbackSocket {
    int fd   = -1;
    int port = 0;
    explicit LoopbackSocket(bool listening) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        REQUIRE(fd >= 0);
        sockaddr_in a{};
        a.sin_family      = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0);
        if (listening) REQUIRE(listen(fd, 8) == 0);
        socklen_t len = sizeof a;
        REQUIRE(getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0);
        port = ntohs(a.sin_port);
    }
    ~LoopbackSocket() { close(fd); }
};

int connect_loopback(int port) {
    const int   fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family      = AF_INET;
    a.sin_port        = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0);
    return fd;
}

// The message of the RendezvousError that f throws ("" when it throws none).
std::string error_of(const std::function<void()> & f) {
    try {
        f();
    } catch (const RendezvousError & e) {
        return e.what();
    }
    return "";
}

bool has(const std::string & s, const std::string & part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("rendezvous: rank 0 hands its blob to every other rank, intact") {
    const std::vector<uint8_t> blob = id_blob();
    for (int size : {1, 2, 4}) {
        CAPTURE(size);
        RendezvousServer server("127.0.0.1", 0, size);
        REQUIRE(server.port() > 0);
        std::vector<std::vector<uint8_t>> got(static_cast<size_t>(size));
        std::vector<std::string>          error(static_cast<size_t>(size));
        std::vector<std::thread>          ranks;
        for (int r = 1; r < size; ++r)
            ranks.emplace_back([&, r] { error[size_t(r)] = error_of([&] { got[size_t(r)] = rendezvous_receive("127.0.0.1", server.port(), r, size, kLong); }); });
        std::vector<int> joined;  // on_join runs on this thread
        server.serve(blob, kLong, [&](int rank, const std::string & from) {
            CHECK(has(from, "127.0.0.1:"));
            joined.push_back(rank);
        });
        for (std::thread & t : ranks) t.join();
        CHECK(joined.size() == size_t(size - 1));
        for (int r = 1; r < size; ++r) {
            CHECK(error[size_t(r)] == "");
            CHECK(got[size_t(r)] == blob);
        }
        CHECK(has(error_of([&] { server.serve(blob, kLong); }), "served its group already"));
    }
}

TEST_CASE("rendezvous: ranks that start before rank 0 keep trying until it listens") {
    const std::vector<uint8_t> blob = id_blob();
    const int                  size = 4;
    auto                       reserved = std::make_unique<LoopbackSocket>(false);  // refuses until rank 0 takes the port
    const int                  port     = reserved->port;
    std::mutex                 mutex;
    std::condition_variable    cv;
    int                        refused_once = 0;  // ranks refused at least once
    std::vector<std::vector<uint8_t>> got(static_cast<size_t>(size));
    std::vector<std::string>          error(static_cast<size_t>(size));
    std::vector<std::thread>          ranks;
    for (int r = 1; r < size; ++r)
        ranks.emplace_back([&, r] {
            bool counted = false;
            error[size_t(r)] = error_of([&] {
                got[size_t(r)] = rendezvous_receive("127.0.0.1", port, r, size, kLong, [&](const std::string & why) {
                    std::lock_guard<std::mutex> lock(mutex);
                    if (!counted) ++refused_once, counted = true, cv.notify_all();
                });
            });
        });
    {
        std::unique_lock<std::mutex> lock(mutex);
        cv.wait(lock, [&] { return refused_once == size - 1; });
    }
    reserved.reset();
    RendezvousServer server("127.0.0.1", port, size);
    server.serve(blob, kLong);
    for (std::thread & t : ranks) t.join();
    for (int r = 1; r < size; ++r) {
        CHECK(error[size_t(r)] == "");
        CHECK(got[size_t(r)] == blob);
    }
}

TEST_CASE("rendezvous: a rank of another group size, or a rank twice, is refused, and the waiting ranks are told") {
    const std::vector<uint8_t> blob = id_blob();
    for (int wrong : {0, 1}) {  // 0: rank 2 says 4 ranks; 1: rank 1 joins twice
        CAPTURE(wrong);
        RendezvousServer server("127.0.0.1", 0, 3);
        std::string      first, second;
        std::thread      rank1([&] { first = error_of([&] { rendezvous_receive("127.0.0.1", server.port(), 1, 3, kLong); }); });
        std::thread      bad;
        // The bad rank connects once rank 1 has joined, so that rank 1 is among the ranks told.
        const std::string served = error_of([&] {
            server.serve(blob, kLong, [&](int rank, const std::string &) {
                if (rank == 1)
                    bad = std::thread([&] {
                        second = error_of([&] { rendezvous_receive("127.0.0.1", server.port(), wrong ? 1 : 2, wrong ? 3 : 4, kLong); });
                    });
            });
        });
        rank1.join();
        REQUIRE(bad.joinable());
        bad.join();
        if (wrong == 0) {
            CHECK(has(served, "group of 4 ranks"));
            CHECK(has(served, "for 3"));
            CHECK(has(second, "refused rank 2"));
            CHECK(has(second, "group of 4 ranks"));
        } else {
            CHECK(has(served, "rank 1 from 127.0.0.1:"));
            CHECK(has(served, "has joined already"));
            CHECK(has(second, "has joined already"));
        }
        CHECK(has(first, "refused rank 1: the group cannot form"));
    }
}

TEST_CASE("rendezvous: a connection that is not a spark rank is ignored; a rank 0 that is not spark is refused") {
    const std::vector<uint8_t> blob = id_blob();
    RendezvousServer           server("127.0.0.1", 0, 2);
    const int                  stray = connect_loopback(server.port());  // in the backlog before rank 1
    const char                 http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    REQUIRE(send(stray, http, sizeof http - 1, 0) == ssize_t(sizeof http - 1));
    std::vector<uint8_t> got;
    std::thread          rank1([&] { got = rendezvous_receive("127.0.0.1", server.port(), 1, 2, kLong); });
    server.serve(blob, kLong);
    rank1.join();
    CHECK(got == blob);
    char          c = 0;
    const ssize_t k = recv(stray, &c, 1, 0);  // closed without an answer: the end, or a reset (it sent more than a hello)
    CHECK((k == 0 || (k < 0 && errno == ECONNRESET)));
    close(stray);

    // a "rank 0" that answers something else
    LoopbackSocket other(true);
    std::thread    fake([&] {
        const int fd = accept(other.fd, nullptr, nullptr);
        char      hello[16];
        recv(fd, hello, sizeof hello, MSG_WAITALL);
        const char answer[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
        send(fd, answer, sizeof answer - 1, MSG_NOSIGNAL);
        close(fd);
    });
    const std::string e = error_of([&] { rendezvous_receive("127.0.0.1", other.port, 1, 2, kLong); });
    fake.join();
    CHECK(has(e, "is not a spark rank 0"));
}

TEST_CASE("rendezvous: deadlines name the address and what was missing") {
    LoopbackSocket    nobody(false);
    const std::string e = error_of([&] { rendezvous_receive("127.0.0.1", nobody.port, 1, 2, std::chrono::milliseconds(200)); });
    CHECK(has(e, "no rank 0 listening at 127.0.0.1:" + std::to_string(nobody.port)));
    CHECK(has(e, "within 200 ms"));
    CHECK(has(e, "refused"));  // the reason of the last try: connection refused

    // Rank 0 waits for ranks 2 and 3, which never come; rank 1, which has joined, is told at once.
    // (Rank 1 joins within rank 0's 500 ms unless this machine stalls a thread that long; then it
    // meets its own deadline of 1 s instead, and the case says so.)
    RendezvousServer server("127.0.0.1", 0, 4);
    std::string      rank1_error;
    std::thread      rank1([&] { rank1_error = error_of([&] { rendezvous_receive("127.0.0.1", server.port(), 1, 4, std::chrono::milliseconds(1000)); }); });
    bool              rank1_joined = false;
    const std::string served       = error_of([&] { server.serve(id_blob(), std::chrono::milliseconds(500), [&](int, const std::string &) { rank1_joined = true; }); });
    rank1.join();
    CHECK(has(served, "rank 0 at 127.0.0.1:" + std::to_string(server.port()) + " waited 500 ms for rank(s) 2, 3 of 4"));
    if (rank1_joined) CHECK(has(rank1_error, "the group cannot form: rank 0 at"));
    else MESSAGE("rank 1 did not join within 500 ms (a stalled thread): " << rank1_error);
}

TEST_CASE("rendezvous: addresses") {
    CHECK(parse_endpoint("node0:29500").host == "node0");
    CHECK(parse_endpoint("node0:29500").port == 29500);
    CHECK(parse_endpoint("10.0.0.1:0").port == 0);
    CHECK(parse_endpoint("[::1]:80").host == "::1");
    CHECK(parse_endpoint("[::1]:80").port == 80);
    for (const char * bad : {"node0", "node0:", ":80", "node0:http", "node0:65536", "::1:80", "[::1]80", "node0:123456"})
        CHECK_MESSAGE(has(error_of([&] { parse_endpoint(bad); }), "is not host:port"), bad);
    CHECK(has(error_of([] { rendezvous_receive("127.0.0.1", 1, 0, 2, kLong); }), "ranks 1 to 1 do"));
    CHECK(has(error_of([] { RendezvousServer("127.0.0.1", 0, 0); }), "1 to 65536 ranks"));
}
