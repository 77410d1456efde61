// The CUDA backend's WeightBatch (backends/backend.h): a model's weights sized into one arena
// (weight_arena.h) while the architecture loads, then streamed in by several threads at commit.
#pragma once

#include "backends/backend.h"
#include "backends/cuda/device_weight.h"

#include <functional>
#include <memory>
#include <vector>

namespace spark::cuda {

// `remember` turns a host weight and its device layout into the QWeight the kernels use (the
// backend keeps the layout); `device_memory` bounds the arena; `n_threads` (<= 0: the machine's
// cores, at most 8: more measured no faster) stream the bytes. `in_place` (non-null: the weights go
// in place, weight_placement.h): weights in the kernels' layout that lie in one of its mappings are
// used there, registered with the device, instead of copied.
std::unique_ptr<WeightBatch> make_weight_batch(int device, size_t device_memory, int n_threads, std::vector<std::unique_ptr<Buffer>> & storage,
                                               std::function<QWeight(const QWeight &, const DeviceWeight &)> remember,
                                               const HostReader * in_place = nullptr);

}  // namespace spark::cuda
