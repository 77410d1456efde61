// The spark file (GGUF v3): writer -> reader round trips, the streaming writer's guarantees, and
// the reader's validation against hand-made hostile headers, truncation and random corruption.
#include "io_test_util.h"

#include "io/gguf_reader.h"
#include "io/writer/gguf_writer.h"

#include <algorithm>
#include <csignal>
#include <random>
#include <sys/stat.h>
#include <unistd.h>

using namespace spark;
using namespace spark::io;
using spark::test::Bytes;
using spark::test::TempDir;

namespace {

// ---- a hand-made GGUF builder --------------------------------------------------------------------

struct GgufBytes : Bytes {
    GgufBytes & u8(uint8_t x) { Bytes::u8(x); return *this; }
    GgufBytes & u32(uint32_t x) { Bytes::u32(x); return *this; }
    GgufBytes & u64(uint64_t x) { Bytes::u64(x); return *this; }
    GgufBytes & i64(int64_t x) { Bytes::i64(x); return *this; }
    GgufBytes & raw(const std::string & x) { Bytes::raw(x); return *this; }
    GgufBytes & zeros(size_t n) { Bytes::zeros(n); return *this; }
    GgufBytes & pad_to(size_t a) { Bytes::pad_to(a); return *this; }
    GgufBytes & str(const std::string & s) {
        u64(s.size());
        raw(s);
        return *this;
    }
    GgufBytes & key(const std::string & k, GgufType t) {
        str(k);
        u32(uint32_t(t));
        return *this;
    }
    GgufBytes & kv_string(const std::string & k, const std::string & s) { return key(k, GgufType::STRING).str(s); }
    GgufBytes & kv_u32(const std::string & k, uint32_t x) {
        key(k, GgufType::UINT32);
        u32(x);
        return *this;
    }
    GgufBytes & kv_u32_array(const std::string & k, const std::vector<uint32_t> & xs) {
        key(k, GgufType::ARRAY);
        u32(uint32_t(GgufType::UINT32));
        u64(xs.size());
        for (uint32_t x : xs) u32(x);
        return *this;
    }
    GgufBytes & kv_i64_array(const std::string & k, const std::vector<int64_t> & xs) {
        key(k, GgufType::ARRAY);
        u32(uint32_t(GgufType::INT64));
        u64(xs.size());
        for (int64_t x : xs) i64(x);
        return *this;
    }
    GgufBytes & tensor(const std::string & name, const std::vector<uint64_t> & ne, uint32_t type, uint64_t offset) {
        str(name);
        u32(uint32_t(ne.size()));
        for (uint64_t d : ne) u64(d);
        u32(type);
        u64(offset);
        return *this;
    }
};

size_t plain_size(uint32_t ggml) {
    switch (ggml) {
        case ggml_type::kF32: case ggml_type::kI32: return 4;
        case ggml_type::kF16: case ggml_type::kBF16: case ggml_type::kI16: return 2;
        case ggml_type::kF64: case ggml_type::kI64: return 8;
        default: return 1;
    }
}

struct RawTensor {
    std::string           name;
    std::vector<uint64_t> ne;
    uint32_t              ggml;
    uint64_t              offset;
    uint32_t              spark_id;
};

// A spark file described field by field, so a test can break exactly one thing.
struct SparkSpec {
    uint32_t                              magic     = kGgufMagic;
    uint32_t                              version   = 3;
    std::optional<uint64_t>               n_tensors;  // default: tensors.size()
    std::optional<uint64_t>               n_kv;       // default: the keys actually written
    bool                                  spark_keys = true;
    uint32_t                              alignment  = 64;
    std::optional<std::vector<uint32_t>>  dtype_ids;  // default: from tensors
    std::function<void(GgufBytes &)>      extra_kvs;
    uint64_t                              n_extra_kvs = 0;
    std::vector<RawTensor>                tensors = {
        {"a", {4, 2}, ggml_type::kF32, 0, 1},   // F32 [2, 4]
        {"b", {16}, ggml_type::kI8, 64, 6},     // U8 [16]
    };
    std::optional<uint64_t>               data_bytes;  // default: up to the padded end of the last tensor
};

std::vector<uint8_t> build(const SparkSpec & s) {
    GgufBytes b;
    b.u32(s.magic);
    b.u32(s.version);
    const uint64_t n_kv = (s.spark_keys ? 5 : 1) + s.n_extra_kvs;
    b.u64(s.n_tensors.value_or(s.tensors.size()));
    b.u64(s.n_kv.value_or(n_kv));
    b.kv_u32("general.alignment", s.alignment);
    if (s.spark_keys) {
        b.kv_string("general.architecture", "qwen3");
        b.kv_u32("spark.format_version", 1);
        b.kv_string("spark.hf_config_json", "{}");
        std::vector<uint32_t> ids;
        for (const RawTensor & t : s.tensors) ids.push_back(t.spark_id);
        b.kv_u32_array("spark.tensor_dtypes", s.dtype_ids.value_or(ids));
    }
    if (s.extra_kvs) s.extra_kvs(b);
    uint64_t end = 0;
    for (const RawTensor & t : s.tensors) {
        b.tensor(t.name, t.ne, t.ggml, t.offset);
        uint64_t n = plain_size(t.ggml);
        for (uint64_t d : t.ne) n *= d;
        end = std::max(end, t.offset + n);
    }
    // Invalid alignments (the reader must refuse them) are padded as 64.
    const uint64_t pad = s.alignment != 0 && (s.alignment & (s.alignment - 1)) == 0 ? s.alignment : 64;
    b.pad_to(pad);
    const uint64_t data = s.data_bytes.value_or((end + pad - 1) / pad * pad);
    for (uint64_t i = 0; i < data; ++i) b.u8(uint8_t(i * 7 + 1));
    return b.v;
}

#define CHECK_OPEN_FAILS(spec_or_bytes, status_, needle)                                                    \
    do {                                                                                                     \
        TempDir dir_;                                                                                        \
        const std::vector<uint8_t> bytes_ = (spec_or_bytes);                                                 \
        const std::string path_ = dir_ / "f.gguf";                                                           \
        test::write_file(path_, bytes_);                                                                     \
        CHECK_FAILS_WITH([&] { GgufFile::open(path_); }, status_, needle);                                   \
    } while (0)

// ---- writer helpers ------------------------------------------------------------------------------

// Deterministic bytes for tensor `index` (differs per tensor so misplaced data is caught).
std::vector<uint8_t> pattern(size_t index, uint64_t n) {
    std::vector<uint8_t> v(n);
    std::mt19937         rng(uint32_t(1000 + index));
    for (auto & x : v) x = uint8_t(rng());
    return v;
}

GgufWriter::DataProvider pattern_provider() {
    return [](size_t i, const GgufWriter::Tensor & t, GgufWriter::Sink & out) {
        auto v = pattern(i, t.nbytes);
        out.write(v.data(), v.size());
        return true;
    };
}

GgufWriter minimal_writer() {
    GgufWriter w;
    w.set_string("general.architecture", "qwen3");
    w.set_string("spark.hf_config_json", R"({"architectures": ["Qwen3ForCausalLM"]})");
    return w;
}

uint64_t bytes_of(DType dt, const std::vector<int64_t> & shape) {
    uint64_t n = dtype_size(dt);
    for (int64_t d : shape) n *= uint64_t(d);
    return n;
}

// A small valid spark file: a plain tensor, a byte-stored one, a scalar (a shape record).
std::vector<uint8_t> small_spark_file(const TempDir & dir) {
    GgufWriter w = minimal_writer();
    w.set_string("general.name", "tiny");
    w.set_u32("qwen3.block_count", 2);
    w.add_tensor("w", DType::BF16, {3, 4}, bytes_of(DType::BF16, {3, 4}));
    w.add_tensor("q", DType::U32, {2, 3}, bytes_of(DType::U32, {2, 3}));
    w.add_tensor("s", DType::F32, {}, 4);
    const std::string path = dir / "small.spark";
    w.write(path, pattern_provider(), /*overwrite=*/true);
    return test::read_file(path);
}

std::string temp_path_for(const std::string & path) { return path + ".tmp-" + std::to_string(getpid()); }

}  // namespace

// ---- registry ------------------------------------------------------------------------------------

TEST_CASE("gguf: dtype registry is a stable, complete, invertible table") {
    // These numbers are the file format (docs/FORMAT.md): changing one breaks every spark file.
    const std::pair<DType, uint32_t> expected[] = {
        {DType::F32, 1}, {DType::F16, 2}, {DType::BF16, 3}, {DType::F64, 4}, {DType::I8, 5},
        {DType::U8, 6}, {DType::I16, 7}, {DType::U16, 8}, {DType::I32, 9}, {DType::U32, 10},
        {DType::I64, 11}, {DType::U64, 12}, {DType::BOOL, 13}, {DType::F8_E4M3, 14}, {DType::F8_E5M2, 15},
    };
    CHECK(std::size(expected) == size_t(DType::COUNT));
    for (auto [dt, id] : expected) {
        CHECK(spark_dtype_id(dt) == id);
        CHECK(dtype_from_spark_id(id) == dt);
    }
    CHECK_FALSE(dtype_from_spark_id(0).has_value());
    CHECK_FALSE(dtype_from_spark_id(16).has_value());
    // ggml's own ids where ggml has the layout (ggml.h enum ggml_type), I8 over the bytes otherwise.
    CHECK(ggml_type_for(DType::F32) == 0);
    CHECK(ggml_type_for(DType::F16) == 1);
    CHECK(ggml_type_for(DType::I8) == 24);
    CHECK(ggml_type_for(DType::I16) == 25);
    CHECK(ggml_type_for(DType::I32) == 26);
    CHECK(ggml_type_for(DType::I64) == 27);
    CHECK(ggml_type_for(DType::F64) == 28);
    CHECK(ggml_type_for(DType::BF16) == 30);
    for (DType dt : {DType::U8, DType::U16, DType::U32, DType::U64, DType::BOOL, DType::F8_E4M3, DType::F8_E5M2})
        CHECK(ggml_type_for(dt) == 24);
    CHECK(std::string(ggml_type_name(12)) == "Q4_K");
    CHECK(std::string(ggml_type_name(40)) == "NVFP4");
    CHECK(std::string(ggml_type_name(4)) == "?");
    CHECK(std::string(ggml_type_name(43)) == "?");
}

// ---- round trip ----------------------------------------------------------------------------------

TEST_CASE("gguf: write then read gives identical metadata, dtypes, shapes, bytes and 64-byte alignment") {
    TempDir    dir;
    GgufWriter w = minimal_writer();

    const std::string big(100000, 'x');
    w.set_string("general.name", "round trip");
    w.set_string("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}");
    w.set_string("tokenizer.huggingface.json", big);
    w.set_string("spark.quantization", R"({"quant_method": "gptq", "packing_format": "auto_gptq"})");
    w.set_string("t.empty_string", "");
    w.set_string("t.utf8", "h\xC3\xA9llo \xE2\x82\xAC");
    w.set("t.u8", GgufValue(uint8_t(200)));
    w.set("t.i8", GgufValue(int8_t(-100)));
    w.set("t.u16", GgufValue(uint16_t(60000)));
    w.set("t.i16", GgufValue(int16_t(-30000)));
    w.set_u32("t.u32", 4000000000u);
    w.set_i32("t.i32", -2000000000);
    w.set_f32("t.f32", 1e-6f);
    w.set_bool("t.bool_true", true);
    w.set_bool("t.bool_false", false);
    w.set_u64("t.u64", 18000000000000000000ull);
    w.set_i64("t.i64", -9000000000000000000ll);
    w.set_f64("t.f64", 1000000.0000001);
    w.set("t.arr_u8", GgufValue::array(std::vector<uint8_t>{1, 2, 255}));
    w.set("t.arr_i8", GgufValue::array(std::vector<int8_t>{-1, 2}));
    w.set("t.arr_u16", GgufValue::array(std::vector<uint16_t>{65535}));
    w.set("t.arr_i16", GgufValue::array(std::vector<int16_t>{-5, 5}));
    w.set("t.arr_u32", GgufValue::array(std::vector<uint32_t>{7, 8, 9}));
    w.set("t.arr_i32", GgufValue::array(std::vector<int32_t>{-7, 8}));
    w.set("t.arr_f32", GgufValue::array(std::vector<float>{0.5f, -2.25f}));
    w.set("t.arr_bool", GgufValue::array(std::vector<bool>{true, false, true}));
    w.set("t.arr_u64", GgufValue::array(std::vector<uint64_t>{1ull << 63}));
    w.set("t.arr_i64", GgufValue::array(std::vector<int64_t>{-1, 1ll << 40}));
    w.set("t.arr_f64", GgufValue::array(std::vector<double>{3.141592653589793}));
    w.set("t.arr_empty", GgufValue::array(std::vector<int32_t>{}));
    w.set_string_array("t.arr_str", {"a", "", "\xE4\xB8\xAD\xE6\x96\x87", big});
    w.set_u32("t.replaced", 1);
    w.set_u32("t.replaced", 2);  // replaces in place

    struct Spec { std::string name; DType dtype; std::vector<int64_t> shape; };
    const std::vector<Spec> specs = {
        {"model.embed_tokens.weight", DType::BF16, {7, 5}},
        {"f32.vec", DType::F32, {9}},
        {"f16.3d", DType::F16, {2, 3, 5}},
        {"f64.4d", DType::F64, {1, 2, 1, 3}},
        {"i8", DType::I8, {13}},
        {"u8.packed", DType::U8, {4, 33}},
        {"i16", DType::I16, {3, 3}},
        {"u16", DType::U16, {5}},
        {"qweight", DType::I32, {2, 8}},
        {"u32", DType::U32, {3, 5}},
        {"d2t", DType::I64, {6}},
        {"u64", DType::U64, {2, 2}},
        {"mask", DType::BOOL, {10}},
        {"weight_scale", DType::F8_E4M3, {4, 2}},
        {"e5m2", DType::F8_E5M2, {7}},
        {"scalar.f32", DType::F32, {}},
        {"scalar.u32", DType::U32, {}},
        {"rank5", DType::F16, {2, 3, 4, 1, 2}},
        {"rank8.u16", DType::U16, {1, 2, 1, 2, 3, 1, 1, 2}},
        {"empty", DType::F32, {0, 4}},
        {"empty.u32", DType::U32, {3, 0}},
        {std::string(63, 'n'), DType::F32, {1}},
    };
    for (const Spec & s : specs) w.add_tensor(s.name, s.dtype, s.shape, bytes_of(s.dtype, s.shape));

    const std::string path = dir / "model.spark";
    w.write(path, pattern_provider());
    CHECK_FALSE(test::exists(temp_path_for(path)));
    // SPARK_TEST_KEEP_GGUF=<file> keeps a copy to check with stock tools (tools/gguf_stock_check.py).
    if (const char * keep = std::getenv("SPARK_TEST_KEEP_GGUF"))
        std::filesystem::copy_file(path, keep, std::filesystem::copy_options::overwrite_existing);

    auto f = GgufFile::open(path);
    CHECK(f->version() == 3);
    CHECK(f->alignment() == 64);
    CHECK(f->is_spark());
    CHECK(f->spark_format_version() == kSparkFormatVersion);
    CHECK(f->data_offset() % 64 == 0);

    // Every key the writer was given comes back with the same type and value, in order.
    for (const auto & [key, value] : f->metadata()) CHECK(!key.empty());
    CHECK(f->metadata()[0].first == "general.architecture");
    size_t user_keys = 0;
    const std::vector<std::string> writer_keys = {"general.alignment", "spark.format_version", "spark.tensor_dtypes", "spark.tensor_shapes"};
    std::vector<std::string> order;
    for (const auto & entry : f->metadata()) {
        const auto & key = entry.first;  // not structured bindings: the doctest macros are lambdas (clang 14)
        const auto & value = entry.second;
        if (std::find(writer_keys.begin(), writer_keys.end(), key) != writer_keys.end()) continue;
        const GgufValue * expected = w.find(key);
        REQUIRE_MESSAGE(expected != nullptr, key);
        CHECK_MESSAGE(*expected == value, key);
        order.push_back(key);
        ++user_keys;
    }
    CHECK(user_keys == 34);
    CHECK(order[1] == "spark.hf_config_json");
    CHECK(order[2] == "general.name");
    CHECK(f->get_u32("t.replaced") == 2u);
    CHECK(f->get_u32("general.alignment") == 64u);
    CHECK(f->get_string("tokenizer.huggingface.json") == big);
    CHECK(f->get_string_array("t.arr_str")->at(3) == big);

    REQUIRE(f->tensors().size() == specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
        const TensorInfo & t = f->tensors()[i];
        CAPTURE(specs[i].name);
        CHECK(t.name == specs[i].name);
        CHECK(t.dtype == specs[i].dtype);
        CHECK(t.shape == specs[i].shape);
        CHECK(t.nbytes == bytes_of(specs[i].dtype, specs[i].shape));
        CHECK((t.data - f->mapping().data()) % 64 == 0);
        CHECK(std::equal(t.data, t.data + t.nbytes, pattern(i, t.nbytes).begin()));
        CHECK(f->find_tensor(t.name) == &t);
    }
    CHECK(f->find_tensor("absent") == nullptr);

    // The raw GGUF view: ggml ids, reversed dims, ne[0] in bytes for byte-stored dtypes.
    const auto & raw = f->gguf_tensors();
    CHECK(raw[0].ggml_type == ggml_type::kBF16);
    CHECK(raw[0].ne == std::vector<int64_t>{5, 7});
    CHECK(raw[5].ggml_type == ggml_type::kI8);
    CHECK(raw[5].ne == std::vector<int64_t>{33, 4});
    CHECK(raw[9].ggml_type == ggml_type::kI8);
    CHECK(raw[9].ne == std::vector<int64_t>{20, 3});  // U32 [3, 5]: 5 * 4 bytes per row
    CHECK(raw[15].ne == std::vector<int64_t>{1});      // F32 scalar
    CHECK(raw[16].ne == std::vector<int64_t>{4});      // U32 scalar: 4 bytes
    CHECK(raw[17].ne == std::vector<int64_t>{2, 1, 4, 6});  // rank 5 folded: [2*3, 4, 1, 2] reversed
    CHECK(raw[18].ne == std::vector<int64_t>{4, 1, 1, 12});  // rank 8: [1*2*1*2*3, 1, 1, 2] reversed, ne[0] in bytes
    CHECK(raw[19].ne == std::vector<int64_t>{4, 0});
    // Only the tensors whose shape the dims do not give have a record.
    CHECK(f->get_i64_array("spark.tensor_shapes") ==
          std::vector<int64_t>{15, 0, 16, 0, 17, 5, 2, 3, 4, 1, 2, 18, 8, 1, 2, 1, 2, 3, 1, 1, 2});

    // Tensors are laid out in order, each at the padded end of the previous one.
    uint64_t offset = 0;
    for (const GgufTensorInfo & t : raw) {
        CHECK(t.offset == offset);
        offset += (t.nbytes + 63) / 64 * 64;
    }
    CHECK(f->data_offset() + offset == f->mapping().size());
}

TEST_CASE("gguf: GgufSource is a TensorSource over the file") {
    TempDir           dir;
    const auto        bytes = small_spark_file(dir);
    const std::string path  = dir / "small.spark";
    std::unique_ptr<TensorSource> src = GgufSource::open(path);
    CHECK(src->describe() == path);
    CHECK(src->tensors().size() == 3);
    CHECK(src->has("q"));
    const TensorInfo & q = src->get("q");
    CHECK(q.dtype == DType::U32);
    CHECK(q.shape == std::vector<int64_t>{2, 3});
    CHECK(q.nbytes == 24);
    CHECK(std::equal(q.data, q.data + 24, pattern(1, 24).begin()));
    CHECK(src->get("s").shape.empty());
    CHECK(src->get("s").numel() == 1);
    CHECK_FAILS_WITH([&] { src->get("nope"); }, SPARK_ERR_MISSING_TENSOR, "nope");
    auto & gs = static_cast<GgufSource &>(*src);
    CHECK(gs.file().get_string("general.name") == "tiny");
    CHECK(gs.file().get_u32("qwen3.block_count") == 2u);
}

TEST_CASE("gguf: typed getters convert compatible types, reject others, return nullopt when absent") {
    TempDir    dir;
    GgufWriter w = minimal_writer();
    w.set_u64("k.u64_small", 5);
    w.set_u64("k.u64_big", 1ull << 40);
    w.set_i32("k.negative", -3);
    w.set("k.u8", GgufValue(uint8_t(9)));
    w.set_f64("k.f64", 0.25);
    w.set_f32("k.f32", 1.5f);
    w.set_bool("k.bool", true);
    w.set_string("k.str", "s");
    w.set("k.arr_i32", GgufValue::array(std::vector<int32_t>{-1, 2, 3}));
    w.set("k.arr_u64_big", GgufValue::array(std::vector<uint64_t>{1ull << 63}));
    w.set("k.arr_f32", GgufValue::array(std::vector<float>{0.5f}));
    const std::string path = dir / "g.spark";
    w.write(path, pattern_provider());
    auto f = GgufFile::open(path);

    CHECK(f->get_u32("absent") == std::nullopt);
    CHECK(f->get_string("absent") == std::nullopt);
    CHECK(f->get_string_array("absent") == std::nullopt);
    CHECK(f->get_u32("k.u64_small") == 5u);
    CHECK(f->get_i32("k.u8") == 9);
    CHECK(f->get_i64("k.negative") == -3);
    CHECK(f->get_u64("k.u64_big") == (1ull << 40));
    CHECK(f->get_f32("k.f64") == 0.25f);
    CHECK(f->get_f64("k.f32") == 1.5);
    CHECK(f->get_bool("k.bool") == true);
    CHECK(f->get_string("k.str") == "s");
    CHECK(f->get_i64_array("k.arr_i32") == std::vector<int64_t>{-1, 2, 3});
    CHECK(f->get_f64_array("k.arr_f32") == std::vector<double>{0.5});

    CHECK_FAILS_WITH([&] { f->get_u32("k.u64_big"); }, SPARK_ERR_INVALID_FORMAT, "out of range");
    CHECK_FAILS_WITH([&] { f->get_u32("k.negative"); }, SPARK_ERR_INVALID_FORMAT, "out of range");
    CHECK_FAILS_WITH([&] { f->get_u32("k.str"); }, SPARK_ERR_INVALID_FORMAT, "is STRING, expected UINT32");
    CHECK_FAILS_WITH([&] { f->get_u32("k.bool"); }, SPARK_ERR_INVALID_FORMAT, "is BOOL");
    CHECK_FAILS_WITH([&] { f->get_string("k.u8"); }, SPARK_ERR_INVALID_FORMAT, "expected STRING");
    CHECK_FAILS_WITH([&] { f->get_bool("k.u8"); }, SPARK_ERR_INVALID_FORMAT, "expected BOOL");
    CHECK_FAILS_WITH([&] { f->get_f32("k.u8"); }, SPARK_ERR_INVALID_FORMAT, "expected FLOAT32 or FLOAT64");
    CHECK_FAILS_WITH([&] { f->get_string_array("k.arr_i32"); }, SPARK_ERR_INVALID_FORMAT, "ARRAY of INT32");
    CHECK_FAILS_WITH([&] { f->get_i64_array("k.arr_u64_big"); }, SPARK_ERR_INVALID_FORMAT, "does not fit");
    CHECK_FAILS_WITH([&] { f->get_i64_array("k.str"); }, SPARK_ERR_INVALID_FORMAT, "ARRAY of integers");

    CHECK(f->find("k.arr_i32")->to_display_string() == "[-1, 2, 3]");
    CHECK(f->find("k.str")->to_display_string() == "\"s\"");
}

// ---- streaming writer ----------------------------------------------------------------------------

TEST_CASE("gguf writer: streams one tensor at a time, in order, flushed before the next is asked for") {
    TempDir    dir;
    GgufWriter w = minimal_writer();
    const std::vector<uint64_t> sizes = {100, 64, 1, 3000, 0, 65};
    auto name_of = [](size_t i) { return std::string("t").append(std::to_string(i)); };
    for (size_t i = 0; i < sizes.size(); ++i) w.add_tensor(name_of(i), DType::U8, {int64_t(sizes[i])}, sizes[i]);

    const std::string     path = dir / "s.spark";
    const std::string     temp = temp_path_for(path);
    std::vector<size_t>   calls;
    std::vector<int64_t>  temp_size_at_call;
    std::vector<uint8_t>  buffer;  // one buffer, reused: the writer must not keep pointers into it
    w.write(path, [&](size_t i, const GgufWriter::Tensor & t, GgufWriter::Sink & out) {
        calls.push_back(i);
        CHECK(t.name == name_of(i));
        CHECK_FALSE(test::exists(path));
        struct stat st {};
        temp_size_at_call.push_back(::stat(temp.c_str(), &st) == 0 ? int64_t(st.st_size) : -1);
        buffer = pattern(i, t.nbytes);
        // In pieces of varying size, including empty ones.
        size_t pos = 0, piece = 0;
        while (pos < buffer.size()) {
            const size_t k = std::min(buffer.size() - pos, piece++ % 5 == 0 ? size_t(0) : piece * 7);
            out.write(buffer.data() + pos, k);
            pos += k;
        }
        std::fill(buffer.begin(), buffer.end(), 0xEE);
        return true;
    });
    CHECK(calls == std::vector<size_t>{0, 1, 2, 3, 4, 5});
    auto f = GgufFile::open(path);
    // When tensor i is requested, everything before it is already in the file.
    uint64_t expect = f->data_offset();
    for (size_t i = 0; i < sizes.size(); ++i) {
        CHECK(temp_size_at_call[i] == int64_t(expect));
        expect += (sizes[i] + 63) / 64 * 64;
        const TensorInfo & t = f->tensors()[i];
        CHECK(std::equal(t.data, t.data + t.nbytes, pattern(i, t.nbytes).begin()));
    }
}

TEST_CASE("gguf writer: refuses to overwrite unless asked") {
    TempDir           dir;
    const std::string path = dir / "exists.spark";
    test::write_file(path, std::string("precious"));
    GgufWriter w = minimal_writer();
    w.add_tensor("x", DType::F32, {2}, 8);
    int calls = 0;
    auto provider = [&](size_t i, const GgufWriter::Tensor & t, GgufWriter::Sink & out) {
        ++calls;
        return pattern_provider()(i, t, out);
    };
    CHECK_FAILS_WITH([&] { w.write(path, provider); }, SPARK_ERR_IO, "already exists");
    CHECK(calls == 0);  // refused before any work
    CHECK(test::read_file(path) == std::vector<uint8_t>{'p', 'r', 'e', 'c', 'i', 'o', 'u', 's'});
    CHECK_FALSE(test::exists(temp_path_for(path)));
    w.write(path, provider, /*overwrite=*/true);
    CHECK(calls == 1);
    CHECK(GgufFile::open(path)->tensors().size() == 1);
}

TEST_CASE("gguf writer: a failing, short, long or cancelling provider leaves no temporary and no target") {
    TempDir    dir;
    GgufWriter w = minimal_writer();
    w.add_tensor("a", DType::F32, {4}, 16);
    w.add_tensor("b", DType::F32, {4}, 16);
    const std::string path = dir / "out.spark";
    const std::string temp = temp_path_for(path);

    SUBCASE("exception") {
        bool saw_temp = false;
        CHECK_THROWS_AS(w.write(path, [&](size_t i, const GgufWriter::Tensor & t, GgufWriter::Sink & out) {
            saw_temp = test::exists(temp);
            if (i == 1) throw std::runtime_error("converter failed");
            return pattern_provider()(i, t, out);
        }), std::runtime_error);
        CHECK(saw_temp);
    }
    SUBCASE("cancel") {
        CHECK_FAILS_WITH([&] { w.write(path, [&](size_t i, const GgufWriter::Tensor & t, GgufWriter::Sink & out) {
            return i == 0 ? pattern_provider()(i, t, out) : false;
        }); }, SPARK_ERR_ABORTED, "cancelled at tensor 'b'");
    }
    SUBCASE("short") {
        CHECK_FAILS_WITH([&] { w.write(path, [&](size_t, const GgufWriter::Tensor &, GgufWriter::Sink & out) {
            out.write("abc", 3);
            return true;
        }); }, SPARK_ERR_INVALID_ARGUMENT, "is 3 bytes, declared 16");
    }
    SUBCASE("long") {
        const std::vector<uint8_t> v(17, 1);
        CHECK_FAILS_WITH([&] { w.write(path, [&](size_t, const GgufWriter::Tensor &, GgufWriter::Sink & out) {
            out.write(v.data(), v.size());
            return true;
        }); }, SPARK_ERR_INVALID_ARGUMENT, "exceeds its declared 16 bytes");
    }
    SUBCASE("cancel keeps an existing target intact") {
        test::write_file(path, std::string("old"));
        CHECK_FAILS_WITH([&] { w.write(path, [](size_t, const GgufWriter::Tensor &, GgufWriter::Sink &) { return false; }, true); },
                         SPARK_ERR_ABORTED, "cancelled");
        CHECK(test::read_file(path) == std::vector<uint8_t>{'o', 'l', 'd'});
        CHECK_FALSE(test::exists(temp));
        return;
    }
    CHECK_FALSE(test::exists(temp));
    CHECK_FALSE(test::exists(path));
    CHECK(std::filesystem::is_empty(dir.path()));
}

TEST_CASE("gguf writer: a signal handler can remove the temporary file of the write in progress") {
    TempDir    dir;
    GgufWriter w = minimal_writer();
    w.add_tensor("a", DType::F32, {4}, 16);
    const std::string path = dir / "sig.spark";
    const std::string temp = temp_path_for(path);

    struct sigaction old {};
    struct sigaction sa {};
    sa.sa_handler = [](int) { gguf_remove_temp_file_on_signal(); };
    sigemptyset(&sa.sa_mask);
    REQUIRE(sigaction(SIGUSR1, &sa, &old) == 0);
    bool existed = false, removed = false;
    // The handler removes the file; the write then cannot rename it and fails cleanly.
    CHECK_FAILS_WITH([&] { w.write(path, [&](size_t i, const GgufWriter::Tensor & t, GgufWriter::Sink & out) {
        existed = test::exists(temp);
        raise(SIGUSR1);
        removed = !test::exists(temp);
        return pattern_provider()(i, t, out);
    }); }, SPARK_ERR_IO, "cannot rename");
    sigaction(SIGUSR1, &old, nullptr);
    CHECK(existed);
    CHECK(removed);
    CHECK_FALSE(test::exists(path));

    // Outside a write the call removes nothing, not even a file at the last temporary's name.
    test::write_file(temp, std::string("not ours"));
    gguf_remove_temp_file_on_signal();
    CHECK(test::exists(temp));
}

TEST_CASE("gguf writer: rejects invalid tensors and metadata with clear errors") {
    GgufWriter w = minimal_writer();
    CHECK_NOTHROW(w.add_tensor(std::string(63, 'a'), DType::F32, {1}, 4));
    CHECK_FAILS_WITH([&] { w.add_tensor(std::string(64, 'b'), DType::F32, {1}, 4); }, SPARK_ERR_INVALID_ARGUMENT, "at most 63");
    CHECK_FAILS_WITH([&] { w.add_tensor("", DType::F32, {1}, 4); }, SPARK_ERR_INVALID_ARGUMENT, "empty");
    CHECK_FAILS_WITH([&] { w.add_tensor(std::string(63, 'a'), DType::F32, {1}, 4); }, SPARK_ERR_INVALID_ARGUMENT, "added twice");
    CHECK_FAILS_WITH([&] { w.add_tensor("c", DType::F32, {2, 3}, 23); }, SPARK_ERR_INVALID_ARGUMENT, "is 24 bytes, not 23");
    CHECK_FAILS_WITH([&] { w.add_tensor("d", DType::F32, {-1, 3}, 0); }, SPARK_ERR_INVALID_ARGUMENT, "invalid shape");
    CHECK_FAILS_WITH([&] { w.add_tensor("e", DType::U8, {1, 1, 1, 1, 1, 1, 1, 1, 1}, 1); }, SPARK_ERR_INVALID_ARGUMENT, "rank 9");
    CHECK_FAILS_WITH([&] { w.add_tensor("f", DType::F32, {int64_t(1) << 40, int64_t(1) << 40}, 0); }, SPARK_ERR_INVALID_ARGUMENT, "invalid shape");
    CHECK_FAILS_WITH([&] { w.set_u32("general.alignment", 32); }, SPARK_ERR_INVALID_ARGUMENT, "written by GgufWriter");
    CHECK_FAILS_WITH([&] { w.set_u32("spark.tensor_dtypes", 1); }, SPARK_ERR_INVALID_ARGUMENT, "written by GgufWriter");
    CHECK_FAILS_WITH([&] { w.set_u32("spark.format_version", 1); }, SPARK_ERR_INVALID_ARGUMENT, "written by GgufWriter");
    CHECK_FAILS_WITH([&] { w.set_u32("bad key", 1); }, SPARK_ERR_INVALID_ARGUMENT, "printable ASCII");
    CHECK_FAILS_WITH([&] { w.set_u32("", 1); }, SPARK_ERR_INVALID_ARGUMENT, "1 to 65535");
    CHECK_FAILS_WITH([&] { w.add_tensor("bad\xC3", DType::F32, {1}, 4); }, SPARK_ERR_INVALID_ARGUMENT, "not valid UTF-8");
    CHECK_FAILS_WITH([&] { w.set_string("s.latin1", "caf\xE9"); }, SPARK_ERR_INVALID_ARGUMENT, "not valid UTF-8");
    CHECK_FAILS_WITH([&] { w.set_string("s.overlong", "\xC0\xAF"); }, SPARK_ERR_INVALID_ARGUMENT, "not valid UTF-8");
    CHECK_FAILS_WITH([&] { w.set_string("s.surrogate", "\xED\xA0\x80"); }, SPARK_ERR_INVALID_ARGUMENT, "not valid UTF-8");
    CHECK_FAILS_WITH([&] { w.set_string("s.too_big", "\xF4\x90\x80\x80"); }, SPARK_ERR_INVALID_ARGUMENT, "not valid UTF-8");
    CHECK_FAILS_WITH([&] { w.set_string_array("s.arr", {"ok", "\x80"}); }, SPARK_ERR_INVALID_ARGUMENT, "not valid UTF-8");
    CHECK_NOTHROW(w.set_string("s.ok", "\xF0\x9F\x98\x80 \xE2\x82\xAC \xC3\xA9 \xF4\x8F\xBF\xBF"));
    const GgufValue inner = GgufValue::array(std::vector<int32_t>{1});
    CHECK_FAILS_WITH([&] { w.set("nested", GgufValue::array_of_arrays({inner})); }, SPARK_ERR_INVALID_ARGUMENT, "nested arrays");
    GgufArray lying;
    lying.elem_type = GgufType::UINT32;
    lying.count     = 3;
    lying.raw       = {1, 0, 0, 0};
    CHECK_FAILS_WITH([&] { w.set("lying", GgufValue(lying)); }, SPARK_ERR_INVALID_ARGUMENT, "disagree");

    TempDir    dir;
    GgufWriter bare;
    bare.set_string("general.architecture", "qwen3");
    CHECK_FAILS_WITH([&] { bare.write(dir / "x.spark", pattern_provider()); }, SPARK_ERR_INVALID_ARGUMENT, "spark.hf_config_json");
    CHECK_FAILS_WITH([&] { GgufWriter().write(dir / "x.spark", pattern_provider()); }, SPARK_ERR_INVALID_ARGUMENT, "general.architecture");
    CHECK_FAILS_WITH([&] { minimal_writer().write(dir / "no/such/dir/x.spark", pattern_provider()); }, SPARK_ERR_IO, "cannot create");
    CHECK(std::filesystem::is_empty(dir.path()));
}

TEST_CASE("gguf writer: a file without tensors is valid") {
    TempDir    dir;
    GgufWriter w = minimal_writer();
    w.write(dir / "empty.spark", pattern_provider());
    auto f = GgufFile::open(dir / "empty.spark");
    CHECK(f->tensors().empty());
    CHECK(f->mapping().size() % 64 == 0);
    CHECK(f->get_string("general.architecture") == "qwen3");
}

// ---- reader: hand-made files ---------------------------------------------------------------------

TEST_CASE("gguf reader: the hand-made baseline is valid (so each hostile variant tests one thing)") {
    TempDir dir;
    const std::string path = dir / "base.gguf";
    test::write_file(path, build(SparkSpec{}));
    auto f = GgufFile::open(path);
    REQUIRE(f->tensors().size() == 2);
    CHECK(f->tensors()[0].shape == std::vector<int64_t>{2, 4});
    CHECK(f->tensors()[1].dtype == DType::U8);
    CHECK(f->tensors()[1].data[0] == uint8_t(64 * 7 + 1));

    SparkSpec v2;
    v2.version = 2;
    test::write_file(path, build(v2));
    CHECK(GgufFile::open(path)->version() == 2);
}

TEST_CASE("gguf reader: missing files and bad preambles") {
    TempDir dir;
    CHECK_FAILS_WITH([&] { GgufFile::open(dir / "missing.gguf"); }, SPARK_ERR_IO, "missing.gguf");
    CHECK_FAILS_WITH([&] { GgufFile::open(dir.path()); }, SPARK_ERR_IO, "not a regular file");
    CHECK_OPEN_FAILS(std::vector<uint8_t>{}, SPARK_ERR_INVALID_FORMAT, "truncated");
    CHECK_OPEN_FAILS((std::vector<uint8_t>{'G', 'G'}), SPARK_ERR_INVALID_FORMAT, "truncated");
    SparkSpec s;
    s.magic = 0x46554748;
    CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "not a GGUF file");
    s       = SparkSpec{};
    s.version = 0;
    CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "version 0");
    s.version = 1;
    CHECK_OPEN_FAILS(build(s), SPARK_ERR_UNSUPPORTED, "version 1");
    s.version = 4;
    CHECK_OPEN_FAILS(build(s), SPARK_ERR_UNSUPPORTED, "newer");
    s.version = 0x03000000;
    CHECK_OPEN_FAILS(build(s), SPARK_ERR_UNSUPPORTED, "big-endian");
}

TEST_CASE("gguf reader: hostile counts and lengths are refused before allocating") {
    SparkSpec s;
    s.n_tensors = uint64_t(1) << 60;
    CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "tensor count");
    s.n_tensors = ~uint64_t(0);
    CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "tensor count");
    s           = SparkSpec{};
    s.n_kv      = uint64_t(1) << 62;
    CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "metadata count");
    // Each count plausible alone, but not both together.
    const uint64_t header_bytes = build(SparkSpec{}).size() - 24;
    s.n_kv      = header_bytes / 14;
    s.n_tensors = header_bytes / 33;
    CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "tensors cannot fit");

    // A huge string length, for a key and for a value.
    GgufBytes b;
    b.u32(kGgufMagic).u32(3).u64(0).u64(1).u64(~uint64_t(0) - 3).raw("abc").zeros(20);
    CHECK_OPEN_FAILS(b.v, SPARK_ERR_INVALID_FORMAT, "claims");
    s              = SparkSpec{};
    s.n_extra_kvs  = 1;
    s.extra_kvs    = [](GgufBytes & g) { g.key("x.s", GgufType::STRING).u64(uint64_t(1) << 40); };
    CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "claims 1099511627776 bytes");
    // A huge array count, for each kind of element.
    for (GgufType elem : {GgufType::UINT8, GgufType::FLOAT64, GgufType::STRING, GgufType::ARRAY}) {
        s.extra_kvs = [elem](GgufBytes & g) { g.key("x.a", GgufType::ARRAY).u32(uint32_t(elem)).u64(uint64_t(1) << 61); };
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "cannot fit");
    }
}

TEST_CASE("gguf reader: a header larger than the limit is refused without reading it") {
    // A sparse file: 300 MiB of zeros after a string that claims them all.
    TempDir   dir;
    GgufBytes b;
    b.u32(kGgufMagic).u32(3).u64(0).u64(1).str("k").u32(uint32_t(GgufType::STRING)).u64(uint64_t(300) << 20);
    const std::string path = dir / "big.gguf";
    test::write_file(path, b.v);
    REQUIRE(::truncate(path.c_str(), off_t(b.size()) + (off_t(300) << 20)) == 0);
    CHECK_FAILS_WITH([&] { GgufFile::open(path); }, SPARK_ERR_INVALID_FORMAT, "header limit");
}

TEST_CASE("gguf reader: metadata values are validated") {
    SparkSpec s;
    s.n_extra_kvs = 1;
    s.extra_kvs   = [](GgufBytes & g) { g.key("x.t", GgufType(13)).u32(0); };
    CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "unknown value type 13");
    s.extra_kvs = [](GgufBytes & g) { g.key("x.t", GgufType::ARRAY).u32(77).u64(0); };
    CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "unknown value type 77");
    s.extra_kvs = [](GgufBytes & g) { g.key("x.b", GgufType::BOOL).u8(2); };
    CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "not 0 or 1");
    s.extra_kvs = [](GgufBytes & g) { g.key("x.b", GgufType::ARRAY).u32(uint32_t(GgufType::BOOL)).u64(2).u8(1).u8(9); };
    CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "not 0 or 1");
    s.extra_kvs = [](GgufBytes & g) { g.kv_u32("general.architecture", 1); };
    CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "duplicate metadata key 'general.architecture'");
    s.extra_kvs = [](GgufBytes & g) { g.kv_u32("", 1); };
    CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "empty key");
}

TEST_CASE("gguf reader: nested arrays are read up to a depth limit") {
    auto nested = [](int depth) {
        return [depth](GgufBytes & g) {
            g.key("x.nested", GgufType::ARRAY);
            for (int d = 1; d < depth; ++d) g.u32(uint32_t(GgufType::ARRAY)).u64(1);
            g.u32(uint32_t(GgufType::INT32)).u64(2).u32(7).u32(uint32_t(-8));
        };
    };
    TempDir   dir;
    SparkSpec s;
    s.n_extra_kvs = 1;
    s.extra_kvs   = nested(2);
    test::write_file(dir / "n.gguf", build(s));
    auto              f = GgufFile::open(dir / "n.gguf");
    const GgufArray * a = f->find("x.nested")->as_array();
    REQUIRE(a);
    CHECK(a->elem_type == GgufType::ARRAY);
    REQUIRE(a->size() == 1);
    CHECK(a->arrays[0] == GgufValue::array(std::vector<int32_t>{7, -8}));
    s.extra_kvs = nested(int(kGgufMaxArrayDepth));
    test::write_file(dir / "n.gguf", build(s));
    CHECK_NOTHROW(GgufFile::open(dir / "n.gguf"));
    s.extra_kvs = nested(int(kGgufMaxArrayDepth) + 1);
    CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "nested deeper");
    // Deep nesting of empty arrays cannot exhaust the stack either.
    s.extra_kvs = [](GgufBytes & g) {
        g.key("x.deep", GgufType::ARRAY);
        for (int d = 0; d < 100000; ++d) g.u32(uint32_t(GgufType::ARRAY)).u64(1);
        g.u32(uint32_t(GgufType::UINT8)).u64(0);
    };
    CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "nested deeper");
}

TEST_CASE("gguf reader: alignment must be a UINT32 power of two") {
    for (uint32_t a : {0u, 48u, 100u, 0x80000001u}) {
        SparkSpec s;
        s.alignment = a;
        s.data_bytes = 128;
        CAPTURE(a);
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "not a power of two");
    }
    // general.alignment with another type: replace the u32 by a u64 by hand.
    GgufBytes b;
    b.u32(kGgufMagic).u32(3).u64(0).u64(1).key("general.alignment", GgufType::UINT64).u64(64);
    CHECK_OPEN_FAILS(b.v, SPARK_ERR_INVALID_FORMAT, "must be UINT32");
    // Alignments other than 64 are read (offsets follow them).
    TempDir   dir;
    SparkSpec s;
    s.alignment = 256;
    s.tensors[1].offset = 256;
    test::write_file(dir / "a.gguf", build(s));
    auto f = GgufFile::open(dir / "a.gguf");
    CHECK(f->alignment() == 256);
    CHECK(f->data_offset() % 256 == 0);
}

TEST_CASE("gguf reader: tensor infos are validated") {
    SparkSpec s;
    SUBCASE("unknown ggml type") {
        s.tensors[0].ggml = 43;
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_UNSUPPORTED, "unknown ggml type id 43");
        s.tensors[0].ggml = 0xFFFFFFFF;
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_UNSUPPORTED, "unknown ggml type id 4294967295");
    }
    SUBCASE("ggml type spark does not read") {
        s.tensors[0].ggml = 12;
        s.tensors[0].ne   = {256};
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_UNSUPPORTED, "Q4_K");
    }
    SUBCASE("offset outside the file") {
        s.tensors[1].offset = 128;
        s.data_bytes        = 128;
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "outside the data section");
        s.tensors[1].offset = uint64_t(1) << 63;
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "outside the data section");
        s.tensors[1].offset = ~uint64_t(63);  // aligned, and offset + size wraps around
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "outside the data section");
    }
    SUBCASE("tensor end past the file") {
        s.tensors[1].ne = {65};
        s.data_bytes    = 128;
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "outside the data section");
    }
    SUBCASE("misaligned offset") {
        s.tensors[1].offset = 40;
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "not a multiple of the alignment 64");
    }
    SUBCASE("overlapping tensors") {
        s.tensors[0].ne = {32, 2};  // 256 bytes from offset 0 covers b at 64
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "overlap");
        s.tensors[0].ne     = {4, 2};
        s.tensors[1].offset = 0;  // same start
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "overlap");
    }
    SUBCASE("n_dims 0 or above 4") {
        s.tensors[1].ne = {};
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "has 0 dimensions");
        s.tensors[1].ne = {1, 1, 1, 1, 16};
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "has 5 dimensions");
    }
    SUBCASE("ne product overflow") {
        s.tensors[0].ne = {uint64_t(1) << 32, uint64_t(1) << 31};  // * 4 bytes overflows u64
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "overflows");
        s.tensors[0].ne = {uint64_t(1) << 63, 1};
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "negative dimension");
    }
    SUBCASE("duplicate or empty tensor names") {
        s.tensors[1].name = "a";
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "duplicate tensor name 'a'");
        s.tensors[1].name = "";
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "empty name");
    }
    SUBCASE("data section starting past the end") {
        s.data_bytes = 0;
        SparkSpec unpadded = s;
        unpadded.alignment = 1;  // same header length, no padding
        const size_t header_end = build(unpadded).size();
        REQUIRE(header_end % 64 != 0);
        std::vector<uint8_t> bytes = build(s);
        bytes.resize(header_end);  // the header's padding is missing
        CHECK_OPEN_FAILS(bytes, SPARK_ERR_INVALID_FORMAT, "past the end of the file");
    }
}

TEST_CASE("gguf reader: spark metadata must agree with the tensor infos") {
    SparkSpec s;
    SUBCASE("dtype array length") {
        s.dtype_ids = std::vector<uint32_t>{1};
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "1 entries for 2 tensors");
        s.dtype_ids = std::vector<uint32_t>{1, 6, 6};
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "3 entries for 2 tensors");
    }
    SUBCASE("dtype array missing or of another type") {
        SparkSpec t;
        t.spark_keys  = false;  // write the spark keys by hand, without the dtype array
        t.n_extra_kvs = 3;
        t.extra_kvs   = [](GgufBytes & g) {
            g.kv_string("general.architecture", "qwen3").kv_u32("spark.format_version", 1).kv_string("spark.hf_config_json", "{}");
        };
        CHECK_OPEN_FAILS(build(t), SPARK_ERR_INVALID_FORMAT, "lacks spark.tensor_dtypes");
        t.n_extra_kvs = 4;
        t.extra_kvs   = [](GgufBytes & g) {
            g.kv_string("general.architecture", "qwen3").kv_u32("spark.format_version", 1).kv_string("spark.hf_config_json", "{}");
            g.kv_i64_array("spark.tensor_dtypes", {1, 6});
        };
        CHECK_OPEN_FAILS(build(t), SPARK_ERR_INVALID_FORMAT, "lacks spark.tensor_dtypes");
    }
    SUBCASE("unknown dtype id") {
        s.dtype_ids = std::vector<uint32_t>{1, 99};
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_UNSUPPORTED, "unknown spark dtype id 99");
        s.dtype_ids = std::vector<uint32_t>{0, 6};
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_UNSUPPORTED, "unknown spark dtype id 0");
    }
    SUBCASE("dtype stored as the wrong ggml type") {
        s.dtype_ids = std::vector<uint32_t>{2, 6};  // F16 declared, stored as F32
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "is F16 but stored as ggml F32");
    }
    SUBCASE("byte-stored dtype with a partial element") {
        s.tensors[1].ne = {6};
        s.dtype_ids     = std::vector<uint32_t>{1, 10};  // U32 over 6 bytes
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "not a whole number of U32 elements");
    }
    SUBCASE("shape records") {
        s.n_extra_kvs = 1;
        auto with_shapes = [&](std::vector<int64_t> records) {
            s.extra_kvs = [records](GgufBytes & g) { g.kv_i64_array("spark.tensor_shapes", records); };
            return build(s);
        };
        CHECK_OPEN_FAILS(with_shapes({2, 0}), SPARK_ERR_INVALID_FORMAT, "out of order or out of range");
        CHECK_OPEN_FAILS(with_shapes({-1, 0}), SPARK_ERR_INVALID_FORMAT, "out of order or out of range");
        CHECK_OPEN_FAILS(with_shapes({1, 1, 16, 1, 1, 16}), SPARK_ERR_INVALID_FORMAT, "out of order or out of range");
        CHECK_OPEN_FAILS(with_shapes({1, 9, 1, 1, 1, 1, 1, 1, 1, 1, 16}), SPARK_ERR_INVALID_FORMAT, "rank 9");
        CHECK_OPEN_FAILS(with_shapes({1, -1}), SPARK_ERR_INVALID_FORMAT, "rank -1");
        CHECK_OPEN_FAILS(with_shapes({1, 3, 2, 8}), SPARK_ERR_INVALID_FORMAT, "ends inside a record");
        CHECK_OPEN_FAILS(with_shapes({1}), SPARK_ERR_INVALID_FORMAT, "ends inside a record");
        CHECK_OPEN_FAILS(with_shapes({1, 2, -2, -8}), SPARK_ERR_INVALID_FORMAT, "negative dimension");
        // A shape whose canonical GGUF dims are not the tensor's: [2, 8] would be ne = [8, 2].
        CHECK_OPEN_FAILS(with_shapes({1, 2, 2, 8}), SPARK_ERR_INVALID_FORMAT, "does not match its GGUF dimensions");
        CHECK_OPEN_FAILS(with_shapes({1, 0}), SPARK_ERR_INVALID_FORMAT, "does not match its GGUF dimensions");
        s.extra_kvs = [](GgufBytes & g) { g.kv_u32_array("spark.tensor_shapes", {1, 1, 16}); };
        CHECK_OPEN_FAILS(build(s), SPARK_ERR_INVALID_FORMAT, "array of INT64");
        // A redundant but consistent record is accepted.
        TempDir dir;
        test::write_file(dir / "ok.gguf", with_shapes({0, 2, 2, 4, 1, 1, 16}));
        CHECK(GgufFile::open(dir / "ok.gguf")->tensors()[1].shape == std::vector<int64_t>{16});
    }
    SUBCASE("required keys and versions") {
        s.n_extra_kvs = 0;
        SparkSpec t   = s;
        t.spark_keys  = false;
        t.n_extra_kvs = 3;
        t.extra_kvs   = [](GgufBytes & g) {
            g.kv_u32("spark.format_version", 1).kv_string("spark.hf_config_json", "{}").kv_u32_array("spark.tensor_dtypes", {1, 6});
        };
        CHECK_OPEN_FAILS(build(t), SPARK_ERR_INVALID_FORMAT, "general.architecture");
        t.extra_kvs = [](GgufBytes & g) {
            g.kv_u32("spark.format_version", 2).kv_string("spark.hf_config_json", "{}").kv_u32_array("spark.tensor_dtypes", {1, 6});
        };
        CHECK_OPEN_FAILS(build(t), SPARK_ERR_UNSUPPORTED, "format version 2");
        t.extra_kvs = [](GgufBytes & g) {
            g.kv_u32("spark.format_version", 0).kv_string("spark.hf_config_json", "{}").kv_u32_array("spark.tensor_dtypes", {1, 6});
        };
        CHECK_OPEN_FAILS(build(t), SPARK_ERR_INVALID_FORMAT, "spark.format_version is 0");
        t.extra_kvs = [](GgufBytes & g) {
            g.kv_string("general.architecture", "qwen3").kv_u32("spark.format_version", 1).kv_u32_array("spark.tensor_dtypes", {1, 6});
        };
        CHECK_OPEN_FAILS(build(t), SPARK_ERR_INVALID_FORMAT, "spark.hf_config_json");
    }
    SUBCASE("a spark file ends exactly after its padded data") {
        std::vector<uint8_t> bytes = build(s);
        bytes.push_back(0);
        CHECK_OPEN_FAILS(bytes, SPARK_ERR_INVALID_FORMAT, "truncated or extended");
        bytes.resize(bytes.size() - 2);  // last tensor's padding cut by one byte
        CHECK_OPEN_FAILS(bytes, SPARK_ERR_INVALID_FORMAT, "truncated or extended");
    }
}

TEST_CASE("gguf reader: plain GGUF files (no spark metadata) are read by their ggml types") {
    TempDir   dir;
    GgufBytes b;
    b.u32(kGgufMagic).u32(3).u64(3).u64(1).kv_string("general.architecture", "llama");
    b.tensor("token_embd.weight", {4, 3}, ggml_type::kF16, 0);
    b.tensor("ids", {5}, ggml_type::kI32, 32);
    b.tensor("bytes", {3}, ggml_type::kI8, 64);
    b.pad_to(32).zeros(96 + 5);  // default alignment 32; trailing bytes allowed in plain files
    test::write_file(dir / "p.gguf", b.v);
    auto f = GgufFile::open(dir / "p.gguf");
    CHECK_FALSE(f->is_spark());
    CHECK(f->alignment() == 32);
    CHECK(f->tensors()[0].dtype == DType::F16);
    CHECK(f->tensors()[0].shape == std::vector<int64_t>{3, 4});
    CHECK(f->tensors()[1].dtype == DType::I32);
    CHECK(f->tensors()[2].dtype == DType::I8);
    CHECK((f->tensors()[2].data - f->mapping().data()) % 32 == 0);
}

// ---- reader: truncation and corruption -----------------------------------------------------------

TEST_CASE("gguf reader: every truncation of a valid file is an error") {
    TempDir                    dir;
    const std::vector<uint8_t> bytes = small_spark_file(dir);
    REQUIRE(bytes.size() > 300);
    const std::string path = dir / "cut.spark";
    for (size_t n = 0; n < bytes.size(); ++n) {
        test::write_file(path, bytes.data(), n);
        auto failure = test::failure_of([&] { GgufFile::open(path); });
        CAPTURE(n);
        REQUIRE(failure.has_value());
        CHECK(failure->status == SPARK_ERR_INVALID_FORMAT);
    }
    test::write_file(path, bytes);
    CHECK_NOTHROW(GgufFile::open(path));
}

TEST_CASE("gguf reader: random single-byte corruptions never crash") {
    TempDir                    dir;
    const std::vector<uint8_t> bytes = small_spark_file(dir);
    const std::string          path  = dir / "bad.spark";
    std::mt19937               rng(1234);
    int                        errors = 0, parsed = 0;
    for (int iter = 0; iter < 4000; ++iter) {
        std::vector<uint8_t> b = bytes;
        // Mostly the header, where the structure is; the data section sometimes.
        const size_t header_end = iter % 4 == 0 ? b.size() : std::min<size_t>(b.size(), 700);
        const size_t at         = rng() % header_end;
        uint8_t      v          = uint8_t(rng());
        if (v == b[at]) v ^= 0xFF;
        b[at] = v;
        test::write_file(path, b);
        try {
            auto f = GgufFile::open(path);
            // A successful parse must describe memory inside the file.
            for (const TensorInfo & t : f->tensors()) {
                CHECK(t.data >= f->mapping().data());
                CHECK(t.data + t.nbytes <= f->mapping().data() + f->mapping().size());
                volatile uint8_t sink = 0;
                for (size_t i = 0; i < t.nbytes; ++i) sink = sink + t.data[i];
            }
            for (const auto & kv : f->metadata()) (void) kv.second.to_display_string();
            ++parsed;
        } catch (const Error & e) {
            const spark_status st = e.status();
            CHECK((st == SPARK_ERR_INVALID_FORMAT || st == SPARK_ERR_UNSUPPORTED));
            ++errors;
        }
    }
    MESSAGE("corruptions: " << errors << " rejected, " << parsed << " parsed");
    CHECK(errors > 1000);
    CHECK(parsed > 100);  // corruptions of string contents and data bytes are not errors
}
