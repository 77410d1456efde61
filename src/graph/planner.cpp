#include "graph/planner.h"

#include "common/error.h"

#include <algorithm>
#include <limits>
#include <map>

namespace spark {

namespace {

// Best-fit free list over [0, end) with coalescing.
class ArenaAllocator {
public:
    explicit ArenaAllocator(size_t alignment) : align_(alignment) {}

    size_t alloc(size_t bytes) {
        bytes    = round_up(bytes);
        auto best = free_.end();
        for (auto it = free_.begin(); it != free_.end(); ++it)
            if (it->second >= bytes && (best == free_.end() || it->second < best->second)) best = it;
        if (best != free_.end()) {
            size_t off = best->first, size = best->second;
            free_.erase(best);
            if (size > bytes) free_[off + bytes] = size - bytes;
            return off;
        }
        // Grow the arena; absorb a free block that ends at the current end.
        size_t off = end_;
        if (!free_.empty()) {
            auto last = std::prev(free_.end());
            if (last->first + last->second == end_) {
                off = last->first;
                free_.erase(last);
            }
        }
        end_ = std::max(end_, off + bytes);
        return off;
    }

    void release(size_t off, size_t bytes) {
        bytes         = round_up(bytes);
        auto [it, ok] = free_.emplace(off, bytes);
        SPARK_ASSERT(ok);
        auto next = std::next(it);
        if (next != free_.end() && it->first + it->second == next->first) {
            it->second += next->second;
            free_.erase(next);
        }
        if (it != free_.begin()) {
            auto prev = std::prev(it);
            if (prev->first + prev->second == it->first) {
                prev->second += it->second;
                free_.erase(it);
            }
        }
    }

    size_t end() const { return end_; }

private:
    size_t round_up(size_t n) const { return (std::max<size_t>(n, 1) + align_ - 1) / align_ * align_; }
    size_t                   align_;
    size_t                   end_ = 0;
    std::map<size_t, size_t> free_;  // offset -> size
};

bool needs_arena(const Tensor & t) {
    if (t.flags & TENSOR_EXTERNAL) return false;
    if (t.op == Op::VIEW) return false;
    return t.op != Op::NONE || (t.flags & TENSOR_INPUT);
}

const Tensor * root_of(const Tensor * t) { return t->view_src ? t->view_src : t; }

}  // namespace

MemoryPlan plan_memory(const Graph & graph, size_t alignment, const std::vector<int> & launch_last) {
    const auto & tensors = graph.tensors();
    const auto & nodes   = graph.nodes();
    constexpr int kForever = std::numeric_limits<int>::max();

    std::vector<int> last_use(tensors.size(), -1);
    for (size_t i = 0; i < nodes.size(); ++i) {
        const Tensor * n = nodes[i];
        if (n->op == Op::VIEW) continue;  // a view is used where its users are
        const int until = i < launch_last.size() ? std::max(int(i), launch_last[i]) : int(i);
        for (const Tensor * s : n->src)
            if (s) last_use[root_of(s)->id] = std::max(last_use[root_of(s)->id], until);
    }
    // Uses through views: a node reading a view keeps the view's root alive (handled above via
    // root_of). Outputs (and the roots of output views) live to the end.
    for (const Tensor & t : tensors)
        if (t.flags & TENSOR_OUTPUT) last_use[root_of(&t)->id] = kForever;

    MemoryPlan plan;
    plan.offsets.assign(tensors.size(), MemoryPlan::kNoOffset);
    ArenaAllocator arena(alignment);

    std::vector<std::vector<int>> frees_after(nodes.size());
    auto schedule_free = [&](const Tensor & t) {
        int lu = last_use[t.id];
        if (lu == kForever) return;
        if (lu < 0) lu = 0;  // never read: free right away
        if (!frees_after.empty()) frees_after[size_t(lu)].push_back(t.id);
    };

    for (const Tensor & t : tensors)
        if (needs_arena(t) && t.op == Op::NONE) {
            plan.offsets[t.id] = arena.alloc(t.nbytes());
            plan.naive_bytes += t.nbytes();
            schedule_free(t);
        }
    for (size_t i = 0; i < nodes.size(); ++i) {
        const Tensor * n = nodes[i];
        if (needs_arena(*n)) {
            plan.offsets[n->id] = arena.alloc(n->nbytes());
            plan.naive_bytes += n->nbytes();
            int lu = last_use[n->id];
            if (lu != kForever) frees_after[size_t(std::max(lu, int(i)))].push_back(n->id);
        }
        for (int id : frees_after[i]) arena.release(plan.offsets[id], tensors[size_t(id)].nbytes());
    }
    plan.arena_bytes = arena.end();
    return plan;
}

void bind_memory(Graph & graph, const MemoryPlan & plan, void * arena) {
    graph.bump_generation();
    auto & tensors = graph.tensors();
    for (Tensor & t : tensors)
        if (plan.offsets[t.id] != MemoryPlan::kNoOffset) t.data = static_cast<char *>(arena) + plan.offsets[t.id];
    for (Tensor & t : tensors)
        if (t.view_src) {
            SPARK_ASSERT(t.view_src->data != nullptr);
            t.data = static_cast<char *>(t.view_src->data) + t.view_offs;
        }
}

}  // namespace spark
