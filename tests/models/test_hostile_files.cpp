// Hostile and broken model files (docs/RELIABILITY.md, "Model files" and "spark-convert"):
// config.json dimensions that are implausible or whose products overflow, floats out of range, an
// EAGLE3 head config, contexts that would allocate without bound, and spark-convert runs that would
// destroy their input or leave temporaries behind. Each must fail fast with a status and a message
// that names the field and the file.
#include "backends/backend.h"
#include "common/error.h"
#include "converter.h"
#include "harness.h"
#include "runtime/hparams.h"
#include "runtime/model.h"
#include "runtime/models/heads.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>

using namespace test;
namespace fs = std::filesystem;
using json   = nlohmann::json;

namespace {

std::string read_file(const fs::path & p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const fs::path & p, const std::string & bytes) {
    std::ofstream out(p, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size()));
}

// A model directory: the fixture's tensors (linked, not copied) and its config.json after `edit`.
fs::path edited_model(TempDir & dir, const char * fixture, const std::function<void(json &)> & edit) {
    const fs::path src = model_dir(fixture);
    for (const auto & e : fs::directory_iterator(src))
        if (e.path().extension() == ".safetensors") fs::create_symlink(e.path(), dir.path / e.path().filename());
    json config = json::parse(read_file(src / "config.json"));
    edit(config);
    write_file(dir.path / "config.json", config.dump());
    return dir.path;
}

struct Outcome {
    spark_status status;
    std::string  message;
    double       seconds;
};

template <typename Fn> Outcome timed(Fn && fn) {
    const auto t0 = std::chrono::steady_clock::now();
    Outcome    o{fn(), spark_last_error(), 0.0};
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return o;
}

Outcome try_load(const std::string & path) {
    return timed([&] {
        spark_model_params p = spark_model_default_params();
        p.n_threads          = 2;
        spark_model * m      = nullptr;
        spark_status  st     = spark_model_load(path.c_str(), p, &m);
        spark_model_free(m);
        return st;
    });
}

bool contains(const std::string & s, const std::string & part) { return s.find(part) != std::string::npos; }

// A hostile edit of a fixture's config.json and the field its error must name.
struct ConfigCase {
    const char *              fixture;
    const char *              field;
    std::function<void(json &)> edit;
};

const int64_t kBig = int64_t(1) << 40;

}  // namespace

TEST_CASE("hostile config.json: each implausible or overflowing value is refused, naming the field and the file") {
    const ConfigCase cases[] = {
        {"qwen3-bf16", "head_dim", [](json & c) { c["head_dim"] = kBig; }},
        {"qwen3-bf16", "num_attention_heads", [](json & c) { c["num_attention_heads"] = c["num_key_value_heads"] = kBig; }},
        {"qwen3-bf16", "num_key_value_heads", [](json & c) { c["num_attention_heads"] = 4; c["num_key_value_heads"] = -2; }},
        {"qwen3-bf16", "intermediate_size", [](json & c) { c["intermediate_size"] = int64_t(1) << 62; }},
        {"qwen3-bf16", "hidden_size", [](json & c) { c["hidden_size"] = int64_t(1) << 21; }},
        {"qwen3-bf16", "num_hidden_layers", [](json & c) { c["num_hidden_layers"] = 1 << 20; }},
        {"qwen3-bf16", "vocab_size", [](json & c) { c["vocab_size"] = kBig; }},
        {"qwen3-bf16", "vocab_size", [](json & c) { c["vocab_size"] = uint64_t(18446744073709551615ull); }},
        {"qwen3-bf16", "max_position_embeddings", [](json & c) { c["max_position_embeddings"] = kBig; }},
        {"qwen3-bf16", "partial_rotary_factor", [](json & c) { c["partial_rotary_factor"] = 1e300; }},
        {"qwen3-bf16", "partial_rotary_factor", [](json & c) { c["partial_rotary_factor"] = -1e300; }},
        {"qwen3-bf16", "rms_norm_eps", [](json & c) { c["rms_norm_eps"] = -1.0; }},
        {"qwen3-bf16", "rms_norm_eps", [](json & c) { c["rms_norm_eps"] = 0; }},
        {"qwen3-bf16", "rms_norm_eps", [](json & c) { c["rms_norm_eps"] = 1e300; }},
        {"qwen3-bf16", "rms_norm_eps", [](json & c) { c["rms_norm_eps"] = 1e-300; }},  // 0 as a float
        {"qwen3-bf16", "rope_theta", [](json & c) { c["rope_theta"] = 1e300; }},
        {"qwen3-bf16", "eos_token_id", [](json & c) { c["eos_token_id"] = (int64_t(1) << 32) + 5; }},
        {"qwen3-bf16", "eos_token_id", [](json & c) { c["eos_token_id"] = json::array({1, "two"}); }},
        {"qwen3-bf16", "bos_token_id", [](json & c) { c["bos_token_id"] = kBig; }},
        {"qwen3-bf16", "eos_token_id", [](json & c) { c["eos_token_id"] = c["vocab_size"]; }},  // one past the vocabulary
        {"qwen3_moe-bf16", "num_experts", [](json & c) { c.erase("num_local_experts"); c["num_experts"] = kBig; }},
        {"qwen3_moe-bf16", "num_local_experts", [](json & c) { c["num_local_experts"] = kBig; c["num_experts_per_tok"] = kBig; }},
        {"qwen3_moe-bf16", "moe_intermediate_size", [](json & c) { c["moe_intermediate_size"] = int64_t(1) << 50; }},
        {"qwen3_moe-bf16", "mlp_only_layers", [](json & c) { c["mlp_only_layers"] = json::array({int64_t(1) << 32}); }},
        {"qwen3_moe-bf16", "decoder_sparse_step", [](json & c) { c["decoder_sparse_step"] = 0; }},
        {"qwen3_next-bf16", "linear_key_head_dim", [](json & c) { c["linear_key_head_dim"] = kBig; }},
        {"qwen3_next-bf16", "linear_value_head_dim", [](json & c) { c["linear_value_head_dim"] = int64_t(1) << 31; }},
        {"qwen3_next-bf16", "linear_num_value_heads", [](json & c) { c["linear_num_value_heads"] = kBig; }},
        {"qwen3_next-bf16", "linear_num_key_heads", [](json & c) { c["linear_num_key_heads"] = c["linear_num_value_heads"] = kBig; }},
        {"qwen3_next-bf16", "linear_conv_kernel_dim", [](json & c) { c["linear_conv_kernel_dim"] = int64_t(1) << 62; }},
        {"qwen3_next-bf16", "shared_expert_intermediate_size", [](json & c) { c["shared_expert_intermediate_size"] = int64_t(1) << 60; }},
        {"qwen3_next-bf16", "num_nextn_predict_layers", [](json & c) { c["num_nextn_predict_layers"] = kBig; }},
        {"minimax_m2-bf16", "num_local_experts", [](json & c) { c["num_local_experts"] = kBig; }},
        {"minimax_m2-bf16", "intermediate_size", [](json & c) { c["intermediate_size"] = int64_t(1) << 50; }},
        {"minimax_m2-bf16", "rotary_dim", [](json & c) { c["rotary_dim"] = kBig; }},
        {"minimax_m2-bf16", "rotary_dim", [](json & c) { c["rotary_dim"] = 31; }},
        {"minimax_m2-bf16", "rotary_dim", [](json & c) { c["rotary_dim"] = 16; }},  // disagrees with partial_rotary_factor
        {"minimax_m2-bf16", "attn_type_list", [](json & c) { c["attn_type_list"] = "1,1"; }},
    };
    for (const ConfigCase & c : cases) {
        TempDir        d;
        const fs::path p = edited_model(d, c.fixture, c.edit);
        const Outcome  o = try_load(p.string());
        const std::string fixture = c.fixture, field = c.field;
        CAPTURE(fixture);
        CAPTURE(field);
        CAPTURE(o.message);
        CHECK(o.status == SPARK_ERR_INVALID_FORMAT);
        CHECK(contains(o.message, std::string("'") + c.field + "'"));
        CHECK(contains(o.message, (p / "config.json").string()));
        CHECK(o.seconds < 1.0);
    }
}

TEST_CASE("MiniMax-M2 variants spark does not run are refused as unsupported, naming what") {
    const std::pair<const char *, std::function<void(json &)>> cases[] = {
        {"scoring_func", [](json & c) { c["scoring_func"] = "softmax"; }},
        {"use_qk_norm", [](json & c) { c["use_qk_norm"] = false; }},
        {"qk_norm_type", [](json & c) { c["qk_norm_type"] = "per_head"; }},
        {"shared_intermediate_size", [](json & c) { c["shared_intermediate_size"] = 512; }},
        {"attn_type_list", [](json & c) { c["attn_type_list"] = json::array({0, 1}); }},  // MiniMax-01's lightning attention
    };
    for (const auto & c : cases) {  // (no structured bindings: clang 14 refuses them in CAPTURE)
        const std::string what = c.first;
        TempDir           d;
        const fs::path    p = edited_model(d, "minimax_m2-bf16", c.second);
        const Outcome     o = try_load(p.string());
        CAPTURE(what);
        CAPTURE(o.message);
        CHECK(o.status == SPARK_ERR_UNSUPPORTED);
        CHECK(contains(o.message, what));
    }
}

TEST_CASE("config.json bounds: the largest published shapes still parse") {
    // Qwen3-Next-80B-A3B and Qwen3-235B-A22B as published (only the fields spark reads).
    const json next = {{"model_type", "qwen3_next"}, {"vocab_size", 151936}, {"hidden_size", 2048}, {"intermediate_size", 5120},
                       {"num_hidden_layers", 48}, {"num_attention_heads", 16}, {"num_key_value_heads", 2}, {"head_dim", 256},
                       {"max_position_embeddings", 262144}, {"rms_norm_eps", 1e-6}, {"rope_theta", 10000000.0},
                       {"partial_rotary_factor", 0.25}, {"full_attention_interval", 4}, {"linear_conv_kernel_dim", 4},
                       {"linear_key_head_dim", 128}, {"linear_value_head_dim", 128}, {"linear_num_key_heads", 16},
                       {"linear_num_value_heads", 32}, {"num_experts", 512}, {"num_experts_per_tok", 10}, {"moe_intermediate_size", 512},
                       {"shared_expert_intermediate_size", 512}, {"num_nextn_predict_layers", 1}, {"eos_token_id", 151645}};
    const spark::HParams hp = spark::parse_hparams(next);
    CHECK(hp.conv_state_floats() == 3 * (2 * 16 * 128 + 32 * 128));
    CHECK(hp.ssm_state_floats() == 128 * 128 * 32);
    CHECK(hp.eos_token_ids == std::vector<int32_t>{151645});
    const json big = {{"model_type", "qwen3_moe"}, {"vocab_size", 151936}, {"hidden_size", 4096}, {"intermediate_size", 12288},
                      {"num_hidden_layers", 94}, {"num_attention_heads", 64}, {"num_key_value_heads", 4}, {"head_dim", 128},
                      {"max_position_embeddings", 40960}, {"num_experts", 128}, {"num_experts_per_tok", 8}, {"moe_intermediate_size", 1536}};
    CHECK(spark::parse_hparams(big).n_expert == 128);
    // A negative bos_token_id means "none", as some configs write it.
    json none = big;
    none["bos_token_id"] = -1;
    CHECK(spark::parse_hparams(none).bos_token_id == -1);
    // MiniMax-M2 as released: rotary_dim (no factor), num_local_experts, intermediate_size the
    // experts' width, theta 5e6.
    const json minimax = {{"model_type", "minimax_m2"}, {"vocab_size", 200064}, {"hidden_size", 3072}, {"intermediate_size", 1536},
                          {"num_hidden_layers", 62}, {"num_attention_heads", 48}, {"num_key_value_heads", 8}, {"head_dim", 128},
                          {"max_position_embeddings", 196608}, {"rope_theta", 5000000}, {"rotary_dim", 64}, {"num_local_experts", 256},
                          {"num_experts_per_tok", 8}, {"scoring_func", "sigmoid"}, {"use_qk_norm", true}, {"qk_norm_type", "per_layer"},
                          {"shared_intermediate_size", 0}, {"attn_type_list", json(std::vector<int>(62, 1))}, {"eos_token_id", 200020}};
    const spark::HParams m = spark::parse_hparams(minimax);
    CHECK(m.n_rot == 64);
    CHECK(m.n_expert == 256);
    CHECK(m.n_ff_expert == 1536);
    CHECK(m.n_ff == 0);
    CHECK(m.router_sigmoid);
    CHECK(m.norm_topk_prob);
    json no_theta = minimax;
    no_theta.erase("rope_theta");
    CHECK(spark::parse_hparams(no_theta).rope_theta == 5e6f);
}

TEST_CASE("hostile EAGLE3 head config.json is refused, naming the field and the file") {
    auto target = spark::load_model(model_dir("qwen3-eagle3-target-bf16"), spark_model_default_params());
    const std::pair<const char *, std::function<void(json &)>> cases[] = {
        {"rms_norm_eps", [](json & c) { c["rms_norm_eps"] = 1e300; }},
        {"rms_norm_eps", [](json & c) { c["rms_norm_eps"] = 1e-300; }},
        {"rope_theta", [](json & c) { c["rope_theta"] = 1e300; }},
        {"num_attention_heads", [](json & c) { c["num_attention_heads"] = c["num_key_value_heads"] = 1 << 24; }},
        {"head_dim", [](json & c) { c["head_dim"] = 1 << 24; }},
        {"intermediate_size", [](json & c) { c["intermediate_size"] = kBig; }},
    };
    for (const auto & [field, edit] : cases) {
        TempDir           d;
        const fs::path    p    = edited_model(d, "qwen3-eagle3-draft", edit);
        const std::string name = field;
        CAPTURE(name);
        const auto t0 = std::chrono::steady_clock::now();
        try {
            spark::load_eagle3_head(p.string(), *target, spark_model_default_params());
            FAIL("the head loaded");
        } catch (const spark::Error & e) {
            CAPTURE(e.what());
            CHECK(e.status() == SPARK_ERR_INVALID_FORMAT);
            CHECK(contains(e.what(), std::string("'") + field + "'"));
            CHECK(contains(e.what(), (p / "config.json").string()));
        }
        CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0);
    }
}

TEST_CASE("a model's hostile tokenizer.json fails the load, naming the model and the field") {
    TempDir        d;
    const fs::path p = edited_model(d, "qwen3-bf16", [](json &) {});
    write_file(p / "tokenizer.json", json{{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", (1 << 30) - 1}}}, {"merges", json::array()}}}}.dump());
    const Outcome o = try_load(p.string());
    CAPTURE(o.message);
    CHECK(o.status == SPARK_ERR_INVALID_FORMAT);
    CHECK(contains(o.message, p.string() + ": tokenizer.json: model.vocab[\"b\"]: id 1073741823 is outside [0, 1026)"));
    CHECK(o.seconds < 1.0);
}

namespace {

TEST_CASE("a synthetic model whose weights exceed the backend's memory is refused before any is made") {
    // MiniMax-M2 in FP8: 214 GiB of weights, more than any machine these tests run on has.
    const uint64_t host = uint64_t(::sysconf(_SC_PHYS_PAGES)) * uint64_t(::sysconf(_SC_PAGESIZE));
    if (host >= (uint64_t(230) << 30)) {
        MESSAGE("skipped: this host has " << (host >> 30) << " GiB");
        return;
    }
    const Outcome o = try_load("synthetic:minimax-m2:fp8");
    CAPTURE(o.message);
    CHECK(o.status == SPARK_ERR_OUT_OF_MEMORY);
    CHECK(contains(o.message, "the weights need 214."));
}

// The CPU backend, claiming a small memory so that the capacity check can be tested on any machine.
class SmallBackend final : public spark::Backend {
public:
    explicit SmallBackend(uint64_t capacity) : cpu_(spark::make_cpu_backend(2)), capacity_(capacity) {}
    std::string                    name() const override { return "small-cpu"; }
    spark::BackendCaps             caps() const override { return cpu_->caps(); }
    uint64_t                       memory_capacity() const override { return capacity_; }
    std::unique_ptr<spark::Buffer> alloc(size_t bytes) override { return cpu_->alloc(bytes); }
    void upload(void * d, const void * s, size_t n) override { cpu_->upload(d, s, n); }
    void download(void * d, const void * s, size_t n) override { cpu_->download(d, s, n); }
    void copy(void * d, const void * s, size_t n) override { cpu_->copy(d, s, n); }
    void fill_zero(void * d, size_t n) override { cpu_->fill_zero(d, n); }
    spark::QWeight prepare_weight(const spark::QWeight & w, std::vector<std::unique_ptr<spark::Buffer>> & st) override {
        return cpu_->prepare_weight(w, st);
    }
    spark::QWeight random_weight(const spark::RandomWeightSpec & s, std::vector<std::unique_ptr<spark::Buffer>> & st) override {
        return cpu_->random_weight(s, st);
    }
    std::unique_ptr<spark::Executor> make_executor(int n_threads) override { return cpu_->make_executor(n_threads); }
    void compute(spark::Graph & g, spark::Executor * ex) override { cpu_->compute(g, ex); }

private:
    std::unique_ptr<spark::Backend> cpu_;
    uint64_t                        capacity_;
};

Outcome try_context(spark_model * m, int32_t n_ctx, int32_t n_seq_max, int32_t n_rollback = 0) {
    return timed([&] {
        spark_context_params p = spark_context_default_params();
        p.n_ctx                = n_ctx;
        p.n_seq_max            = n_seq_max;
        p.n_rollback           = n_rollback;
        p.n_threads            = 2;
        spark_context * c      = nullptr;
        spark_status    st     = spark_context_init(m, p, &c);
        spark_context_free(c);
        return st;
    });
}

}  // namespace

TEST_CASE("absurd n_ctx / n_seq_max fail with a clear error instead of a runaway allocation") {
    ModelPtr m = load_model(model_dir("qwen3-bf16"));
    for (const auto & shape : {std::pair{INT32_MAX, 1}, std::pair{INT32_MAX, 4096}, std::pair{(1 << 24) + 1, 1},
                               std::pair{1 << 24, 4096}}) {
        const int32_t n_ctx = shape.first, n_seq = shape.second;  // not bindings: CAPTURE is a lambda (clang 14)
        CAPTURE(n_ctx);
        CAPTURE(n_seq);
        const Outcome o = try_context(m.get(), n_ctx, n_seq);
        CAPTURE(o.message);
        CHECK(o.status == SPARK_ERR_INVALID_ARGUMENT);
        CHECK(contains(o.message, "n_ctx"));
        CHECK(o.seconds < 1.0);
    }
    // What fits still works.
    CHECK(try_context(m.get(), 1 << 14, 64).status == SPARK_OK);
}

TEST_CASE("a KV cache or recurrent state larger than the backend's memory is refused before it is allocated") {
    spark_model_params p = spark_model_default_params();
    auto small = std::make_shared<SmallBackend>(uint64_t(64) << 20);
    for (const std::string fixture : {"qwen3-bf16", "qwen3_next-bf16"}) {
        CAPTURE(fixture);
        auto impl = spark::load_model(model_dir(fixture), p, small);
        spark_model model{std::move(impl)};
        // qwen3-bf16: 2 layers x K,V x 128 floats = 2 KiB per token: 1M tokens are 2 GiB.
        const Outcome o = try_context(&model, 1 << 20, 1);
        CAPTURE(o.message);
        CHECK(o.status == SPARK_ERR_OUT_OF_MEMORY);
        CHECK(contains(o.message, "n_ctx"));
        CHECK(contains(o.message, "small-cpu"));
        CHECK(o.seconds < 1.0);
        CHECK(try_context(&model, 1024, 1).status == SPARK_OK);
    }
    // The recurrent state alone: 4096 sequences x 65 ring entries of qwen3_next's state.
    auto impl = spark::load_model(model_dir("qwen3_next-bf16"), p, small);
    spark_model model{std::move(impl)};
    const Outcome o = try_context(&model, 1024, 4096, 64);
    CAPTURE(o.message);
    CHECK(o.status == SPARK_ERR_OUT_OF_MEMORY);
    CHECK(contains(o.message, "n_seq_max"));
}

// ---- spark-convert ------------------------------------------------------------------------------

namespace {

spark::convert::Options convert_options(const fs::path & in, const fs::path & out, bool overwrite) {
    spark::convert::Options o;
    o.input     = in.string();
    o.output    = out.string();
    o.overwrite = overwrite;
    return o;
}

// A private copy of a fixture directory (the tests may damage it).
fs::path copy_fixture(TempDir & d, const char * fixture) {
    const fs::path dst = d.path / fixture;
    fs::copy(model_dir(fixture), dst, fs::copy_options::recursive);
    return dst;
}

std::vector<std::string> temporaries_in(const fs::path & dir) {
    std::vector<std::string> out;
    for (const auto & e : fs::directory_iterator(dir))
        if (contains(e.path().filename().string(), ".tmp")) out.push_back(e.path().filename().string());
    return out;
}

}  // namespace

TEST_CASE("spark-convert refuses an output that is one of the input's files, however it is spelled") {
    TempDir        d;
    const fs::path in       = copy_fixture(d, "qwen3-bf16");
    const fs::path model    = in / "model.safetensors";
    const std::string bytes = read_file(model);
    fs::create_symlink(model, d.path / "link.safetensors");
    fs::create_hard_link(model, d.path / "hard.safetensors");
    const fs::path outputs[] = {
        model,
        in / "config.json",
        in / "." / "model.safetensors",
        in / ".." / "qwen3-bf16" / "model.safetensors",
        d.path / "link.safetensors",
        d.path / "hard.safetensors",
    };
    for (const fs::path & out : outputs) {
        CAPTURE(out);
        try {
            spark::convert::convert(convert_options(in, out, true));
            FAIL("converted onto its input");
        } catch (const spark::Error & e) {
            CHECK(e.status() == SPARK_ERR_INVALID_ARGUMENT);
            CHECK(contains(e.what(), "input"));
        }
        CHECK(read_file(model) == bytes);
    }
    // Anything else in the input directory is fine.
    CHECK_NOTHROW(spark::convert::convert(convert_options(in, in / "model.spark", false)));
    CHECK(read_file(model) == bytes);
}

TEST_CASE("spark-convert refuses a sharded input's shard and index as output") {
    TempDir        d;
    const fs::path in = d.path / "sharded";
    fs::create_directories(in);
    fs::copy_file(fs::path(model_dir("qwen3-bf16")) / "config.json", in / "config.json");
    fs::copy_file(fs::path(model_dir("qwen3-bf16")) / "model.safetensors", in / "model-00001-of-00001.safetensors");
    const auto st = spark::io::SafetensorsFile::open((in / "model-00001-of-00001.safetensors").string());
    json map      = json::object();
    for (const auto & t : st->tensors()) map[t.name] = "model-00001-of-00001.safetensors";
    write_file(in / "model.safetensors.index.json", json{{"weight_map", map}}.dump());
    for (const std::string name : {"model-00001-of-00001.safetensors", "model.safetensors.index.json"}) {
        CAPTURE(name);
        CHECK_THROWS_AS(spark::convert::convert(convert_options(in, in / name, true)), spark::Error);
    }
    CHECK(fs::file_size(in / "model-00001-of-00001.safetensors") == fs::file_size(fs::path(model_dir("qwen3-bf16")) / "model.safetensors"));
}

TEST_CASE("spark-convert: a killed conversion leaves no temporary that outlives the next run") {
    TempDir        d;
    const fs::path out = d.path / "m.spark";

    // A temporary of a process that is gone (as SIGKILL leaves with the named fallback) is removed
    // by the next conversion to the same output; one of a live process is not touched.
    const pid_t dead = fork();
    if (dead == 0) _exit(0);
    REQUIRE(dead > 0);
    waitpid(dead, nullptr, 0);
    const fs::path stale = d.path / ("m.spark.tmp-" + std::to_string(dead));
    const fs::path live  = d.path / ("m.spark.tmp-" + std::to_string(::getppid()));
    write_file(stale, "partial");
    write_file(live, "partial");
    // The pid of this process, from an earlier process that had it: stale too (and in the way of
    // this process's own temporary).
    const fs::path reused = d.path / ("m.spark.tmp-" + std::to_string(::getpid()));
    write_file(reused, "partial");
    spark::convert::convert(convert_options(model_dir("qwen3-bf16"), out, false));
    CHECK(!fs::exists(stale));
    CHECK(!fs::exists(reused));
    CHECK(fs::exists(live));
    fs::remove(live);
    fs::remove(out);

    // A dead pid whose temporary is locked, as its writer does: a writer of another PID namespace
    // sharing the directory. Left alone.
    write_file(stale, "partial");
    const int lock_fd = ::open(stale.c_str(), O_RDONLY);
    REQUIRE(lock_fd >= 0);
    REQUIRE(::flock(lock_fd, LOCK_EX) == 0);
    spark::convert::convert(convert_options(model_dir("qwen3-bf16"), out, false));
    CHECK(fs::exists(stale));
    ::close(lock_fd);
    fs::remove(stale);
    fs::remove(out);

    // SIGKILL in the middle of writing: whatever the kill leaves, the next run cleans up.
    const pid_t child = fork();
    if (child == 0) {
        spark::convert::Options o = convert_options(model_dir("qwen3-bf16"), out, false);
        o.progress                = [](size_t done, size_t, const std::string &) {
            if (done == 3) ::raise(SIGKILL);
        };
        try {
            spark::convert::convert(o);
        } catch (...) {
        }
        _exit(3);  // not reached
    }
    REQUIRE(child > 0);
    int status = 0;
    waitpid(child, &status, 0);
    REQUIRE(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);
    CHECK(!fs::exists(out));
    spark::convert::convert(convert_options(model_dir("qwen3-bf16"), out, false));
    CHECK(temporaries_in(d.path).empty());
    CHECK(fs::exists(out));
}
