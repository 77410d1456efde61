#include "runtime/model.h"

#include "common/checked.h"
#include "common/error.h"
#include "common/hash.h"
#include "common/log.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "runtime/device.h"
#include "runtime/model_source.h"
#include "runtime/models/arch.h"
#include "runtime/synthetic.h"
#include "text/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>

namespace spark {

using json = nlohmann::json;

Model::Model()  = default;
Model::~Model() = default;

void AttentionWeights::visit(const WeightVisitor & v) const {
    for (const QWeight * w : {&wq, &wk, &wv, &wo}) v(*w, WeightRole::Projection);
    v(q_norm), v(k_norm);
}

void LinearAttentionWeights::visit(const WeightVisitor & v) const {
    v(in_proj_qkvz, WeightRole::Projection);
    v(in_proj_ba, WeightRole::Auxiliary);
    v(out_proj, WeightRole::Projection);
    for (const Param * p : {&conv, &A_log, &dt_bias, &norm}) v(*p);
}

void MlpWeights::visit(const WeightVisitor & v, WeightRole role) const {
    for (const QWeight * w : {&gate, &up, &down}) v(*w, role);
}

void MoeWeights::visit(const WeightVisitor & v) const {
    v(router, WeightRole::Auxiliary);
    v(choice_bias);
    for (const auto * experts : {&gate, &up, &down}) {
        const size_t routed = experts->size() - (shared_slot ? 1 : 0);
        for (size_t e = 0; e < experts->size(); ++e) v((*experts)[e], e < routed ? WeightRole::Expert : WeightRole::Auxiliary);
    }
    shared.visit(v, WeightRole::Auxiliary);
    v(shared_gate, WeightRole::Auxiliary);
}

void LayerWeights::visit(const WeightVisitor & v) const {
    v(attn_norm), v(ffn_norm);
    attn.visit(v);
    linear_attn.visit(v);
    mlp.visit(v, WeightRole::Projection);
    moe.visit(v);
}

void Model::visit_weights(const WeightVisitor & v) const {
    v(tok_embd, WeightRole::Embedding);
    for (const LayerWeights & L : layers) L.visit(v);
    v(output_norm);
    // A tied lm_head is the embedding, read whole by the logits' matmul.
    v(output, WeightRole::Auxiliary);
}

uint64_t Model::fingerprint() const {
    std::call_once(fingerprint_once_, [this] {
        const HParams & h = hparams;
        Hash64          f;
        f.text(h.arch);
        for (int64_t v : {h.n_vocab, h.n_vocab_in, h.n_embd, h.n_layer, h.n_head, h.n_head_kv, h.head_dim, h.n_ff, h.n_rot, h.n_expert,
                          h.n_expert_used, h.n_ff_expert, h.n_ff_shexp, h.ssm_conv_kernel, h.ssm_n_k_heads, h.ssm_n_v_heads, h.ssm_k_dim,
                          h.ssm_v_dim})
            f.value(v);
        f.value(h.rms_eps).value(h.rope_theta);
        for (LayerKind k : h.layer_kinds) f.value(k);
        if (source)
            for (const io::TensorInfo & t : source->tensors()) {
                f.text(t.name).value(t.dtype).value(uint64_t(t.nbytes));
                for (int64_t d : t.shape) f.value(d);
                // Two fine-tunes of one architecture differ in their values: 64 bytes from the
                // start, middle and end of each tensor tell them apart at the cost of a few pages.
                const size_t n = std::min<size_t>(64, t.nbytes);
                if (t.data && n)
                    for (size_t at : {size_t(0), (t.nbytes - n) / 2, t.nbytes - n}) f.bytes(t.data + at, n);
            }
        fingerprint_ = f.digest();
    });
    return fingerprint_;
}

namespace {

const char * format_label(WeightFormat f) {
    switch (f) {
        case WeightFormat::F32: return "f32";
        case WeightFormat::F16: return "f16";
        case WeightFormat::BF16: return "bf16";
        case WeightFormat::NVFP4: return "nvfp4";
        case WeightFormat::INT4: return "int4";
        case WeightFormat::FP8: return "fp8";
    }
    return "?";
}

// The format of the layers' big matrices ("mixed" when they differ).
// The format of the layers' main projections and experts ("mixed" when they differ).
std::string dominant_format(const Model & m) {
    std::string f;
    m.visit_weights({[&](const QWeight & w, WeightRole r) {
                         if (r != WeightRole::Projection && r != WeightRole::Expert) return;
                         const std::string s = format_label(w.format);
                         f                   = f.empty() || f == s ? s : "mixed";
                     },
                     [](const Param &) {}});
    return f.empty() ? "none" : f;
}

void fill_info(Model & m, int64_t n_params) {
    const HParams &    hp = m.hparams;
    spark_model_info & i  = m.info;
    std::snprintf(i.architecture, sizeof(i.architecture), "%s", hp.arch.c_str());
    std::snprintf(i.weight_format, sizeof(i.weight_format), "%s", dominant_format(m).c_str());
    i.n_vocab                  = int32_t(hp.n_vocab);
    i.n_embd                   = int32_t(hp.n_embd);
    i.n_layer                  = int32_t(hp.n_layer);
    i.n_head                   = int32_t(hp.n_head);
    i.n_head_kv                = int32_t(hp.n_head_kv);
    i.head_dim                 = int32_t(hp.head_dim);
    i.n_ctx_train              = int32_t(hp.n_ctx_train);
    i.n_expert                 = int32_t(hp.n_expert);
    i.n_expert_used            = int32_t(hp.n_expert_used);
    i.n_layer_attention        = int32_t(hp.n_layer_of(LayerKind::Attention));
    i.n_layer_linear_attention = int32_t(hp.n_layer_of(LayerKind::LinearAttention));
    i.n_params                 = n_params;
    i.n_devices                = 1;  // a split model's rank 0 says otherwise (rank_group.cpp)
    i.split_mode               = SPARK_SPLIT_NONE;
    i.weight_bytes = i.weight_bytes_embedding + i.weight_bytes_attention + i.weight_bytes_ffn + i.weight_bytes_output;

    // One decode step reads every weight except the embedding table (one row) and the experts the
    // token was not routed to.
    uint64_t step = 0, experts = 0;
    m.visit_weights({[&](const QWeight & w, WeightRole r) {
                         const uint64_t b = qweight_bytes(w).total();
                         if (r == WeightRole::Embedding) step += b / uint64_t(std::max<int64_t>(hp.n_vocab, 1));
                         else if (r == WeightRole::Expert) experts += b;
                         else step += b;
                     },
                     [&](const Param & p) {
                         uint64_t n = 4;
                         for (int64_t d : p.ne) n *= uint64_t(d);
                         step += n;
                     }});
    // The experts of a layer have one shape, so k of n of them are k/n of their bytes.
    if (hp.n_expert > 0) step += experts * uint64_t(hp.n_expert_used) / uint64_t(hp.n_expert);
    i.decode_weight_bytes = step;
    const spark_status st = SPARK_ERR_INVALID_FORMAT;
    i.kv_bytes_per_token  = uint64_t(product_or_fail(st, "config.json: the KV cache per token",
                                                     {i.n_layer_attention, 2, hp.n_head_kv, hp.head_dim, int64_t(dtype_size(m.backend->caps().kv_type))}));
    i.recurrent_bytes     = uint64_t(product_or_fail(st, "config.json: the recurrent state",
                                                     {i.n_layer_linear_attention, 4, sum_or_fail(st, "config.json: the recurrent state", hp.conv_state_floats(), hp.ssm_state_floats())}));
}

}  // namespace

std::unique_ptr<Model> load_model(const std::string & path, const spark_model_params & params, std::shared_ptr<Backend> backend,
                                  const Shard & shard) {
    if (path.empty()) fail(SPARK_ERR_INVALID_ARGUMENT, "empty model path");
    if (is_synthetic_path(path)) return load_synthetic_model(path, params, fill_info, shard);
    using Clock   = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    auto       m  = std::make_unique<Model>();
    m->path       = path;

    // The backend starts (a CUDA context takes a few hundred milliseconds) while the checkpoint's
    // headers are read; it activates its device in every call, so any thread may then use it.
    spark_device_kind                     kind = SPARK_DEVICE_CPU;
    std::future<std::unique_ptr<Backend>> backend_start;
    if (!backend) backend_start = std::async(std::launch::async, [&params, &kind] { return make_backend(params, kind); });

    ModelSource src = open_model_source(path);
    m->source       = std::move(src.tensors);
    // A cold start: let the disk start on the first weights while the tensors are resolved. The
    // CUDA loader takes weights in address order, so the first are in the lowest mapping.
    if (const auto files = m->source->files(); !files.empty())
        (*std::min_element(files.begin(), files.end(), [](auto * a, auto * b) { return std::less<const uint8_t *>()(a->data(), b->data()); }))
            ->prefetch(0, size_t(256) << 20);
    const auto t_open = Clock::now();
    m->meta         = std::move(src.meta);
    json config;
    try {
        config = json::parse(src.config_json);
    } catch (const json::exception & e) {
        fail(SPARK_ERR_INVALID_FORMAT, "%s: not valid JSON: %s", src.config_origin.c_str(), e.what());
    }
    json hf_quant;
    if (!src.hf_quant_config_json.empty()) {
        try {
            hf_quant = json::parse(src.hf_quant_config_json);
        } catch (const json::exception & e) {
            fail(SPARK_ERR_INVALID_FORMAT, "%s: hf_quant_config.json is not valid JSON: %s", path.c_str(), e.what());
        }
    }
    m->hparams = parse_hparams(config, src.config_origin);
    if (shard.split()) {
        m->shard      = shard;
        m->shard.full = m->hparams;
        m->hparams    = shard_hparams(m->hparams, shard);
    }
    m->quant   = parse_quant_config(config, hf_quant, src.config_origin);
    m->layers.resize(size_t(m->hparams.n_layer));
    m->arch    = make_architecture(m->hparams.arch);

    // The tokenizer is read while the weights load (Qwen3's tokenizer.json: 7 MB of JSON).
    std::future<std::unique_ptr<spark_tokenizer>> tokenizer;
    if (params.load_tokenizer && !src.tokenizer_json.empty())
        tokenizer = std::async(std::launch::async, [&path, &src] {
            // A directory may keep its template in chat_template.jinja: from_directory reads it too.
            try {
                return std::make_unique<spark_tokenizer>(spark_tokenizer{
                    io::is_directory(path) ? Tokenizer::from_directory(path)
                                           : Tokenizer::from_json_strings(src.tokenizer_json, src.tokenizer_config_json, src.generation_config_json)});
            } catch (const Error & e) {
                throw Error(e.status(), path + ": " + e.what());  // its messages name the file within the model
            }
        });

    const auto t_wait = Clock::now();
    if (backend) {
        m->backend = std::move(backend);
    } else {
        m->backend = backend_start.get();
        m->device  = kind;
    }
    const auto t_backend = Clock::now();

    WeightResolver resolver(*m->source, m->quant, m->host_store);
    CheckpointLoader loader(*m, resolver, params);
    m->arch->load(*m, loader);
    const auto t_resolved = Clock::now();
    loader.finish();
    const auto t_weights = Clock::now();
    fill_info(*m, loader.n_params());

    m->meta["general.architecture"] = m->hparams.arch;
    m->meta["spark.weight_format"]  = m->info.weight_format;
    m->meta["spark.quantization"]   = m->quant.describe();
    m->meta["spark.backend"]        = m->backend->name();
    if (tokenizer.valid()) m->tokenizer = tokenizer.get();

    const auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
    const double weights_s = seconds(t_resolved, t_weights);
    // The rate only where bytes moved (the CPU backend uses the mapping in place).
    const std::string rate = weights_s >= 0.05 ? strfmt(" (%.1f GB/s)", double(m->info.weight_bytes) / 1e9 / weights_s) : std::string();
    if (const char * p = std::getenv("SPARK_PROFILE"); p && *p && *p != '0')
        log(SPARK_LOG_INFO, "spark: loaded %s in %.2f s: headers %.2f s, waiting for the backend %.2f s, resolving %.2f s, weights %.2f s%s, waiting for the tokenizer %.2f s\n",
            path.c_str(), seconds(t0, Clock::now()), seconds(t0, t_open), seconds(t_wait, t_backend), seconds(t_backend, t_resolved), weights_s,
            rate.c_str(), seconds(t_weights, Clock::now()));
    return m;
}

}  // namespace spark
