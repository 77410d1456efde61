// The rendezvous of rendezvous.h over POSIX sockets. Every socket is non-blocking and every wait is
// a poll() bounded by the caller's deadline. Integers on the wire are 32-bit, big-endian.
#include "rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <thread>

namespace spark_cli {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic   = 0x53505256;  // "SPRV"
constexpr uint32_t kVersion = 1;
constexpr size_t   kHello   = 16;  // magic, version, size, rank
constexpr size_t   kReply   = 12;  // magic, status, length; then `length` bytes: the blob or the reason
constexpr uint32_t kMaxBlob = 1u << 20;
constexpr uint32_t kOk = 0, kRefused = 1;

std::string os_error(int err) { return std::generic_category().message(err); }

void put_u32(uint8_t * p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (24 - 8 * i));
}
uint32_t get_u32(const uint8_t * p) { return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]); }

std::string host_port(const std::string & host, int port) {
    return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string peer_name(const sockaddr_storage & a) {
    char host[NI_MAXHOST] = "?", serv[NI_MAXSERV] = "?";
    getnameinfo(reinterpret_cast<const sockaddr *>(&a), a.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in), host,
                sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV);
    return host_port(host, std::atoi(serv));
}

// Milliseconds to the deadline for poll(), rounded up; 0 once it has passed.
int ms_left(Clock::time_point deadline) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return left <= 0 ? 0 : int(std::min<int64_t>(left, 1 << 30));
}

std::string ms(std::chrono::milliseconds t) { return std::to_string(t.count()) + " ms"; }

// Waits for `events` on fd until the deadline; false when it passed first.
bool wait_for(int fd, short events, Clock::time_point deadline) {
    for (;;) {
        pollfd p{fd, events, 0};
        const int n = poll(&p, 1, ms_left(deadline));
        if (n > 0) return true;
        if (n == 0) return false;
        if (errno != EINTR) throw RendezvousError("rendezvous: poll failed: " + os_error(errno));
    }
}

class Socket {
public:
    explicit Socket(int fd = -1) : fd_(fd) {}
    ~Socket() { reset(); }
    Socket(Socket && o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
    Socket & operator=(Socket && o) noexcept {
        if (this != &o) {
            reset();
            fd_   = o.fd_;
            o.fd_ = -1;
        }
        return *this;
    }
    int  get() const { return fd_; }
    int  release() {
        const int fd = fd_;
        fd_          = -1;
        return fd;
    }
    void reset() {
        if (fd_ >= 0) close(fd_);
        fd_ = -1;
    }

private:
    int fd_;
};

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Sends all of `data` by the deadline; false when the peer has gone or the deadline passed.
bool send_all(int fd, const uint8_t * data, size_t n, Clock::time_point deadline) {
    while (n) {
        const ssize_t k = send(fd, data, n, MSG_NOSIGNAL);
        if (k > 0) {
            data += k;
            n -= size_t(k);
        } else if (k < 0 && errno == EINTR) {
            continue;
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!wait_for(fd, POLLOUT, deadline)) return false;
        } else {
            return false;
        }
    }
    return true;
}

enum class Got { All, Closed, Late };

// Reads exactly n bytes by the deadline.
Got recv_all(int fd, uint8_t * data, size_t n, Clock::time_point deadline, std::string & error) {
    while (n) {
        const ssize_t k = recv(fd, data, n, 0);
        if (k > 0) {
            data += k;
            n -= size_t(k);
        } else if (k == 0) {
            return Got::Closed;
        } else if (errno == EINTR) {
            continue;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (!wait_for(fd, POLLIN, deadline)) return Got::Late;
        } else {
            error = os_error(errno);
            return Got::Closed;
        }
    }
    return Got::All;
}

std::vector<uint8_t> reply(uint32_t status, const uint8_t * payload, size_t n) {
    std::vector<uint8_t> m(kReply + n);
    put_u32(m.data(), kMagic);
    put_u32(m.data() + 4, status);
    put_u32(m.data() + 8, uint32_t(n));
    if (n) std::memcpy(m.data() + kReply, payload, n);
    return m;
}

std::vector<uint8_t> refusal(const std::string & why) { return reply(kRefused, reinterpret_cast<const uint8_t *>(why.data()), why.size()); }

addrinfo * resolve(const std::string & host, int port, bool passive, int & gai_error) {
    addrinfo hints{};
    hints.ai_family   = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags    = passive ? AI_PASSIVE : 0;
    addrinfo * list   = nullptr;
    gai_error = getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, &list);
    return gai_error ? nullptr : list;
}

void check_group(int size, int port) {
    if (size < 1 || size > 65536) throw RendezvousError("rendezvous: a group has 1 to 65536 ranks (asked for " + std::to_string(size) + ")");
    if (port < 0 || port > 65535) throw RendezvousError("rendezvous: port " + std::to_string(port) + " is not a TCP port");
}

}  // namespace

Endpoint parse_endpoint(const std::string & addr) {
    Endpoint    e;
    std::string port;
    if (!addr.empty() && addr[0] == '[') {
        const size_t close = addr.find(']');
        if (close != std::string::npos && close + 1 < addr.size() && addr[close + 1] == ':') {
            e.host = addr.substr(1, close - 1);
            port   = addr.substr(close + 2);
        }
    } else if (const size_t colon = addr.rfind(':'); colon != std::string::npos && addr.find(':') == colon) {
        e.host = addr.substr(0, colon);
        port   = addr.substr(colon + 1);
    }
    const bool digits = !port.empty() && port.size() <= 5 && std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (e.host.empty() || !digits || std::stoi(port) > 65535)
        throw RendezvousError("rendezvous: \"" + addr + "\" is not host:port (or [ipv6]:port) with a port of 0 to 65535");
    e.port = std::stoi(port);
    return e;
}

RendezvousServer::RendezvousServer(const std::string & host, int port, int size) : size_(size) {
    check_group(size, port);
    where_        = host_port(host, port);
    int        ge = 0;
    addrinfo * list = resolve(host, port, true, ge);
    if (!list) throw RendezvousError("rendezvous: rank 0 cannot listen on " + where_ + ": " + gai_strerror(ge));
    std::string error = "no address";
    for (addrinfo * a = list; a && fd_ < 0; a = a->ai_next) {
        Socket s(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
        if (s.get() < 0) {
            error = os_error(errno);
            continue;
        }
        const int one = 1;
        setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // a restarted rank 0 reuses its port
        if (bind(s.get(), a->ai_addr, a->ai_addrlen) != 0 || listen(s.get(), 128) != 0) {
            error = os_error(errno);
            continue;
        }
        sockaddr_storage bound{};
        socklen_t        len = sizeof bound;
        getsockname(s.get(), reinterpret_cast<sockaddr *>(&bound), &len);
        port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6 &>(bound).sin6_port
                                                  : reinterpret_cast<sockaddr_in &>(bound).sin_port);
        set_nonblocking(s.get());
        fd_ = s.release();  // closed by the destructor, or by serve()
    }
    freeaddrinfo(list);
    if (fd_ < 0) throw RendezvousError("rendezvous: rank 0 cannot listen on " + where_ + ": " + error);
    where_ = host_port(host, port_);
}

RendezvousServer::~RendezvousServer() {
    if (fd_ >= 0) close(fd_);
}

void RendezvousServer::serve(const std::vector<uint8_t> & blob, std::chrono::milliseconds timeout,
                             const std::function<void(int, const std::string &)> & on_join) {
    if (fd_ < 0) throw RendezvousError("rendezvous: rank 0 at " + where_ + " has served its group already");
    if (blob.size() > kMaxBlob) throw RendezvousError("rendezvous: a blob of " + std::to_string(blob.size()) + " bytes is over 1 MiB");
    const Clock::time_point deadline = Clock::now() + timeout;
    Socket                  listener(fd_);  // one group per server: it stops listening when done
    fd_ = -1;

    struct Peer {
        Socket      s;
        std::string from;
        uint8_t     hello[kHello] = {};
        size_t      got  = 0;
        int         rank = -1;  // set once its hello is accepted
    };
    std::vector<Peer>        peers;
    std::vector<std::string> joined(static_cast<size_t>(size_));  // the address of each rank that joined
    joined[0] = "(rank 0)";
    int         missing = size_ - 1;
    int         ignored = 0;  // connections that were not spark ranks
    std::string ignored_from;
    std::string refused;  // why the group cannot form

    // Tells every rank that joined why the group cannot form, then throws.
    const auto give_up = [&](const std::string & why) {
        const std::vector<uint8_t> m    = refusal("the group cannot form: " + why);
        const Clock::time_point    soon = Clock::now() + std::chrono::milliseconds(200);  // small writes: never waits in practice
        for (Peer & p : peers)
            if (p.rank > 0) send_all(p.s.get(), m.data(), m.size(), soon);
        throw RendezvousError("rendezvous: " + why);
    };

    while (missing > 0 && refused.empty()) {
        if (ms_left(deadline) == 0) {
            std::string list;
            for (int r = 1; r < size_; ++r)
                if (joined[size_t(r)].empty()) list += (list.empty() ? "" : ", ") + std::to_string(r);
            std::string why = "rank 0 at " + where_ + " waited " + ms(timeout) + " for rank(s) " + list + " of " +
                              std::to_string(size_) + ", which did not join";
            if (ignored) why += " (ignored " + std::to_string(ignored) + " connection(s) that were not spark ranks, from " + ignored_from + ")";
            give_up(why);
        }
        std::vector<pollfd> fds{{listener.get(), POLLIN, 0}};
        for (const Peer & p : peers) fds.push_back({p.s.get(), POLLIN, 0});
        const int n = poll(fds.data(), nfds_t(fds.size()), ms_left(deadline));
        if (n < 0 && errno != EINTR) give_up("rank 0 at " + where_ + ": poll failed: " + os_error(errno));
        if (n <= 0) continue;

        for (size_t i = 1; i < fds.size(); ++i) {
            if (!fds[i].revents) continue;
            Peer & p = peers[i - 1];
            if (p.rank > 0) {
                // A rank that joined sends nothing more: readable means it has gone (its deadline).
                joined[size_t(p.rank)].clear();
                ++missing;
                p.s.reset();
                continue;
            }
            const ssize_t k = recv(p.s.get(), p.hello + p.got, kHello - p.got, 0);
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
            if (k <= 0) {  // left before saying who it is
                p.s.reset();
                continue;
            }
            p.got += size_t(k);
            if (p.got < kHello) continue;
            const uint32_t magic = get_u32(p.hello), version = get_u32(p.hello + 4);
            const uint32_t size = get_u32(p.hello + 8), rank = get_u32(p.hello + 12);
            std::string    why;
            if (magic != kMagic) {
                ++ignored;
                ignored_from = p.from;
                p.s.reset();
                continue;
            }
            if (version != kVersion)
                why = "rank " + std::to_string(rank) + " from " + p.from + " speaks rendezvous version " + std::to_string(version) +
                      ", rank 0 version " + std::to_string(kVersion);
            else if (size != uint32_t(size_))
                why = "rank " + std::to_string(rank) + " from " + p.from + " was started for a group of " + std::to_string(size) +
                      " ranks; rank 0 at " + where_ + " for " + std::to_string(size_);
            else if (rank < 1 || rank >= uint32_t(size_))
                why = "rank " + std::to_string(rank) + " from " + p.from + " is not one of ranks 1 to " + std::to_string(size_ - 1);
            else if (!joined[rank].empty())
                why = "rank " + std::to_string(rank) + " from " + p.from + " has joined already, from " + joined[rank];
            if (!why.empty()) {
                const std::vector<uint8_t> m = refusal(why);
                send_all(p.s.get(), m.data(), m.size(), Clock::now() + std::chrono::milliseconds(200));
                p.s.reset();
                refused = why;
                break;
            }
            p.rank       = int(rank);
            joined[rank] = p.from;
            --missing;
            if (on_join) on_join(p.rank, p.from);
        }
        peers.erase(std::remove_if(peers.begin(), peers.end(), [](const Peer & p) { return p.s.get() < 0; }), peers.end());

        if (fds[0].revents && refused.empty())
            for (;;) {
                sockaddr_storage a{};
                socklen_t        len = sizeof a;
                const int        fd  = accept4(listener.get(), reinterpret_cast<sockaddr *>(&a), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0) break;  // EAGAIN: no more for now (an error is the peer's: it tries again)
                peers.push_back(Peer{Socket(fd), peer_name(a)});
            }
    }
    if (!refused.empty()) give_up(refused);

    listener.reset();
    const std::vector<uint8_t> m = reply(kOk, blob.data(), blob.size());
    for (Peer & p : peers)
        if (p.rank > 0 && !send_all(p.s.get(), m.data(), m.size(), std::max(deadline, Clock::now() + std::chrono::seconds(1))))
            throw RendezvousError("rendezvous: rank " + std::to_string(p.rank) + " at " + p.from + " left before it got the id");
}

std::vector<uint8_t> rendezvous_receive(const std::string & host, int port, int rank, int size, std::chrono::milliseconds timeout,
                                        const std::function<void(const std::string &)> & on_retry) {
    check_group(size, port);
    if (rank < 1 || rank >= size)
        throw RendezvousError("rendezvous: rank " + std::to_string(rank) + " does not receive: ranks 1 to " + std::to_string(size - 1) + " do");
    const std::string       where    = host_port(host, port);
    const Clock::time_point deadline = Clock::now() + timeout;
    auto                    pause    = std::chrono::milliseconds(10);

    // Connect, retrying while nobody listens there (rank 0 may start later).
    Socket      s;
    std::string last;
    for (;;) {
        int        ge   = 0;
        addrinfo * list = resolve(host, port, false, ge);
        if (!list && ge != EAI_AGAIN) throw RendezvousError("rendezvous: cannot resolve " + where + ": " + gai_strerror(ge));
        if (!list) last = gai_strerror(ge);
        for (addrinfo * a = list; a && s.get() < 0; a = a->ai_next) {
            Socket c(socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
            if (c.get() < 0) {
                last = os_error(errno);
                continue;
            }
            if (connect(c.get(), a->ai_addr, a->ai_addrlen) != 0) {
                if (errno != EINPROGRESS) {
                    last = os_error(errno);
                    continue;
                }
                if (!wait_for(c.get(), POLLOUT, deadline)) {
                    last = "no answer to the connection";
                    continue;
                }
                int       err = 0;
                socklen_t len = sizeof err;
                getsockopt(c.get(), SOL_SOCKET, SO_ERROR, &err, &len);
                if (err) {
                    last = os_error(err);
                    continue;
                }
            }
            s = std::move(c);
        }
        if (list) freeaddrinfo(list);
        if (s.get() >= 0) break;
        if (ms_left(deadline) == 0)
            throw RendezvousError("rendezvous: rank " + std::to_string(rank) + " found no rank 0 listening at " + where + " within " + ms(timeout) +
                                  " (" + last + ")");
        if (on_retry) on_retry(last);
        std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(pause, std::chrono::milliseconds(ms_left(deadline))));
        pause = std::min(pause * 2, std::chrono::milliseconds(200));
    }

    uint8_t hello[kHello];
    put_u32(hello, kMagic);
    put_u32(hello + 4, kVersion);
    put_u32(hello + 8, uint32_t(size));
    put_u32(hello + 12, uint32_t(rank));
    if (!send_all(s.get(), hello, kHello, deadline))
        throw RendezvousError("rendezvous: rank " + std::to_string(rank) + " could not introduce itself to " + where);

    uint8_t     head[kReply];
    std::string error;
    const Got   got = recv_all(s.get(), head, kReply, deadline, error);
    if (got == Got::Late)
        throw RendezvousError("rendezvous: rank " + std::to_string(rank) + " had no answer from rank 0 at " + where + " within " + ms(timeout) +
                              " (rank 0 answers once all " + std::to_string(size) + " ranks have joined)");
    if (got == Got::Closed)
        throw RendezvousError("rendezvous: " + where + " closed the connection without an answer" + (error.empty() ? "" : " (" + error + ")") +
                              ": rank 0 gave up, or it is not a spark rank 0");
    if (get_u32(head) != kMagic) throw RendezvousError("rendezvous: the peer at " + where + " is not a spark rank 0 (wrong handshake)");
    const uint32_t status = get_u32(head + 4), n = get_u32(head + 8);
    if (n > kMaxBlob) throw RendezvousError("rendezvous: rank 0 at " + where + " announced " + std::to_string(n) + " bytes, over 1 MiB");
    std::vector<uint8_t> payload(n);
    if (n && recv_all(s.get(), payload.data(), n, deadline, error) != Got::All)
        throw RendezvousError("rendezvous: rank 0 at " + where + " sent a truncated answer");
    if (status != kOk)
        throw RendezvousError("rendezvous: rank 0 at " + where + " refused rank " + std::to_string(rank) + ": " +
                              std::string(payload.begin(), payload.end()));
    return payload;
}

std::vector<uint8_t> rendezvous(const std::string & addr, int rank, int size, const std::vector<uint8_t> & blob,
                                std::chrono::milliseconds timeout) {
    const Endpoint e = parse_endpoint(addr);
    if (rank != 0) return rendezvous_receive(e.host, e.port, rank, size, timeout);
    RendezvousServer server(e.host, e.port, size);
    server.serve(blob, timeout);
    return blob;
}

}  // namespace spark_cli
