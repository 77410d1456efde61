// The speculative decoding loop owned by the library (spark_spec_*): a draft source proposes, the
// target verifies all drafts of all stepped sequences in one step, the acceptance rule keeps a
// prefix (greedy: token identity; sampling: rejection sampling, so the output is distributed as
// the target's), and the rejected rows are cut from every memory without recompute.
#pragma once

#include "runtime/speculative/draft_source.h"

#include <spark/spark.h>

#include <memory>
#include <random>
#include <vector>

namespace spark::spec {

class Speculator {
public:
    Speculator(Context & target, const spark_spec_params & params);
    ~Speculator();  // the target's steps stop capturing hidden states

    // spark_spec_begin / spark_spec_step (spark.h has the contracts).
    void begin(int32_t seq, const int32_t * prompt, int32_t n);
    void step(int32_t n_seqs, const int32_t * seqs, spark_sampler ** samplers, int32_t * out, int32_t capacity, int32_t * n_out);

    const spark_spec_stats & stats() const { return stats_; }
    void                     reset_stats() { stats_ = spark_spec_stats{}; }
    Context &                target() { return target_; }

private:
    bool is_eog(int32_t token) const;
    void check_seq(int32_t seq) const;

    Context &                    target_;
    spark_spec_params            params_;
    std::unique_ptr<DraftSource> source_;
    std::vector<SeqState>        seqs_;
    spark_spec_stats             stats_{};
    std::vector<float>           sim_accept_;  // benchmarks: acceptance by chance (spark_spec_params.sim_accept)
    std::mt19937                 sim_rng_;
};

}  // namespace spark::spec

struct spark_spec {
    std::unique_ptr<spark::spec::Speculator> impl;
};
