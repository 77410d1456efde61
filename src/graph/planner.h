// Static memory planner: gives every intermediate tensor of a graph an offset in one arena. A
// buffer is reused as soon as the last node reading it (directly or through a view) has run, so the
// arena holds only what is live at once. Inputs live from the start, outputs to the end.
// Deterministic: the same graph always gets the same plan, which lets the CUDA backend replay a
// captured step with identical addresses.
#pragma once

#include "graph/graph.h"

#include <cstddef>
#include <vector>

namespace spark {

struct MemoryPlan {
    size_t              arena_bytes = 0;
    std::vector<size_t> offsets;      // per tensor id; kNoOffset for views / externals
    size_t              naive_bytes = 0;  // sum of all planned buffers (for reporting reuse)
    static constexpr size_t kNoOffset = ~size_t(0);
};

// launch_last (empty: every node is a launch of its own): per node, the position of the last node
// of the backend launch that computes it (< the node's own: alone), from Backend::launch_last_nodes.
// The inputs of a launch's nodes then stay live until the launch's last node, so no output of the
// launch is placed over an input any node of it reads.
MemoryPlan plan_memory(const Graph & graph, size_t alignment = 256, const std::vector<int> & launch_last = {});

// Sets data pointers of planned tensors (arena + offset) and of views (source + view offset).
void bind_memory(Graph & graph, const MemoryPlan & plan, void * arena);

}  // namespace spark
