// The safetensors reader against small hand-made files: valid single files and sharded
// directories, and every malformation the reference implementation rejects.
#include "io_test_util.h"

#include "io/safetensors.h"

#include <random>

using namespace spark;
using namespace spark::io;
using spark::test::TempDir;

namespace {

// A safetensors file from a header text and a data section.
std::vector<uint8_t> st_bytes(const std::string & header, const std::vector<uint8_t> & data) {
    test::Bytes b;
    b.u64(header.size());
    b.raw(header);
    b.v.insert(b.v.end(), data.begin(), data.end());
    return b.v;
}

std::vector<uint8_t> counting(size_t n, uint8_t start = 0) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = uint8_t(start + i);
    return v;
}

// Opens `bytes` as a safetensors file in `dir`; a failure is reported by CHECK_FAILS_WITH.
#define CHECK_ST_FAILS(header, data, status_, needle)                                                    \
    do {                                                                                                \
        TempDir dir_;                                                                                   \
        test::write_file(dir_ / "m.safetensors", st_bytes(header, data));                               \
        CHECK_FAILS_WITH([&] { SafetensorsFile::open(dir_ / "m.safetensors"); }, status_, needle);      \
    } while (0)

const std::string kValidHeader =
    R"({"__metadata__": {"format": "pt"},)"
    R"( "w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},)"
    R"( "scale": {"dtype": "F32", "shape": [], "data_offsets": [12, 16]},)"
    R"( "empty": {"dtype": "I32", "shape": [0, 5], "data_offsets": [16, 16]},)"
    R"( "q": {"dtype": "U8", "shape": [4], "data_offsets": [16, 20]}})";

}  // namespace

TEST_CASE("safetensors: a valid file gives its tensors, shapes, dtypes, data and metadata") {
    TempDir dir;
    // The reference writer pads the header with spaces; that is valid.
    test::write_file(dir / "m.safetensors", st_bytes(kValidHeader + "     ", counting(20)));
    auto f = SafetensorsFile::open(dir / "m.safetensors");
    REQUIRE(f->tensors().size() == 4);
    CHECK(f->metadata().at("format") == "pt");
    const uint8_t * data = nullptr;
    for (const TensorInfo & t : f->tensors()) {
        if (t.name == "w") {
            CHECK(t.dtype == DType::BF16);
            CHECK(t.shape == std::vector<int64_t>{2, 3});
            CHECK(t.nbytes == 12);
            CHECK(t.data[0] == 0);
            data = t.data;
        } else if (t.name == "scale") {
            CHECK(t.dtype == DType::F32);
            CHECK(t.shape.empty());
            CHECK(t.nbytes == 4);
            CHECK(t.data[0] == 12);
        } else if (t.name == "empty") {
            CHECK(t.nbytes == 0);
            CHECK(t.numel() == 0);
        } else {
            CHECK(t.name == "q");
            CHECK(t.dtype == DType::U8);
            CHECK(t.data[3] == 19);
        }
    }
    REQUIRE(data != nullptr);

    auto src = SafetensorsSource::open_file(dir / "m.safetensors");
    CHECK(src->describe() == dir / "m.safetensors");
    CHECK(src->get("q").nbytes == 4);
    CHECK_FAILS_WITH([&] { src->get("absent"); }, SPARK_ERR_MISSING_TENSOR, "absent");

    // A directory with a single model.safetensors.
    test::write_file(dir / "model.safetensors", st_bytes(kValidHeader, counting(20)));
    CHECK(SafetensorsSource::open_dir(dir.path())->tensors().size() == 4);
}

TEST_CASE("safetensors: missing, short and truncated files") {
    TempDir dir;
    CHECK_FAILS_WITH([&] { SafetensorsFile::open(dir / "none.safetensors"); }, SPARK_ERR_IO, "none.safetensors");
    CHECK_FAILS_WITH([&] { SafetensorsSource::open_dir(dir.path()); }, SPARK_ERR_IO, "neither");
    test::write_file(dir / "short.safetensors", std::string("abc"));
    CHECK_FAILS_WITH([&] { SafetensorsFile::open(dir / "short.safetensors"); }, SPARK_ERR_INVALID_FORMAT, "truncated");

    // Header length beyond the file, and beyond the reference's 100 MB limit.
    test::Bytes b;
    b.u64(1000).raw("{}");
    test::write_file(dir / "h.safetensors", b.v);
    CHECK_FAILS_WITH([&] { SafetensorsFile::open(dir / "h.safetensors"); }, SPARK_ERR_INVALID_FORMAT, "truncated");
    test::Bytes huge;
    huge.u64(~uint64_t(0)).raw("{}");
    test::write_file(dir / "h.safetensors", huge.v);
    CHECK_FAILS_WITH([&] { SafetensorsFile::open(dir / "h.safetensors"); }, SPARK_ERR_INVALID_FORMAT, "exceeds the limit");

    // The data section shorter than the tensors say.
    CHECK_ST_FAILS(kValidHeader, counting(19), SPARK_ERR_INVALID_FORMAT, "outside the file");

    // Every prefix of a valid file is an error.
    const std::vector<uint8_t> full = st_bytes(kValidHeader, counting(20));
    for (size_t n = 0; n < full.size(); ++n) {
        test::write_file(dir / "cut.safetensors", full.data(), n);
        auto failure = test::failure_of([&] { SafetensorsFile::open(dir / "cut.safetensors"); });
        CAPTURE(n);
        REQUIRE(failure.has_value());
        CHECK(failure->status == SPARK_ERR_INVALID_FORMAT);
    }
}

TEST_CASE("safetensors: malformed headers") {
    const auto data = counting(8);
    CHECK_ST_FAILS("", data, SPARK_ERR_INVALID_FORMAT, "not a JSON object");
    CHECK_ST_FAILS(R"(["w"])", data, SPARK_ERR_INVALID_FORMAT, "not a JSON object");
    CHECK_ST_FAILS(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})", data, SPARK_ERR_INVALID_FORMAT, "invalid JSON");
    CHECK_ST_FAILS(R"({"w": {"dtype": "F32", "shape": [2]}})", data, SPARK_ERR_INVALID_FORMAT, "lacks dtype/shape/data_offsets");
    CHECK_ST_FAILS(R"({"w": [1, 2]})", data, SPARK_ERR_INVALID_FORMAT, "lacks dtype/shape/data_offsets");
    CHECK_ST_FAILS(R"({"w": {"dtype": 7, "shape": [2], "data_offsets": [0, 8]}})", data, SPARK_ERR_INVALID_FORMAT, "dtype is not a string");
    CHECK_ST_FAILS(R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", data, SPARK_ERR_INVALID_FORMAT, "non-negative integers");
    CHECK_ST_FAILS(R"({"w": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}})", data, SPARK_ERR_INVALID_FORMAT, "non-negative integers");
    CHECK_ST_FAILS(R"({"w": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}})", data, SPARK_ERR_INVALID_FORMAT, "bad shape");
    CHECK_ST_FAILS(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", data, SPARK_ERR_INVALID_FORMAT, "two non-negative integers");
    CHECK_ST_FAILS(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", data, SPARK_ERR_INVALID_FORMAT, "end before begin");
    CHECK_ST_FAILS(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296], "data_offsets": [0, 8]}})", data, SPARK_ERR_INVALID_FORMAT, "overflows");
    CHECK_ST_FAILS(R"({"__metadata__": {"k": 1}, "w": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})", data, SPARK_ERR_INVALID_FORMAT, "is not a string");
    CHECK_ST_FAILS(R"({"__metadata__": [], "w": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})", data, SPARK_ERR_INVALID_FORMAT, "__metadata__ is not an object");
    CHECK_ST_FAILS("{\"w\xff\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 8]}}", data, SPARK_ERR_INVALID_FORMAT, "invalid JSON");
}

TEST_CASE("safetensors: offsets outside the file, overlaps and holes") {
    const auto data = counting(16);
    CHECK_ST_FAILS(R"({"w": {"dtype": "U8", "shape": [8], "data_offsets": [16, 24]}})", data, SPARK_ERR_INVALID_FORMAT, "outside the file");
    CHECK_ST_FAILS(R"({"w": {"dtype": "U8", "shape": [8], "data_offsets": [18446744073709551608, 18446744073709551615]}})", data, SPARK_ERR_INVALID_FORMAT, "outside the file");
    CHECK_ST_FAILS(R"({"a": {"dtype": "U8", "shape": [12], "data_offsets": [0, 12]}, "b": {"dtype": "U8", "shape": [8], "data_offsets": [8, 16]}})",
                   data, SPARK_ERR_INVALID_FORMAT, "overlaps");
    CHECK_ST_FAILS(R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}, "b": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})",
                   data, SPARK_ERR_INVALID_FORMAT, "overlaps");
    // A hole between tensors, before the first, and bytes after the last.
    CHECK_ST_FAILS(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}, "b": {"dtype": "U8", "shape": [8], "data_offsets": [8, 16]}})",
                   data, SPARK_ERR_INVALID_FORMAT, "hole");
    CHECK_ST_FAILS(R"({"b": {"dtype": "U8", "shape": [8], "data_offsets": [8, 16]}})", data, SPARK_ERR_INVALID_FORMAT, "hole");
    CHECK_ST_FAILS(R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})", data, SPARK_ERR_INVALID_FORMAT, "tensors cover 8");
    CHECK_ST_FAILS(R"({})", data, SPARK_ERR_INVALID_FORMAT, "tensors cover 0");
}

TEST_CASE("safetensors: dtypes, and sizes that disagree with dtype and shape") {
    const auto data = counting(8);
    for (const char * dt : {"F8_E4M3FNUZ", "F8_E8M0", "F4", "C64", "f32", ""}) {
        CAPTURE(dt);
        CHECK_ST_FAILS(std::string(R"({"w": {"dtype": ")") + dt + R"(", "shape": [8], "data_offsets": [0, 8]}})", data, SPARK_ERR_UNSUPPORTED, "unsupported dtype");
    }
    CHECK_ST_FAILS(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", data, SPARK_ERR_INVALID_FORMAT, "needs 12 bytes but data_offsets span 8");
    CHECK_ST_FAILS(R"({"w": {"dtype": "F16", "shape": [2, 3], "data_offsets": [0, 8]}})", data, SPARK_ERR_INVALID_FORMAT, "needs 12 bytes");
    CHECK_ST_FAILS(R"({"w": {"dtype": "I64", "shape": [], "data_offsets": [0, 4]}, "x": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})", data,
                   SPARK_ERR_INVALID_FORMAT, "needs 8 bytes but data_offsets span 4");
    // Every dtype spark knows is accepted with a matching size.
    for (const char * dt : {"F32", "F16", "BF16", "F64", "I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64", "BOOL", "F8_E4M3", "F8_E5M2"}) {
        TempDir dir;
        auto    want = dtype_from_safetensors(dt);
        REQUIRE(want.has_value());
        const size_t n = dtype_size(*want) * 3;
        test::write_file(dir / "m.safetensors", st_bytes(std::string(R"({"w": {"dtype": ")") + dt + R"(", "shape": [3], "data_offsets": [0, )" + std::to_string(n) + "]}}", counting(n)));
        CAPTURE(dt);
        CHECK(SafetensorsFile::open(dir / "m.safetensors")->tensors()[0].dtype == *want);
    }
}

TEST_CASE("safetensors: duplicate tensor names are rejected") {
    const auto data = counting(16);
    CHECK_ST_FAILS(R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}, "a": {"dtype": "U8", "shape": [8], "data_offsets": [8, 16]}})",
                   data, SPARK_ERR_INVALID_FORMAT, "duplicate tensor name 'a'");
}

TEST_CASE("safetensors: sharded directories") {
    TempDir dir;
    test::write_file(dir / "model-00001-of-00002.safetensors",
                     st_bytes(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}, "b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}})", counting(6)));
    test::write_file(dir / "model-00002-of-00002.safetensors",
                     st_bytes(R"({"c": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}})", counting(4, 100)));
    auto index = [&](const std::string & weight_map) {
        test::write_file(dir / "model.safetensors.index.json", R"({"metadata": {"total_size": 1}, "weight_map": )" + weight_map + "}");
    };

    SUBCASE("valid") {
        index(R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"})");
        auto src = SafetensorsSource::open_dir(dir.path());
        CHECK(src->tensors().size() == 3);
        CHECK(src->get("c").dtype == DType::I32);
        CHECK(src->get("c").data[0] == 100);
        CHECK(src->get("b").data[1] == 5);
        CHECK(src->describe() == dir.path());
    }
    SUBCASE("a missing shard") {
        index(R"({"a": "model-00001-of-00002.safetensors", "d": "model-00003-of-00003.safetensors"})");
        CHECK_FAILS_WITH([&] { SafetensorsSource::open_dir(dir.path()); }, SPARK_ERR_IO, "model-00003-of-00003.safetensors");
    }
    SUBCASE("a tensor missing from its shard") {
        index(R"({"a": "model-00001-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"})");
        CHECK_FAILS_WITH([&] { SafetensorsSource::open_dir(dir.path()); }, SPARK_ERR_MISSING_TENSOR, "tensor 'c'");
    }
    SUBCASE("hostile shard names") {
        for (const char * shard : {"../x.safetensors", "/etc/passwd", "sub/x.safetensors", "..", ".", "", "a\\\\b"}) {
            CAPTURE(shard);
            index(std::string(R"({"a": ")") + shard + "\"}");
            CHECK_FAILS_WITH([&] { SafetensorsSource::open_dir(dir.path()); }, SPARK_ERR_INVALID_FORMAT, "invalid shard file name");
        }
    }
    SUBCASE("a tensor in two shards") {
        test::write_file(dir / "model-00002-of-00002.safetensors",
                         st_bytes(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})", counting(4)));
        index(R"({"a": "model-00001-of-00002.safetensors", "x": "model-00002-of-00002.safetensors"})");
        CHECK_FAILS_WITH([&] { SafetensorsSource::open_dir(dir.path()); }, SPARK_ERR_MISSING_TENSOR, "tensor 'x'");
        index(R"({"a": "model-00002-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"})");
        CHECK_FAILS_WITH([&] { SafetensorsSource::open_dir(dir.path()); }, SPARK_ERR_INVALID_FORMAT, "more than one shard");
    }
    SUBCASE("malformed index") {
        index(R"({})");
        CHECK_FAILS_WITH([&] { SafetensorsSource::open_dir(dir.path()); }, SPARK_ERR_INVALID_FORMAT, "weight_map is empty");
        index(R"([])");
        CHECK_FAILS_WITH([&] { SafetensorsSource::open_dir(dir.path()); }, SPARK_ERR_INVALID_FORMAT, "no weight_map object");
        index(R"({"a": 3})");
        CHECK_FAILS_WITH([&] { SafetensorsSource::open_dir(dir.path()); }, SPARK_ERR_INVALID_FORMAT, "is not a file name");
        test::write_file(dir / "model.safetensors.index.json", std::string("{\"weight_map\": {"));
        CHECK_FAILS_WITH([&] { SafetensorsSource::open_dir(dir.path()); }, SPARK_ERR_INVALID_FORMAT, "invalid JSON");
    }
}

TEST_CASE("safetensors: deep JSON nesting and random corruption never crash") {
    TempDir dir;
    std::string deep = R"({"w": )";
    for (int i = 0; i < 200000; ++i) deep += "[";
    for (int i = 0; i < 200000; ++i) deep += "]";
    deep += "}";
    test::write_file(dir / "deep.safetensors", st_bytes(deep, {}));
    CHECK_FAILS_WITH([&] { SafetensorsFile::open(dir / "deep.safetensors"); }, SPARK_ERR_INVALID_FORMAT, "lacks dtype/shape/data_offsets");

    const std::vector<uint8_t> valid = st_bytes(kValidHeader, counting(20));
    std::mt19937               rng(99);
    int                        errors = 0, parsed = 0;
    for (int iter = 0; iter < 3000; ++iter) {
        std::vector<uint8_t> b = valid;
        const size_t         at = rng() % b.size();
        uint8_t              v  = uint8_t(rng());
        if (v == b[at]) v ^= 0x55;
        b[at] = v;
        test::write_file(dir / "fuzz.safetensors", b);
        try {
            auto f = SafetensorsFile::open(dir / "fuzz.safetensors");
            // Touch every byte a parsed tensor claims (the sanitizer build catches reads outside).
            for (const TensorInfo & t : f->tensors()) {
                CHECK(t.nbytes <= b.size());
                volatile uint8_t sum = 0;
                for (size_t i = 0; i < t.nbytes; ++i) sum = sum + t.data[i];
            }
            ++parsed;
        } catch (const Error & e) {
            CHECK((e.status() == SPARK_ERR_INVALID_FORMAT || e.status() == SPARK_ERR_UNSUPPORTED));
            ++errors;
        }
    }
    MESSAGE("safetensors corruptions: " << errors << " rejected, " << parsed << " parsed");
    CHECK(errors > 500);
}
