// Qwen3 dense end to end on the CPU against the Hugging Face goldens, the ways of feeding a prompt,
// several sequences in one batch, and the error contract for bad inputs.
//
// Tolerance: the CPU path computes in float32 like the reference (transformers in float32 from the
// same bf16 weights); only summation order differs, so the bound of 1e-3 on the absolute
// logit difference is generous (observed differences are ~1e-5).
#include "harness.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

using namespace test;
namespace fs = std::filesystem;

namespace {

constexpr float kTol = 1e-3f;

const std::string kQwen3 = model_dir("qwen3-bf16");

}  // namespace

TEST_CASE("qwen3-bf16: logits at every position and the greedy continuation match transformers") {
    Golden     g   = load_golden(kQwen3);
    ModelPtr   m   = load_model(kQwen3);
    ContextPtr ctx = new_context(m.get());
    auto logits = prompt_logits(ctx.get(), g.prompt, int32_t(g.n_vocab));
    CHECK(max_abs_diff(logits, g.logits) <= kTol);
    CHECK(greedy_continue(ctx.get(), int32_t(g.prompt.size()), int(g.greedy.size())) == g.greedy);
}

TEST_CASE("qwen3-bf16: one batch, token by token, and two decode calls give the same logits") {
    Golden   g = load_golden(kQwen3);
    ModelPtr m = load_model(kQwen3);
    const int32_t nv = int32_t(g.n_vocab);
    auto one_batch = prompt_logits(new_context(m.get()).get(), g.prompt, nv);
    auto by_token  = prompt_logits(new_context(m.get()).get(), g.prompt, nv, {1});
    auto split     = prompt_logits(new_context(m.get()).get(), g.prompt, nv, {g.prompt.size() / 2 + 1});
    auto uneven    = prompt_logits(new_context(m.get()).get(), g.prompt, nv, {5, 2, 7});
    for (auto * v : {&by_token, &split, &uneven}) {
        CHECK(max_abs_diff(*v, g.logits) <= kTol);
        // The same model on the same machine: only matmul blocking differs between batch shapes.
        CHECK(max_abs_diff(*v, one_batch) <= 1e-5f);
    }
}

TEST_CASE("qwen3-bf16: the internal step size (n_batch) does not change the result") {
    Golden   g = load_golden(kQwen3);
    ModelPtr m = load_model(kQwen3);
    auto small = prompt_logits(new_context(m.get(), 256, 1, 3).get(), g.prompt, int32_t(g.n_vocab));
    CHECK(max_abs_diff(small, g.logits) <= kTol);
}

TEST_CASE("qwen3-bf16: two sequences decoded in one batch match each decoded alone") {
    Golden   g  = load_golden(kQwen3);
    ModelPtr m  = load_model(kQwen3);
    const int32_t nv = int32_t(g.n_vocab);
    std::vector<int32_t> a = g.prompt;
    std::vector<int32_t> b(g.prompt.rbegin(), g.prompt.rend());
    b.resize(b.size() - 5);  // a different prompt of a different length

    auto alone_a = prompt_logits(new_context(m.get()).get(), a, nv);
    auto alone_b = prompt_logits(new_context(m.get()).get(), b, nv);

    ContextPtr ctx = new_context(m.get(), 256, 2);
    // Interleave the two prompts row by row in one batch.
    const int32_t n = int32_t(a.size() + b.size());
    spark_batch   batch = spark_batch_init(n, 1);
    std::vector<std::pair<int, size_t>> order;  // (seq, index)
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
        if (i < a.size()) order.push_back({0, i});
        if (i < b.size()) order.push_back({1, i});
    }
    for (int32_t r = 0; r < n; ++r) {
        auto [s, i]         = order[size_t(r)];
        batch.token[r]      = s == 0 ? a[i] : b[i];
        batch.pos[r]        = int32_t(i);
        batch.n_seq_id[r]   = 1;
        batch.seq_id[r][0]  = s;
        batch.logits[r]     = 1;
    }
    batch.n_tokens = n;
    REQUIRE(spark_decode(ctx.get(), &batch) == SPARK_OK);
    std::vector<float> together_a, together_b;
    for (int32_t r = 0; r < n; ++r) {
        const float * l = spark_get_logits_ith(ctx.get(), r);
        REQUIRE(l != nullptr);
        auto & dst = order[size_t(r)].first == 0 ? together_a : together_b;
        dst.insert(dst.end(), l, l + nv);
    }
    spark_batch_free(batch);
    CHECK(max_abs_diff(together_a, alone_a) <= 1e-5f);
    CHECK(max_abs_diff(together_b, alone_b) <= 1e-5f);
    CHECK(spark_memory_seq_length(ctx.get(), 0) == int32_t(a.size()));
    CHECK(spark_memory_seq_length(ctx.get(), 1) == int32_t(b.size()));

    // Removing sequence 1 and decoding it again reproduces it.
    REQUIRE(spark_memory_seq_rm(ctx.get(), 1, 0, -1) == SPARK_OK);
    std::vector<float> again;
    REQUIRE(decode_range(ctx.get(), b, 0, b.size(), 1, nv, again) == SPARK_OK);
    CHECK(max_abs_diff(again, alone_b) <= 1e-5f);

    // seq_cp: a copy of sequence 0 continues exactly like the original.
    REQUIRE(spark_memory_seq_cp(ctx.get(), 0, 1) == SPARK_OK);
    std::vector<float> cont0, cont1;
    std::vector<int32_t> next = {a.back(), a.front()};
    std::vector<int32_t> extended = a;
    extended.insert(extended.end(), next.begin(), next.end());
    REQUIRE(decode_range(ctx.get(), extended, a.size(), extended.size(), 0, nv, cont0) == SPARK_OK);
    REQUIRE(decode_range(ctx.get(), extended, a.size(), extended.size(), 1, nv, cont1) == SPARK_OK);
    CHECK(max_abs_diff(cont0, cont1) == 0.0f);
}

// ---- bad inputs: a documented status and a message, never a crash -------------------------------

namespace {

std::string read_file(const fs::path & p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const fs::path & p, const std::string & bytes) {
    std::ofstream out(p, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size()));
}

// The fixture's safetensors split into header JSON and data section.
struct Safetensors {
    nlohmann::json header;
    std::string    data;
    static Safetensors read(const fs::path & p) {
        std::string bytes = read_file(p);
        uint64_t    n     = 0;
        std::memcpy(&n, bytes.data(), 8);
        return {nlohmann::json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
    }
    std::string serialize() const {
        std::string h = header.dump();
        uint64_t    n = h.size();
        std::string out(8, '\0');
        std::memcpy(out.data(), &n, 8);
        return out + h + data;
    }
};

// A copy of the qwen3-bf16 fixture in a temp dir, with the given edits.
fs::path corrupted_copy(TempDir & dir, const std::function<void(Safetensors &, nlohmann::json &)> & edit) {
    Safetensors    st     = Safetensors::read(fs::path(kQwen3) / "model.safetensors");
    nlohmann::json config = nlohmann::json::parse(read_file(fs::path(kQwen3) / "config.json"));
    edit(st, config);
    write_file(dir.path / "model.safetensors", st.serialize());
    write_file(dir.path / "config.json", config.dump());
    return dir.path;
}

spark_status try_load(const std::string & path, std::string & message) {
    spark_model * m  = nullptr;
    spark_status  st = spark_model_load(path.c_str(), spark_model_default_params(), &m);
    message          = spark_last_error();
    if (m) spark_model_free(m);
    if (st != SPARK_OK) CHECK(m == nullptr);
    return st;
}

}  // namespace

TEST_CASE("bad model inputs give documented status codes and messages") {
    std::string msg;
    SUBCASE("missing directory") {
        CHECK(try_load("/nonexistent/spark/model", msg) == SPARK_ERR_IO);
        CHECK(msg.find("does not exist") != std::string::npos);
    }
    SUBCASE("directory without config.json") {
        TempDir d;
        CHECK(try_load(d.path.string(), msg) == SPARK_ERR_IO);
        CHECK(msg.find("config.json") != std::string::npos);
    }
    SUBCASE("truncated safetensors") {
        TempDir d;
        fs::copy_file(fs::path(kQwen3) / "config.json", d.path / "config.json");
        std::string bytes = read_file(fs::path(kQwen3) / "model.safetensors");
        for (size_t keep : {size_t(0), size_t(5), size_t(100), bytes.size() / 2, bytes.size() - 1}) {
            write_file(d.path / "model.safetensors", bytes.substr(0, keep));
            CAPTURE(keep);
            CHECK(try_load(d.path.string(), msg) == SPARK_ERR_INVALID_FORMAT);
            CHECK(!msg.empty());
        }
    }
    SUBCASE("header offsets pointing outside the file") {
        TempDir d;
        auto    p = corrupted_copy(d, [](Safetensors & st, nlohmann::json &) {
            auto & t = st.header["model.norm.weight"];
            t["data_offsets"] = {uint64_t(1) << 40, (uint64_t(1) << 40) + 256};
        });
        CHECK(try_load(p.string(), msg) == SPARK_ERR_INVALID_FORMAT);
        CHECK(msg.find("outside the file") != std::string::npos);
    }
    SUBCASE("unknown dtype") {
        TempDir d;
        auto    p = corrupted_copy(d, [](Safetensors & st, nlohmann::json &) { st.header["model.norm.weight"]["dtype"] = "Q4_K"; });
        CHECK(try_load(p.string(), msg) == SPARK_ERR_UNSUPPORTED);
        CHECK(msg.find("Q4_K") != std::string::npos);
    }
    SUBCASE("missing tensor") {
        TempDir d;
        auto    p = corrupted_copy(d, [](Safetensors & st, nlohmann::json &) {
            // Rename so the data section stays consistent.
            st.header["model.layers.1.mlp.up_proj.wieght"] = st.header["model.layers.1.mlp.up_proj.weight"];
            st.header.erase("model.layers.1.mlp.up_proj.weight");
        });
        CHECK(try_load(p.string(), msg) == SPARK_ERR_MISSING_TENSOR);
        CHECK(msg.find("model.layers.1.mlp.up_proj") != std::string::npos);
    }
    SUBCASE("shape mismatch with config.json") {
        TempDir d;
        auto    p = corrupted_copy(d, [](Safetensors &, nlohmann::json & config) { config["intermediate_size"] = 384; });
        CHECK(try_load(p.string(), msg) == SPARK_ERR_SHAPE_MISMATCH);
        CHECK(msg.find("gate_proj") != std::string::npos);
    }
    SUBCASE("corrupt config.json") {
        TempDir d;
        fs::copy_file(fs::path(kQwen3) / "model.safetensors", d.path / "model.safetensors");
        write_file(d.path / "config.json", "{\"model_type\": \"qwen3\", ");
        CHECK(try_load(d.path.string(), msg) == SPARK_ERR_INVALID_FORMAT);
    }
    SUBCASE("unknown architecture") {
        TempDir d;
        auto    p = corrupted_copy(d, [](Safetensors &, nlohmann::json & config) { config["model_type"] = "gpt2"; });
        CHECK(try_load(p.string(), msg) == SPARK_ERR_UNSUPPORTED);
        CHECK(msg.find("gpt2") != std::string::npos);
        // The message lists what spark runs.
        CHECK(msg.find("supported: qwen3, qwen3_moe, qwen3_next, minimax_m2") != std::string::npos);
    }
}

TEST_CASE("bad decode inputs: context overflow, invalid token, inconsistent batch") {
    Golden     g   = load_golden(kQwen3);
    ModelPtr   m   = load_model(kQwen3);
    ContextPtr ctx = new_context(m.get(), 16);  // smaller than the prompt
    std::vector<float> out;

    SUBCASE("context overflow leaves the memory untouched") {
        CHECK(decode_range(ctx.get(), g.prompt, 0, g.prompt.size(), 0, int32_t(g.n_vocab), out) == SPARK_ERR_CONTEXT_FULL);
        CHECK(std::string(spark_last_error()).find("context full") != std::string::npos);
        CHECK(spark_memory_seq_length(ctx.get(), 0) == 0);
        // What fits still works afterwards.
        CHECK(decode_range(ctx.get(), g.prompt, 0, 16, 0, int32_t(g.n_vocab), out) == SPARK_OK);
        CHECK(decode_range(ctx.get(), g.prompt, 16, 17, 0, int32_t(g.n_vocab), out) == SPARK_ERR_CONTEXT_FULL);
        CHECK(max_abs_diff(out, std::vector<float>(g.logits.begin(), g.logits.begin() + 16 * g.n_vocab)) <= kTol);
    }
    SUBCASE("invalid token id") {
        std::vector<int32_t> bad = {1, 2, int32_t(g.n_vocab), 3};
        CHECK(decode_range(ctx.get(), bad, 0, bad.size(), 0, int32_t(g.n_vocab), out) == SPARK_ERR_INVALID_TOKEN);
        bad[2] = -7;
        CHECK(decode_range(ctx.get(), bad, 0, bad.size(), 0, int32_t(g.n_vocab), out) == SPARK_ERR_INVALID_TOKEN);
        CHECK(spark_memory_seq_length(ctx.get(), 0) == 0);
    }
    SUBCASE("positions that do not continue the sequence, bad sequence ids") {
        spark_batch b  = spark_batch_init(2, 1);
        b.n_tokens     = 2;
        b.token[0]     = 1;
        b.token[1]     = 2;
        b.pos[0]       = 0;
        b.pos[1]       = 5;  // gap
        b.n_seq_id[0]  = b.n_seq_id[1] = 1;
        b.seq_id[0][0] = b.seq_id[1][0] = 0;
        CHECK(spark_decode(ctx.get(), &b) == SPARK_ERR_INVALID_BATCH);
        b.pos[1]       = 1;
        b.seq_id[1][0] = 3;  // n_seq_max is 1
        CHECK(spark_decode(ctx.get(), &b) == SPARK_ERR_INVALID_BATCH);
        b.seq_id[1][0] = 0;
        // A row belongs to exactly one sequence (spark.h): n_seq_id 0 or 2 is refused, nothing kept.
        for (const int32_t n : {0, 2}) {
            b.n_seq_id[1] = n;
            CHECK(spark_decode(ctx.get(), &b) == SPARK_ERR_INVALID_BATCH);
            CHECK(std::string(spark_last_error()).find("exactly one sequence") != std::string::npos);
            CHECK(spark_memory_seq_length(ctx.get(), 0) == 0);
        }
        b.n_seq_id[1] = 1;
        CHECK(spark_decode(ctx.get(), &b) == SPARK_OK);
        CHECK(std::string(spark_last_error()).empty());  // the most recent call's outcome (spark.h)
        spark_batch_free(b);
        CHECK(spark_decode(ctx.get(), nullptr) == SPARK_ERR_INVALID_ARGUMENT);
    }
}
