#include "backends/cuda/profiler.h"

#include "backends/cuda/device_weight.h"
#include "common/log.h"
#include "quant/qweight.h"

#include <algorithm>
#include <cstdlib>

namespace spark::cuda {

std::unique_ptr<OpProfiler> OpProfiler::from_env() {
    const char * p = std::getenv("SPARK_PROFILE_OPS");
    return p && *p && *p != '0' ? std::make_unique<OpProfiler>() : nullptr;
}

void OpProfiler::collect(cudaStream_t stream) {
    cudaStreamSynchronize(stream);
    for (auto & p : pending_) {
        float ms = 0;
        cudaEventElapsedTime(&ms, p.begin, p.end);
        auto & e = totals_[p.key];
        e.first += double(ms) * 1000.0;
        e.second += 1;
        cudaEventDestroy(p.begin);
        cudaEventDestroy(p.end);
    }
    pending_.clear();
}

OpProfiler::~OpProfiler() {
    std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(totals_.begin(), totals_.end());
    std::sort(rows.begin(), rows.end(), [](auto & a, auto & b) { return a.second.first > b.second.first; });
    double total = 0;
    for (auto & r : rows) total += r.second.first;
    log(SPARK_LOG_INFO, "spark op profile (GPU time, us): total %.0f\n", total);
    for (size_t i = 0; i < rows.size() && i < 40; ++i)
        log(SPARK_LOG_INFO, "  %10.0f us %5.1f%% %8lld calls %8.2f us/call  %s\n", rows[i].second.first, 100.0 * rows[i].second.first / total,
            (long long) rows[i].second.second, rows[i].second.first / double(rows[i].second.second), rows[i].first.c_str());
}

OpTimer::OpTimer(OpProfiler * profiler, cudaStream_t stream, const Tensor & node, const char * label)
    : prof_(profiler), stream_(stream), node_(node), label_(label) {
    if (!prof_) return;
    cudaEventCreate(&begin_);
    cudaEventRecord(begin_, stream_);
}

OpTimer::~OpTimer() {
    if (!prof_) return;
    cudaEvent_t end;
    cudaEventCreate(&end);
    cudaEventRecord(end, stream_);
    prof_->add(launch_key(node_, label_), begin_, end);
}

std::string launch_key(const Tensor & node, const char * label) {
    std::string key = label ? label : op_name(node.op);
    key += " [" + std::to_string(node.ne[0]) + "," + std::to_string(node.ne[1]) + "," + std::to_string(node.ne[2]) + "]";
    // A fused launch is named by its first node (e.g. the SWIGLU): the weight is its source's (of
    // experts, the first held one: expert parallelism leaves the others empty).
    const auto      experts = [](const Tensor & t) { return first_held_expert(t.experts, t.n_experts); };
    const QWeight * w       = node.weight ? node.weight : node.experts ? experts(node) : nullptr;
    if (!w && label && node.src[0] && node.src[0]->weight) w = node.src[0]->weight;
    if (!w && label && node.src[0] && node.src[0]->experts) w = experts(*node.src[0]);
    if (w) key += std::string(" ") + weight_format_name(w->format) + " " + std::to_string(w->n) + "x" + std::to_string(w->k);
    return key;
}

}  // namespace spark::cuda
