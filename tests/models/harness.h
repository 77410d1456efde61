// Shared helpers of the model tests: goldens, running prompts through the C API in several ways.
#pragma once

#include "io/safetensors.h"

#include <spark/spark.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace test {

inline std::string data_dir() { return SPARK_TEST_DATA; }

// A fresh directory under $TMPDIR (unique across processes: ctest runs tests in parallel), removed
// with everything in it.
struct TempDir {
    std::filesystem::path path;
    TempDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "spark-test-XXXXXX").string();
        if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
        path = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    TempDir(const TempDir &)             = delete;
    TempDir & operator=(const TempDir &) = delete;
};
inline std::string model_dir(const std::string & name) { return data_dir() + "/models/" + name; }

// Every fixture with a transformers golden (tests/data/models/README.md), each architecture in
// each format: the golden tests (CPU and GPU) and the speculative-decoding tests run them all.
inline constexpr const char * kGoldenFixtures[] = {
    "qwen3-bf16", "qwen3-nvfp4-modelopt", "qwen3-nvfp4-ct", "qwen3-int4-autoround", "qwen3-int4-autoround-asym",
    "qwen3-fp8-block", "qwen3-fp8-ct-channel",
    "qwen3_moe-bf16", "qwen3_moe-nvfp4-modelopt", "qwen3_moe-nvfp4-ct", "qwen3_moe-int4-autoround",
    "qwen3_moe-int4-autoround-asym", "qwen3_moe-fp8-block", "qwen3_moe-fp8-ct-channel",
    "qwen3_next-bf16", "qwen3_next-nvfp4-modelopt", "qwen3_next-int4-autoround", "qwen3_next-fp8-block",
    "minimax_m2-bf16", "minimax_m2-fp8-block", "minimax_m2-int4-autoround", "minimax_m2-nvfp4-modelopt",
};

struct Golden {
    std::vector<int32_t> prompt;
    std::vector<float>   logits;  // [T][n_vocab]
    std::vector<int32_t> greedy;
    int64_t              n_vocab = 0;
};

template <typename T> std::vector<T> read_tensor(const spark::io::SafetensorsFile & f, const std::string & name) {
    for (const auto & t : f.tensors())
        if (t.name == name) {
            std::vector<T> v(t.nbytes / sizeof(T));
            std::memcpy(v.data(), t.data, t.nbytes);
            return v;
        }
    return {};
}

inline Golden load_golden(const std::string & dir, const char * file = "golden.safetensors") {
    auto   f = spark::io::SafetensorsFile::open(dir + "/" + file);
    Golden g;
    g.prompt = read_tensor<int32_t>(*f, "prompt");
    g.logits = read_tensor<float>(*f, "logits");
    g.greedy = read_tensor<int32_t>(*f, "greedy");
    for (const auto & t : f->tensors())
        if (t.name == "logits") g.n_vocab = t.shape[1];
    return g;
}

struct ModelDeleter {
    void operator()(spark_model * m) const { spark_model_free(m); }
};
struct ContextDeleter {
    void operator()(spark_context * c) const { spark_context_free(c); }
};
using ModelPtr   = std::unique_ptr<spark_model, ModelDeleter>;
using ContextPtr = std::unique_ptr<spark_context, ContextDeleter>;

inline spark_device_kind test_device() {
    const char * d = std::getenv("SPARK_TEST_DEVICE");
    return d && std::string(d) == "cuda" ? SPARK_DEVICE_CUDA : SPARK_DEVICE_CPU;
}

inline ModelPtr load_model(const std::string & path, spark_device_kind device = test_device()) {
    spark_model_params p = spark_model_default_params();
    p.device             = device;
    p.n_threads          = 2;
    spark_model * m      = nullptr;
    spark_status  st     = spark_model_load(path.c_str(), p, &m);
    INFO(path << ": " << spark_last_error());
    REQUIRE(st == SPARK_OK);
    return ModelPtr(m);
}

inline ContextPtr new_context(spark_model * m, int32_t n_ctx = 256, int32_t n_seq = 1, int32_t n_batch = 512) {
    spark_context_params p = spark_context_default_params();
    p.n_ctx                = n_ctx;
    p.n_seq_max            = n_seq;
    p.n_batch              = n_batch;
    p.n_threads            = 2;
    spark_context * c      = nullptr;
    spark_status    st     = spark_context_init(m, p, &c);
    INFO(spark_last_error());
    REQUIRE(st == SPARK_OK);
    return ContextPtr(c);
}

// Decodes tokens [begin, end) of `prompt` for sequence `seq` in one call, all rows wanting logits;
// appends their logits to `out`.
inline spark_status decode_range(spark_context * ctx, const std::vector<int32_t> & prompt, size_t begin, size_t end,
                                 int32_t seq, int32_t n_vocab, std::vector<float> & out) {
    const int32_t n = int32_t(end - begin);
    spark_batch   b = spark_batch_init(n, 1);
    for (int32_t i = 0; i < n; ++i) {
        b.token[i]     = prompt[begin + size_t(i)];
        b.pos[i]       = int32_t(begin) + i;
        b.n_seq_id[i]  = 1;
        b.seq_id[i][0] = seq;
        b.logits[i]    = 1;
    }
    b.n_tokens      = n;
    spark_status st = spark_decode(ctx, &b);
    if (st == SPARK_OK) {
        const float * l = spark_get_logits(ctx);
        out.insert(out.end(), l, l + size_t(n) * size_t(n_vocab));
    }
    spark_batch_free(b);
    return st;
}

// Logits of every prompt position, feeding the prompt in chunks of the given sizes (cycled).
inline std::vector<float> prompt_logits(spark_context * ctx, const std::vector<int32_t> & prompt, int32_t n_vocab,
                                        std::vector<size_t> chunks = {}) {
    if (chunks.empty()) chunks.push_back(prompt.size());
    std::vector<float> out;
    size_t             pos = 0, c = 0;
    while (pos < prompt.size()) {
        size_t n = std::min(chunks[c++ % chunks.size()], prompt.size() - pos);
        spark_status st = decode_range(ctx, prompt, pos, pos + n, 0, n_vocab, out);
        INFO(spark_last_error());
        REQUIRE(st == SPARK_OK);
        pos += n;
    }
    return out;
}

// Greedy continuation of n tokens after the prompt already decoded (the last logits row).
inline std::vector<int32_t> greedy_continue(spark_context * ctx, int32_t next_pos, int n) {
    std::vector<int32_t> out;
    spark_sampler *      s = spark_sampler_init_greedy();
    spark_batch          b = spark_batch_init(1, 1);
    for (int i = 0; i < n; ++i) {
        spark_token t;
        REQUIRE(spark_sampler_sample(s, ctx, -1, &t) == SPARK_OK);
        out.push_back(t);
        b.n_tokens     = 1;
        b.token[0]     = t;
        b.pos[0]       = next_pos++;
        b.n_seq_id[0]  = 1;
        b.seq_id[0][0] = 0;
        b.logits[0]    = 1;
        if (i + 1 < n) REQUIRE(spark_decode(ctx, &b) == SPARK_OK);
    }
    spark_batch_free(b);
    spark_sampler_free(s);
    return out;
}

inline float max_abs_diff(const std::vector<float> & a, const std::vector<float> & b) {
    REQUIRE(a.size() == b.size());
    float m = 0.0f;
    for (size_t i = 0; i < a.size(); ++i) {
        const float d = std::fabs(a[i] - b[i]);
        if (!(d <= m)) m = std::isnan(d) ? INFINITY : d;
    }
    return m;
}

}  // namespace test
