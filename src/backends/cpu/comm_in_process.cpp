// The in-process group (backends/comm.h): ranks are threads sharing one rendezvous. A collective is
// two barriers: every rank posts its buffers, then each computes its own result from the others'
// inputs into a buffer of its own; after the second barrier (nobody reads an input any more) each
// writes its result, so in-place calls are safe. Sums run in rank order on every rank.
#include "backends/comm.h"

#include "common/error.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>

namespace spark {

namespace {

enum class Kind { AllReduce, AllGather, AllToAll };

struct Rendezvous {
    explicit Rendezvous(int n) : size(n), posts(size_t(n)) {}

    struct Post {
        Kind          kind = Kind::AllReduce;
        size_t        n    = 0;
        const float * in   = nullptr;
    };

    // Every rank arrives before any leaves; throws once the group is broken.
    void barrier() {
        std::unique_lock<std::mutex> lock(mutex);
        check_open();
        const uint64_t g = generation;
        if (++arrived == size) {
            arrived = 0;
            ++generation;
            cv.notify_all();
            return;
        }
        cv.wait(lock, [&] { return generation != g || broken; });
        check_open();
    }
    void post(int rank, const Post & p) {
        std::lock_guard<std::mutex> lock(mutex);
        check_open();
        posts[size_t(rank)] = p;
    }
    void abort(const std::string & why) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!broken) reason = why;
        broken = true;
        cv.notify_all();
    }
    void check_open() const {
        if (broken) fail(SPARK_ERR_ABORTED, "the rank group was aborted: %s", reason.c_str());
    }

    const int               size;
    std::mutex              mutex;
    std::condition_variable cv;
    uint64_t                generation = 0;
    int                     arrived    = 0;
    bool                    broken     = false;
    std::string             reason;
    std::vector<Post>       posts;  // read between a collective's two barriers only
};

class InProcessRank final : public Communicator {
public:
    InProcessRank(std::shared_ptr<Rendezvous> rv, int rank) : rv_(std::move(rv)), rank_(rank) {}

    int rank() const override { return rank_; }
    int size() const override { return rv_->size; }

    void all_reduce_sum(float * data, size_t n) override {
        collective(Kind::AllReduce, data, n, [&](const std::vector<Rendezvous::Post> & posts) {
            scratch_.assign(n, 0.0f);
            for (const Rendezvous::Post & p : posts)
                for (size_t i = 0; i < n; ++i) scratch_[i] += p.in[i];
        });
        if (n) std::memcpy(data, scratch_.data(), n * sizeof(float));
    }
    void all_gather(const float * in, float * out, size_t n) override {
        collective(Kind::AllGather, in, n, [&](const std::vector<Rendezvous::Post> & posts) {
            scratch_.resize(posts.size() * n);
            for (size_t r = 0; r < posts.size(); ++r) std::copy(posts[r].in, posts[r].in + n, scratch_.data() + r * n);
        });
        if (n) std::memcpy(out, scratch_.data(), scratch_.size() * sizeof(float));
    }
    void all_to_all(const float * in, float * out, size_t n) override {
        collective(Kind::AllToAll, in, n, [&](const std::vector<Rendezvous::Post> & posts) {
            scratch_.resize(posts.size() * n);
            for (size_t p = 0; p < posts.size(); ++p)
                std::copy(posts[p].in + size_t(rank_) * n, posts[p].in + size_t(rank_ + 1) * n, scratch_.data() + p * n);
        });
        if (n) std::memcpy(out, scratch_.data(), scratch_.size() * sizeof(float));
    }
    void abort(const char * why) override { rv_->abort(why ? why : "(no reason given)"); }

private:
    // Posts, waits for every rank, checks that the calls agree, reads the inputs through `gather`
    // into scratch_, and waits until every rank has read before the caller writes its output.
    template <class Gather> void collective(Kind kind, const float * in, size_t n, Gather gather) {
        rv_->post(rank_, {kind, n, in});
        rv_->barrier();
        const std::vector<Rendezvous::Post> & posts = rv_->posts;
        for (const Rendezvous::Post & p : posts)
            if (p.kind != kind || p.n != n) {
                // Every rank sees the same posts, so every rank takes this branch.
                rv_->abort("the ranks' collectives disagree (another call or size)");
                std::lock_guard<std::mutex> lock(rv_->mutex);  // the reason may be another rank's, being written
                rv_->check_open();
            }
        gather(posts);
        rv_->barrier();
    }

    std::shared_ptr<Rendezvous> rv_;
    int                         rank_;
    std::vector<float>          scratch_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_in_process_group(int size) {
    if (size < 1 || size > 64) fail(SPARK_ERR_INVALID_ARGUMENT, "a rank group has 1 to 64 ranks (asked for %d)", size);
    auto                                       rv = std::make_shared<Rendezvous>(size);
    std::vector<std::unique_ptr<Communicator>> ranks;
    for (int r = 0; r < size; ++r) ranks.push_back(std::make_unique<InProcessRank>(rv, r));
    return ranks;
}

}  // namespace spark
