// The tools' rendezvous of a group of processes on several hosts (docs/DISTRIBUTED.md, section 7):
// rank 0 listens on host:port and hands a small blob (the NCCL unique id's 128 bytes) to each of the
// other size - 1 ranks, which connect to it, retrying until their deadline since rank 0 may start
// later. POSIX sockets; every wait has a deadline.
//
// Handshake: a rank sends {magic, version, size, rank}; rank 0 answers only once every rank has
// joined, so that no rank starts NCCL for a group that cannot form: a rank that states another
// size, a rank number out of range or one that has joined already is refused, and with it the
// whole group (every rank that waits is told why). A connection that is not a spark rank (another
// program on the port) is closed and ignored.
//
// Rank 0 binds the host it is given: the address the others reach it by, or "0.0.0.0" / "::" for
// every interface (a host name may resolve to a loopback address on its own machine).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace spark_cli {

// What failed, where ("host:port") and what was missing.
class RendezvousError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

struct Endpoint {
    std::string host;
    int         port = 0;
};

// "host:port" or "[ipv6]:port" (port 0..65535); anything else throws RendezvousError.
Endpoint parse_endpoint(const std::string & addr);

// Rank 0's side. Listens from construction; port 0 takes an ephemeral port (port() tells which).
class RendezvousServer {
public:
    RendezvousServer(const std::string & host, int port, int size);
    ~RendezvousServer();
    RendezvousServer(const RendezvousServer &)             = delete;
    RendezvousServer & operator=(const RendezvousServer &) = delete;

    int port() const { return port_; }

    // Waits for ranks 1 .. size - 1, then sends each `blob` (at most 1 MiB) and stops listening.
    // Throws RendezvousError at the deadline (naming the ranks missing) or as soon as a rank is
    // refused; the ranks that joined are then told why. on_join(rank, peer address) reports each
    // rank as it joins (progress, for the tools' logs).
    void serve(const std::vector<uint8_t> & blob, std::chrono::milliseconds timeout,
               const std::function<void(int, const std::string &)> & on_join = {});

private:
    int         fd_   = -1;
    int         size_ = 0;
    int         port_ = 0;
    std::string where_;  // host:port, for messages
};

// Rank `rank` (1 .. size - 1) of `size`: connects to rank 0 at host:port and returns its blob.
// Throws RendezvousError at the deadline or when refused. on_retry(why) is called each time rank 0
// is not (yet) there and the connection is tried again.
std::vector<uint8_t> rendezvous_receive(const std::string & host, int port, int rank, int size, std::chrono::milliseconds timeout,
                                        const std::function<void(const std::string &)> & on_retry = {});

// For the tools: rank 0 serves `blob` on `addr` ("host:port"), the others receive it; every rank
// returns it.
std::vector<uint8_t> rendezvous(const std::string & addr, int rank, int size, const std::vector<uint8_t> & blob,
                                std::chrono::milliseconds timeout);

}  // namespace spark_cli
