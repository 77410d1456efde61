// The C API glue: argument checks, exceptions -> status codes, handles -> C++ objects.
#include "common/error.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/model.h"
#include "runtime/rank_group.h"

#include <spark/spark.h>

#include <cstdlib>
#include <cstring>
#include <string>

using namespace spark;

namespace {

void require(bool cond, const char * what) {
    if (!cond) fail(SPARK_ERR_INVALID_ARGUMENT, "%s", what);
}

}  // namespace

extern "C" {

SPARK_API spark_status spark_init(void) { return SPARK_OK; }

SPARK_API spark_model_params spark_model_default_params(void) {
    spark_model_params p{};
    p.device         = SPARK_DEVICE_CPU;
    p.device_index   = 0;
    p.n_threads      = 0;
    p.load_tokenizer = true;
    p.n_devices      = 1;
    for (int32_t i = 0; i < 8; ++i) p.devices[i] = i;
    p.split_mode     = SPARK_SPLIT_TENSOR;
    return p;
}

SPARK_API spark_status spark_model_load(const char * path, spark_model_params params, spark_model ** out) {
    return api_guard([&] {
        require(path != nullptr && out != nullptr, "spark_model_load: path and out must not be NULL");
        auto m  = std::make_unique<spark_model>();
        m->impl = params.dist_size > 1   ? load_process_rank(path, params)
                  : params.n_devices > 1 ? load_split_model(path, params)
                                         : load_model(path, params);
        *out    = m.release();
    });
}

SPARK_API void spark_model_free(spark_model * model) { delete model; }

SPARK_API spark_status spark_dist_unique_id(uint8_t out[128]) {
    return api_guard([&] {
        require(out != nullptr, "spark_dist_unique_id: NULL argument");
        make_device_group_id(out);
    });
}

SPARK_API spark_status spark_model_get_info(const spark_model * model, spark_model_info * out) {
    return api_guard([&] {
        require(model && out, "spark_model_get_info: NULL argument");
        *out = model->impl->info;
    });
}

SPARK_API spark_status spark_model_measure_bandwidth(const spark_model * model, double * out) {
    return api_guard([&] {
        require(model && out, "spark_model_measure_bandwidth: NULL argument");
        double bw = model->impl->backend->copy_bandwidth();
        if (bw <= 0) fail(SPARK_ERR_UNSUPPORTED, "the %s backend cannot measure its bandwidth", model->impl->backend->name().c_str());
        *out = bw;
    });
}

SPARK_API int32_t spark_model_layer_type(const spark_model * model, int32_t il) {
    if (!model || il < 0 || il >= model->impl->hparams.n_layer) return -1;
    return model->impl->hparams.layer_kinds[size_t(il)] == LayerKind::Attention ? SPARK_LAYER_ATTENTION : SPARK_LAYER_LINEAR_ATTENTION;
}

SPARK_API const spark_tokenizer * spark_model_get_tokenizer(const spark_model * model) {
    return model ? model->impl->tokenizer.get() : nullptr;
}

SPARK_API const char * spark_model_meta(const spark_model * model, const char * key) {
    if (!model || !key) return nullptr;
    auto it = model->impl->meta.find(key);
    return it == model->impl->meta.end() ? nullptr : it->second.c_str();
}

SPARK_API spark_context_params spark_context_default_params(void) {
    spark_context_params p{};
    p.n_ctx       = 4096;
    p.n_batch     = 512;
    p.n_seq_max   = 1;
    p.n_threads   = 0;
    p.n_snapshots = 2;
    p.n_rollback  = 0;
    return p;
}

SPARK_API spark_status spark_context_init(spark_model * model, spark_context_params params, spark_context ** out) {
    return api_guard([&] {
        require(model != nullptr && out != nullptr, "spark_context_init: model and out must not be NULL");
        BackendLock lock(*model->impl->backend);
        auto c  = std::make_unique<spark_context>();
        c->impl  = std::make_unique<Context>(*model->impl, params);
        c->model = model;
        *out    = c.release();
    });
}

SPARK_API void spark_context_free(spark_context * ctx) {
    if (!ctx) return;
    BackendLock lock(*ctx->impl->model().backend);
    delete ctx;
}

SPARK_API int32_t spark_n_ctx(const spark_context * ctx) { return ctx ? ctx->impl->params().n_ctx : 0; }

SPARK_API const spark_model * spark_context_get_model(const spark_context * ctx) { return ctx ? ctx->model : nullptr; }

SPARK_API spark_batch spark_batch_init(int32_t n_tokens, int32_t n_seq_max) {
    spark_batch b{};
    if (n_tokens <= 0 || n_seq_max <= 0) return b;
    b.token    = static_cast<spark_token *>(std::calloc(size_t(n_tokens), sizeof(spark_token)));
    b.pos      = static_cast<spark_pos *>(std::calloc(size_t(n_tokens), sizeof(spark_pos)));
    b.n_seq_id = static_cast<int32_t *>(std::calloc(size_t(n_tokens), sizeof(int32_t)));
    // One extra NULL entry marks the end of seq_id for spark_batch_free (as llama.cpp does).
    b.seq_id   = static_cast<spark_seq_id **>(std::calloc(size_t(n_tokens) + 1, sizeof(spark_seq_id *)));
    b.logits   = static_cast<int8_t *>(std::calloc(size_t(n_tokens), sizeof(int8_t)));
    bool ok    = b.token && b.pos && b.n_seq_id && b.seq_id && b.logits;
    for (int32_t i = 0; ok && i < n_tokens; ++i) {
        b.seq_id[i] = static_cast<spark_seq_id *>(std::calloc(size_t(n_seq_max), sizeof(spark_seq_id)));
        ok          = b.seq_id[i] != nullptr;
    }
    if (!ok) {
        spark_batch_free(b);
        return spark_batch{};
    }
    return b;
}

SPARK_API void spark_batch_free(spark_batch b) {
    if (b.seq_id)
        for (int32_t i = 0; b.seq_id[i]; ++i) std::free(b.seq_id[i]);
    std::free(b.token);
    std::free(b.pos);
    std::free(b.n_seq_id);
    std::free(b.seq_id);
    std::free(b.logits);
}

SPARK_API spark_status spark_decode(spark_context * ctx, const spark_batch * batch) {
    return api_guard([&] {
        require(ctx != nullptr && batch != nullptr, "spark_decode: ctx and batch must not be NULL");
        BackendLock lock(*ctx->impl->model().backend);
        ctx->impl->decode(*batch);
    });
}

SPARK_API void spark_context_set_abort_callback(spark_context * ctx, spark_abort_callback callback, void * user_data) {
    if (ctx) ctx->impl->set_abort(callback, user_data);
}

SPARK_API const float * spark_get_logits(spark_context * ctx) {
    if (!ctx) return nullptr;
    BackendLock lock(*ctx->impl->model().backend);
    return ctx->impl->logits();
}

SPARK_API const float * spark_get_logits_ith(spark_context * ctx, int32_t i) {
    if (!ctx) return nullptr;
    BackendLock lock(*ctx->impl->model().backend);
    return ctx->impl->logits_ith(i);
}

SPARK_API int32_t spark_n_outputs(const spark_context * ctx) { return ctx ? ctx->impl->n_outputs() : 0; }

SPARK_API spark_status spark_set_hidden_outputs(spark_context * ctx, const int32_t * layers, int32_t n_layers) {
    return api_guard([&] {
        require(ctx != nullptr && n_layers >= 0 && (n_layers == 0 || layers != nullptr), "spark_set_hidden_outputs: bad argument");
        require(!ctx->impl->speculating, "spark_set_hidden_outputs: the context's speculative loop uses its hidden outputs (free it first)");
        BackendLock lock(*ctx->impl->model().backend);
        HiddenCapture c;
        c.layers.assign(layers, layers + n_layers);
        ctx->impl->set_capture(c);
    });
}

SPARK_API int32_t spark_n_hidden(const spark_context * ctx) { return ctx ? int32_t(ctx->impl->hidden_width()) : 0; }

SPARK_API const float * spark_get_hidden_ith(spark_context * ctx, int32_t i) {
    if (!ctx) return nullptr;
    BackendLock lock(*ctx->impl->model().backend);
    return ctx->impl->hidden_ith(i);
}

SPARK_API spark_token spark_get_argmax_ith(spark_context * ctx, int32_t i) {
    if (!ctx) return -1;
    BackendLock lock(*ctx->impl->model().backend);
    return ctx->impl->argmax_ith(i);
}

SPARK_API void spark_memory_clear(spark_context * ctx) {
    if (!ctx) return;
    BackendLock lock(*ctx->impl->model().backend);
    ctx->impl->each_rank([](Context & c) { c.memory().clear(); });
}

SPARK_API spark_status spark_memory_seq_rm(spark_context * ctx, spark_seq_id seq_id, spark_pos p0, spark_pos p1) {
    return api_guard([&] {
        require(ctx != nullptr, "spark_memory_seq_rm: NULL context");
        BackendLock lock(*ctx->impl->model().backend);
        ctx->impl->each_rank([&](Context & c) { c.memory().seq_rm(seq_id, p0, p1); });
    });
}

SPARK_API bool spark_memory_seq_can_rm(const spark_context * ctx, spark_seq_id seq_id, spark_pos p0, spark_pos p1) {
    return ctx && ctx->impl->memory().can_rm(seq_id, p0, p1);
}

SPARK_API spark_status spark_memory_seq_cp(spark_context * ctx, spark_seq_id src, spark_seq_id dst) {
    return api_guard([&] {
        require(ctx != nullptr, "spark_memory_seq_cp: NULL context");
        BackendLock lock(*ctx->impl->model().backend);
        ctx->impl->each_rank([&](Context & c) { c.memory().seq_cp(src, dst); });
    });
}

SPARK_API spark_pos spark_memory_seq_length(const spark_context * ctx, spark_seq_id seq_id) {
    if (!ctx || seq_id < 0 || seq_id >= ctx->impl->memory().n_seq_max()) return -1;
    return ctx->impl->memory().seq_length(seq_id);
}

SPARK_API spark_status spark_memory_seq_snapshot(spark_context * ctx, spark_seq_id seq_id, int32_t * out_snapshot) {
    return api_guard([&] {
        require(ctx != nullptr && out_snapshot != nullptr, "spark_memory_seq_snapshot: NULL argument");
        BackendLock lock(*ctx->impl->model().backend);
        // Every rank takes the same snapshots in the same order: the same ids.
        ctx->impl->each_rank([&](Context & c) { *out_snapshot = c.memory().snapshot(seq_id); });
    });
}

SPARK_API spark_status spark_memory_seq_restore(spark_context * ctx, spark_seq_id seq_id, int32_t snapshot) {
    return api_guard([&] {
        require(ctx != nullptr, "spark_memory_seq_restore: NULL context");
        BackendLock lock(*ctx->impl->model().backend);
        ctx->impl->each_rank([&](Context & c) { c.memory().restore(seq_id, snapshot); });
    });
}

SPARK_API void spark_memory_snapshot_free(spark_context * ctx, int32_t snapshot) {
    if (ctx) ctx->impl->each_rank([&](Context & c) { c.memory().snapshot_free(snapshot); });
}

SPARK_API spark_status spark_perf_context(const spark_context * ctx, spark_perf_context_data * out) {
    return api_guard([&] {
        require(ctx != nullptr && out != nullptr, "spark_perf_context: NULL argument");
        *out = ctx->impl->perf();
    });
}

SPARK_API void spark_perf_context_reset(spark_context * ctx) {
    if (ctx) ctx->impl->reset_perf();
}

SPARK_API spark_status spark_memory_get_info(const spark_context * ctx, spark_memory_info * out) {
    return api_guard([&] {
        require(ctx != nullptr && out != nullptr, "spark_memory_get_info: NULL argument");
        *out               = ctx->impl->memory().info();
        out->compute_bytes = ctx->impl->compute_bytes();
    });
}

}  // extern "C"
