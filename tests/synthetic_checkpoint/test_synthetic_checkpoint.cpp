// spark-convert --synthetic (tools/convert/synthetic_checkpoint.cpp): Hugging Face directories of the
// synthetic shapes load like the in-memory synthetic models of the same shape and format, convert
// to spark files that run identically, are byte-identical from run to run, and match the layout of
// the real producers' fixtures (tests/data/models) tensor for tensor.
#include "common/error.h"
#include "converter.h"
#include "models/harness.h"
#include "synthetic_checkpoint.h"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

using namespace test;
namespace fs = std::filesystem;
using json   = nlohmann::json;

namespace {

const char * kShapes[]  = {"tiny-qwen3", "tiny-qwen3-moe", "tiny-qwen3-next", "tiny-minimax-m2"};
const char * kFormats[] = {"bf16", "int4", "nvfp4", "fp8"};

spark::convert::SyntheticStats write(const std::string & shape, const std::string & format, const fs::path & dir, uint64_t shard_bytes = 5000000000ull,
                                     int threads = 2, bool overwrite = false) {
    spark::convert::SyntheticOptions o;
    o.shape       = shape;
    o.format      = format;
    o.output      = dir.string();
    o.shard_bytes = shard_bytes;
    o.threads     = threads;
    o.overwrite   = overwrite;
    return spark::convert::write_synthetic_checkpoint(o);
}

std::string read_file(const fs::path & p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

spark_model_info info_of(spark_model * m) {
    spark_model_info i{};
    REQUIRE(spark_model_get_info(m, &i) == SPARK_OK);
    return i;
}

std::vector<float> run_prompt(spark_model * m, int32_t n_vocab) {
    ContextPtr ctx = new_context(m);
    return prompt_logits(ctx.get(), {1, 7, 42}, n_vocab);
}

// The bytes of the INT4 zero points the directory stores (AutoRound's explicit 7s: symmetric), in
// all and those of the modules one decode step reads (every layer's modules, the first
// n_expert_used experts of each MoE layer; not the MTP head).
void qzeros_bytes(const fs::path & dir, int64_t n_expert_used, uint64_t & total, uint64_t & decode) {
    total = decode = 0;
    auto src = spark::io::SafetensorsSource::open_dir(dir.string());
    for (const auto & t : src->tensors()) {
        const std::string & n = t.name;
        if (n.size() < 7 || n.compare(n.size() - 7, 7, ".qzeros") != 0) continue;
        total += t.nbytes;
        if (n.rfind("model.layers.", 0) != 0) continue;
        const size_t e = n.find(".experts.");
        if (e == std::string::npos || std::stoll(n.substr(e + 9)) < n_expert_used) decode += t.nbytes;
    }
}

bool all_finite(const std::vector<float> & v) {
    for (float x : v)
        if (!std::isfinite(x)) return false;
    return true;
}

}  // namespace

TEST_CASE("synthetic checkpoints load like synthetic:SHAPE:FORMAT and convert to spark files that run identically") {
    for (const char * shape : kShapes)
        for (const char * format : kFormats)
            for (uint64_t shard : {uint64_t(5000000000ull), uint64_t(150000)}) {
                CAPTURE(shape);
                CAPTURE(format);
                CAPTURE(shard);
                TempDir        tmp;
                const fs::path dir   = tmp.path / "ckpt";
                const auto     stats = write(shape, format, dir, shard);
                CHECK(fs::exists(dir / "config.json"));
                CHECK((stats.shards > 1) == (shard < 1000000));
                CHECK(fs::exists(dir / "model.safetensors.index.json") == (stats.shards > 1));
                CHECK(fs::exists(dir / "model.safetensors") == (stats.shards == 1));
                CHECK(fs::exists(dir / "hf_quant_config.json") == (std::string(format) == "nvfp4"));
                // Nothing but the checkpoint is left next to it.
                size_t entries = 0;
                for (const auto & e : fs::directory_iterator(tmp.path)) entries += e.path() != dir;
                CHECK(entries == 0);

                ModelPtr               syn = load_model(std::string("synthetic:") + shape + ":" + format, SPARK_DEVICE_CPU);
                ModelPtr               ckp = load_model(dir.string(), SPARK_DEVICE_CPU);
                const spark_model_info a = info_of(syn.get()), b = info_of(ckp.get());
                CHECK(std::string(b.architecture) == a.architecture);
                CHECK(std::string(b.weight_format) == a.weight_format);
                CHECK(b.n_params == a.n_params);
                CHECK(b.n_layer_attention == a.n_layer_attention);
                CHECK(b.n_layer_linear_attention == a.n_layer_linear_attention);
                CHECK(b.kv_bytes_per_token == a.kv_bytes_per_token);
                CHECK(b.recurrent_bytes == a.recurrent_bytes);
                CHECK(b.weight_bytes_embedding == a.weight_bytes_embedding);
                uint64_t zeros = 0, decode_zeros = 0;
                qzeros_bytes(dir, a.n_expert_used, zeros, decode_zeros);
                CHECK((zeros > 0) == (std::string(format) == "int4"));
                // AutoRound's stored zero points are all 8 (symmetric): the loader recognises them and
                // runs the weight as the symmetric synthetic model does, without reading them.
                CHECK(b.weight_bytes == a.weight_bytes);
                CHECK(b.decode_weight_bytes == a.decode_weight_bytes);
                CHECK(decode_zeros <= zeros);
                CHECK((spark_model_meta(ckp.get(), "spark.quantization") != nullptr));

                const std::vector<float> logits = run_prompt(ckp.get(), b.n_vocab);
                CHECK(all_finite(logits));
                CHECK(all_finite(run_prompt(syn.get(), a.n_vocab)));

                // spark-convert DIR -o OUT.spark: the same bytes, the same logits.
                const fs::path          file = tmp.path / "model.spark";
                spark::convert::Options co;
                co.input  = dir.string();
                co.output = file.string();
                spark::convert::convert(co);
                ModelPtr               spk = load_model(file.string(), SPARK_DEVICE_CPU);
                const spark_model_info c   = info_of(spk.get());
                CHECK(std::string(c.weight_format) == b.weight_format);
                CHECK(c.n_params == b.n_params);
                CHECK(c.decode_weight_bytes == b.decode_weight_bytes);
                CHECK(max_abs_diff(run_prompt(spk.get(), c.n_vocab), logits) == 0.0f);
            }
}

TEST_CASE("synthetic checkpoints are the same bytes on every run, whatever the number of threads") {
    TempDir tmp;
    write("tiny-qwen3-next", "nvfp4", tmp.path / "a", 100000, 1);
    write("tiny-qwen3-next", "nvfp4", tmp.path / "b", 100000, 3);
    size_t files = 0;
    for (const auto & e : fs::directory_iterator(tmp.path / "a")) {
        CAPTURE(e.path().filename().string());
        const fs::path other = tmp.path / "b" / e.path().filename();
        REQUIRE(fs::exists(other));
        CHECK(read_file(e.path()) == read_file(other));
        ++files;
    }
    CHECK(files > 4);
    size_t files_b = 0;
    for (const auto & e : fs::directory_iterator(tmp.path / "b")) files_b += e.is_regular_file();
    CHECK(files_b == files);
}

// tiny-qwen3 and tiny-qwen3-moe have the dimensions of the qwen3 / qwen3_moe fixtures, which the real
// tools wrote (AutoRound, ModelOpt, block FP8, transformers): the safetensors headers (tensor names,
// dtypes, shapes, order, offsets) must be the same bytes, and so must the INT4 qzeros and g_idx.
TEST_CASE("synthetic checkpoints have the layout of the real producers' checkpoints") {
    const std::map<std::string, std::string> fixture_of = {
        {"bf16", "bf16"}, {"int4", "int4-autoround"}, {"nvfp4", "nvfp4-modelopt"}, {"fp8", "fp8-block"}};
    for (const auto & shape_arch : std::map<std::string, std::string>{{"tiny-qwen3", "qwen3"}, {"tiny-qwen3-moe", "qwen3_moe"}})
        for (const char * format : kFormats) {
            // Named copies, not structured bindings: clang 14 cannot capture those in CAPTURE.
            const std::string & shape = shape_arch.first;
            const std::string & arch  = shape_arch.second;
            CAPTURE(shape);
            CAPTURE(format);
            TempDir tmp;
            write(shape, format, tmp.path / "ckpt");
            const std::string fixture = model_dir(arch + "-" + fixture_of.at(format));
            const std::string ours    = read_file(tmp.path / "ckpt" / "model.safetensors");
            const std::string theirs  = read_file(fixture + "/model.safetensors");
            REQUIRE(ours.size() >= 8);
            uint64_t header = 0;
            std::memcpy(&header, ours.data(), 8);
            CHECK(ours.size() == theirs.size());
            CHECK(ours.compare(0, 8 + header, theirs, 0, 8 + header) == 0);

            auto a = spark::io::SafetensorsSource::open_dir((tmp.path / "ckpt").string());
            auto b = spark::io::SafetensorsSource::open_dir(fixture);
            for (const auto & t : a->tensors()) {
                const bool exact = t.name.size() > 7 && (t.name.compare(t.name.size() - 7, 7, ".qzeros") == 0 || t.name.compare(t.name.size() - 6, 6, ".g_idx") == 0);
                if (!exact) continue;
                const auto * u = b->find(t.name);
                REQUIRE(u);
                CHECK(std::memcmp(t.data, u->data, t.nbytes) == 0);
            }

            // config.json: transformers 4.57's keys (the qwen3_moe bf16 fixture was written by
            // transformers 5), and the producer's quantization_config.
            const json c = json::parse(read_file(tmp.path / "ckpt" / "config.json"));
            const json f = json::parse(read_file(fixture + "/config.json"));
            if (!(arch == "qwen3_moe" && std::string(format) == "bf16")) {
                for (auto it = f.begin(); it != f.end(); ++it) CHECK_MESSAGE(c.contains(it.key()), it.key());
                CHECK(c.size() == f.size());
            }
            CHECK(c["architectures"] == f["architectures"]);
            CHECK(c["torch_dtype"] == "bfloat16");
            CHECK(c.value("quantization_config", json()) == f.value("quantization_config", json()));
            if (std::string(format) == "nvfp4")
                CHECK(json::parse(read_file(tmp.path / "ckpt" / "hf_quant_config.json")) == json::parse(read_file(fixture + "/hf_quant_config.json")));
        }
}

TEST_CASE("synthetic checkpoint values are finite: no FP8 NaN codes, positive scales") {
    TempDir tmp;
    write("tiny-qwen3-moe", "fp8", tmp.path / "fp8");
    write("tiny-qwen3-moe", "nvfp4", tmp.path / "nvfp4");
    write("tiny-qwen3-moe", "int4", tmp.path / "int4");
    auto check = [](const fs::path & dir) {
        auto src = spark::io::SafetensorsSource::open_dir(dir.string());
        for (const auto & t : src->tensors()) {
            CAPTURE(t.name);
            bool ok = true;
            if (t.dtype == spark::DType::F8_E4M3)
                for (size_t i = 0; i < t.nbytes; ++i) {
                    ok &= (t.data[i] & 0x7F) != 0x7F;  // not NaN
                    if (t.name.find("weight_scale") != std::string::npos) ok &= t.data[i] > 0 && t.data[i] < 0x7F;
                }
            if (t.dtype == spark::DType::F32)
                for (int64_t i = 0; i < t.numel(); ++i) {
                    float v;
                    std::memcpy(&v, t.data + 4 * i, 4);
                    ok &= std::isfinite(v) && v > 0.0f;
                }
            if (t.dtype == spark::DType::F16)
                for (int64_t i = 0; i < t.numel(); ++i) {
                    uint16_t h;
                    std::memcpy(&h, t.data + 2 * i, 2);
                    ok &= h > 0 && h < 0x7C00;  // positive, finite
                }
            if (t.dtype == spark::DType::BF16)
                for (int64_t i = 0; i < t.numel(); ++i) {
                    uint16_t h;
                    std::memcpy(&h, t.data + 2 * i, 2);
                    ok &= (h & 0x7F80) != 0x7F80;  // finite
                }
            CHECK(ok);
        }
    };
    check(tmp.path / "fp8");
    check(tmp.path / "nvfp4");
    check(tmp.path / "int4");
}

TEST_CASE("synthetic checkpoints: an existing directory is replaced only when it may be") {
    TempDir        tmp;
    const fs::path dir = tmp.path / "ckpt";

    fs::create_directories(dir);  // empty: replaced
    write("tiny-qwen3", "bf16", dir);
    const std::string before = read_file(dir / "config.json");

    // Not empty: refused without overwrite, and left as it was.
    CHECK_THROWS_AS(write("tiny-qwen3-moe", "int4", dir), spark::Error);
    CHECK(read_file(dir / "config.json") == before);
    // With overwrite: replaced.
    write("tiny-qwen3-moe", "int4", dir, 5000000000ull, 2, true);
    CHECK(read_file(dir / "config.json") != before);
    CHECK(json::parse(read_file(dir / "config.json"))["model_type"] == "qwen3_moe");

    // A non-empty directory that is not a checkpoint is never replaced; a file is not a directory.
    const fs::path other = tmp.path / "notes";
    fs::create_directories(other);
    std::ofstream(other / "todo.txt") << "keep me";
    CHECK_THROWS_AS(write("tiny-qwen3", "bf16", other, 5000000000ull, 2, true), spark::Error);
    CHECK(read_file(other / "todo.txt") == "keep me");
    std::ofstream(tmp.path / "file") << "x";
    CHECK_THROWS_AS(write("tiny-qwen3", "bf16", tmp.path / "file", 5000000000ull, 2, true), spark::Error);

    // Unknown shapes and formats fail before anything is written; so does a cancelled run.
    CHECK_THROWS_AS(write("qwen3-9000b", "int4", tmp.path / "x"), spark::Error);
    CHECK_THROWS_AS(write("tiny-qwen3", "q4_k", tmp.path / "x"), spark::Error);
    std::atomic<bool>                cancel{true};
    spark::convert::SyntheticOptions o;
    o.shape  = "tiny-qwen3";
    o.format = "int4";
    o.output = (tmp.path / "x").string();
    o.cancel = &cancel;
    try {
        spark::convert::write_synthetic_checkpoint(o);
        FAIL("a cancelled write returned");
    } catch (const spark::Error & e) {
        CHECK(e.status() == SPARK_ERR_ABORTED);
    }
    CHECK(!fs::exists(tmp.path / "x"));
    // Only what the test made is there (no temporaries).
    std::vector<std::string> names;
    for (const auto & e : fs::directory_iterator(tmp.path)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"ckpt", "file", "notes"});

    // A stale temporary of a killed run (its pid is gone) is removed by the next write.
    const fs::path stale = tmp.path / ("ckpt.tmp-" + std::to_string(999999999));
    fs::create_directories(stale);
    std::ofstream(stale / "model-00001-of-00002.safetensors") << "partial";
    write("tiny-qwen3", "bf16", dir, 5000000000ull, 2, true);
    CHECK(!fs::exists(stale));

    spark::convert::SyntheticOptions p;
    spark::convert::parse_synthetic_spec("qwen3-30b-a3b:int4", p);
    CHECK(p.shape == "qwen3-30b-a3b");
    CHECK(p.format == "int4");
    spark::convert::parse_synthetic_spec("tiny-qwen3", p);
    CHECK(p.format == "bf16");
    CHECK_THROWS_AS(spark::convert::parse_synthetic_spec("tiny-qwen3:gguf", p), spark::Error);
}
