// The C API of the owned speculative loop (spark.h, "Speculative decoding").
#include "common/error.h"
#include "runtime/speculative/speculator.h"

using namespace spark;

extern "C" {

SPARK_API spark_spec_params spark_spec_default_params(void) {
    spark_spec_params p{};
    p.kind        = SPARK_SPEC_NGRAM;
    p.path        = nullptr;
    p.n_draft_max = 3;
    p.n_draft_min = 0;
    p.p_min       = 0.0f;
    p.ngram_min   = 1;
    p.ngram_max   = 4;
    p.sim_accept  = nullptr;
    p.sim_seed    = 1;
    return p;
}

SPARK_API spark_status spark_spec_init(spark_context * target, spark_spec_params params, spark_spec ** out) {
    return api_guard([&] {
        if (!target || !out) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_init: target and out must not be NULL");
        if (target->impl->model().shard.split())
            fail(SPARK_ERR_UNSUPPORTED, "spark_spec_init: speculative decoding of a model split over %d devices is not supported yet",
                 target->impl->model().shard.size);
        BackendLock lock(*target->impl->model().backend);
        auto s  = std::make_unique<spark_spec>();
        s->impl = std::make_unique<spec::Speculator>(*target->impl, params);
        *out    = s.release();
    });
}

SPARK_API spark_status spark_spec_begin(spark_spec * spec, spark_seq_id seq, const spark_token * prompt, int32_t n_prompt) {
    return api_guard([&] {
        if (!spec) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_begin: NULL spec");
        BackendLock lock(*spec->impl->target().model().backend);
        spec->impl->begin(seq, prompt, n_prompt);
    });
}

SPARK_API spark_status spark_spec_step(spark_spec * spec, int32_t n_seqs, const spark_seq_id * seqs, spark_sampler ** samplers,
                                       spark_token * out, int32_t capacity, int32_t * n_out) {
    return api_guard([&] {
        if (!spec) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_step: NULL spec");
        BackendLock lock(*spec->impl->target().model().backend);
        spec->impl->step(n_seqs, seqs, samplers, out, capacity, n_out);
    });
}

SPARK_API spark_status spark_spec_get_stats(const spark_spec * spec, spark_spec_stats * out) {
    return api_guard([&] {
        if (!spec || !out) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_get_stats: NULL argument");
        *out = spec->impl->stats();
    });
}

SPARK_API void spark_spec_reset_stats(spark_spec * spec) {
    if (spec) spec->impl->reset_stats();
}

SPARK_API void spark_spec_free(spark_spec * spec) {
    if (!spec) return;
    BackendLock lock(*spec->impl->target().model().backend);
    delete spec;
}

}  // extern "C"
