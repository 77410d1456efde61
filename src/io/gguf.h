// The spark file: a GGUF v3 container (docs/FORMAT.md is the specification) holding hyper-parameters,
// tokenizer, chat template, quantization provenance and every checkpoint tensor in its native
// Hugging Face layout, 64-byte aligned and mmap-able.
//
//   gguf.h               the format, shared by both sides: constants, keys, the dtype registry,
//                        metadata values, how a PyTorch shape is laid out as GGUF dimensions.
//   gguf_reader.h        GgufFile (validating reader over a MappedFile; typed metadata getters) and
//                        GgufSource (a TensorSource over a GgufFile): what loading needs.
//   writer/gguf_writer.h GgufWriter (streaming writer, temporary file renamed on success): for
//                        spark-convert and the tests, in the component spark_io_writer, not in libspark.
//
// Errors are spark::Error: SPARK_ERR_IO (missing/unwritable file), SPARK_ERR_INVALID_FORMAT (anything
// malformed or hostile), SPARK_ERR_UNSUPPORTED (unknown tensor type id, dtype id or future version),
// SPARK_ERR_INVALID_ARGUMENT (writer misuse), SPARK_ERR_ABORTED (the writer's callback said stop).
#pragma once

#include "io/tensor_source.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace spark::io {

// The file is little-endian and values are copied straight out of the mapping.
static_assert(std::endian::native == std::endian::little, "spark's GGUF code assumes a little-endian host");

// ---- constants ---------------------------------------------------------------------------------

constexpr uint32_t kGgufMagic            = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kGgufVersion          = 3;
constexpr uint32_t kGgufDefaultAlignment = 32;          // when general.alignment is absent
constexpr uint32_t kSparkAlignment       = 64;          // what GgufWriter writes
constexpr uint32_t kSparkFormatVersion   = 1;           // spark.format_version this build writes/reads
constexpr size_t   kGgufMaxDims          = 4;           // GGML_MAX_DIMS
constexpr size_t   kSparkMaxTensorName   = 63;          // GGML_MAX_NAME - 1: stock readers reject longer
constexpr size_t   kSparkMaxRank         = 8;           // PyTorch rank a spark file can describe
constexpr size_t   kGgufMaxArrayDepth    = 4;           // nested arrays the reader follows
constexpr uint64_t kGgufMaxKeyBytes      = 65535;       // GGUF spec

// Reserved metadata keys (docs/FORMAT.md lists all keys).
namespace gguf_key {
constexpr const char * kArchitecture         = "general.architecture";
constexpr const char * kAlignment            = "general.alignment";
constexpr const char * kName                 = "general.name";
constexpr const char * kFormatVersion        = "spark.format_version";
constexpr const char * kTensorDtypes         = "spark.tensor_dtypes";
constexpr const char * kTensorShapes         = "spark.tensor_shapes";
constexpr const char * kHfConfigJson         = "spark.hf_config_json";
constexpr const char * kQuantization         = "spark.quantization";
constexpr const char * kTokenizerConfigJson  = "spark.tokenizer_config_json";
constexpr const char * kGenerationConfigJson = "spark.generation_config_json";
constexpr const char * kTokenizerHfJson      = "tokenizer.huggingface.json";
constexpr const char * kChatTemplate         = "tokenizer.chat_template";
}  // namespace gguf_key

// ggml tensor type ids (ggml.h `enum ggml_type`) of the plain layouts spark reads and writes.
namespace ggml_type {
constexpr uint32_t kF32  = 0;
constexpr uint32_t kF16  = 1;
constexpr uint32_t kI8   = 24;
constexpr uint32_t kI16  = 25;
constexpr uint32_t kI32  = 26;
constexpr uint32_t kI64  = 27;
constexpr uint32_t kF64  = 28;
constexpr uint32_t kBF16 = 30;
}  // namespace ggml_type

// ---- dtype registry ----------------------------------------------------------------------------
// Stable numbers stored in spark.tensor_dtypes (docs/FORMAT.md "dtype registry"); never reused.
uint32_t             spark_dtype_id(DType t);
std::optional<DType> dtype_from_spark_id(uint32_t id);  // nullopt for an unregistered id
// The ggml type a tensor of `t` is stored as: its own where ggml has the layout, else I8 over the bytes.
uint32_t             ggml_type_for(DType t);
// ggml's name for a type id ("F32", "Q4_K", ...); "?" when unknown.
const char *         ggml_type_name(uint32_t ggml_type);

// ---- metadata values ---------------------------------------------------------------------------

enum class GgufType : uint32_t {
    UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
    STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
constexpr uint32_t kGgufTypeCount = 13;
const char * gguf_type_name(GgufType t);
// Size of a fixed-size GGUF value type; 0 for STRING and ARRAY.
size_t       gguf_fixed_size(GgufType t);

class GgufValue;

// An array value: one element type; the elements live in the member that type selects.
struct GgufArray {
    GgufType                 elem_type = GgufType::UINT8;
    std::vector<uint8_t>     raw;      // fixed-size element types: little-endian bytes, as in the file
    std::vector<std::string> strings;  // STRING
    std::vector<GgufValue>   arrays;   // ARRAY (nested; the writer refuses them, ggml cannot read them)
    size_t                   count = 0;

    size_t    size() const { return count; }
    GgufValue element(size_t i) const;  // element i of a fixed-size array, as a scalar value
    bool      operator==(const GgufArray & o) const;
};

class GgufValue {
public:
    // The alternatives are in GgufType order, so index() is the type id.
    using Storage = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                                 std::string, GgufArray, uint64_t, int64_t, double>;

    GgufValue() : v_(uint8_t(0)) {}
    template <typename T, typename = std::enable_if_t<std::is_constructible_v<Storage, T>>>
    explicit GgufValue(T v) : v_(std::move(v)) {}
    explicit GgufValue(const char * s) : v_(std::string(s)) {}

    // Arrays of fixed-size elements (uint8_t ... double, bool) and of strings.
    template <typename T> static GgufValue array(const std::vector<T> & elems);
    static GgufValue string_array(std::vector<std::string> elems);
    static GgufValue array_of_arrays(std::vector<GgufValue> elems);  // every element must be an array

    GgufType          type() const { return GgufType(v_.index()); }
    const Storage &   storage() const { return v_; }
    template <typename T> const T * get_if() const { return std::get_if<T>(&v_); }
    const std::string * as_string() const { return std::get_if<std::string>(&v_); }
    const GgufArray *   as_array() const { return std::get_if<GgufArray>(&v_); }

    // Any integer type (not BOOL) as int64 / uint64; nullopt for other types or when out of range.
    std::optional<int64_t>  to_i64() const;
    std::optional<uint64_t> to_u64() const;
    // FLOAT32 or FLOAT64.
    std::optional<double>   to_f64() const;

    // For listings: numbers, quoted strings (cut at `max_chars`), arrays as [a, b, ... (n items)].
    std::string to_display_string(size_t max_chars = 60) const;

    bool operator==(const GgufValue & o) const { return v_ == o.v_; }

private:
    Storage v_;
};

template <typename T> constexpr bool kIsGgufFixed =
    std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t> || std::is_same_v<T, uint16_t> ||
    std::is_same_v<T, int16_t> || std::is_same_v<T, uint32_t> || std::is_same_v<T, int32_t> ||
    std::is_same_v<T, float> || std::is_same_v<T, bool> || std::is_same_v<T, uint64_t> ||
    std::is_same_v<T, int64_t> || std::is_same_v<T, double>;

template <typename T> GgufValue GgufValue::array(const std::vector<T> & elems) {
    static_assert(kIsGgufFixed<T>, "GgufValue::array takes fixed-size GGUF element types; use string_array");
    GgufArray a;
    a.elem_type = GgufValue(T{}).type();
    a.count     = elems.size();
    a.raw.resize(elems.size() * sizeof(T));
    for (size_t i = 0; i < elems.size(); ++i) {
        T v = elems[i];
        if constexpr (std::is_same_v<T, bool>) a.raw[i] = v ? 1 : 0;
        else std::memcpy(a.raw.data() + i * sizeof(T), &v, sizeof(T));
    }
    return GgufValue(std::move(a));
}

// A value stored little-endian at `p` (any alignment).
template <typename T> T load_le(const uint8_t * p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

// ---- tensor layout -----------------------------------------------------------------------------

// How a PyTorch shape is laid out as GGUF dims (docs/FORMAT.md "Dimensions"): scalars become [1],
// ranks above 4 fold their outer dimensions into one, the order is reversed, and a dtype stored as
// ggml I8 over its bytes has ne[0] in bytes. nullopt on overflow.
std::optional<std::vector<int64_t>> gguf_dims_of(const std::vector<int64_t> & shape, DType dtype);
// The PyTorch shape GGUF dims stand for when no spark.tensor_shapes record overrides it; nullopt
// when ne[0] of a byte-stored dtype is not a whole number of elements.
std::optional<std::vector<int64_t>> shape_of_gguf_dims(const std::vector<int64_t> & ne, DType dtype);
// The bytes of a tensor of `shape`; nullopt for a negative dimension or when the size overflows.
std::optional<uint64_t>             tensor_nbytes(const std::vector<int64_t> & shape, DType dtype);

inline uint64_t align_up(uint64_t x, uint64_t alignment) { return (x + alignment - 1) / alignment * alignment; }

// A size for "%llu" in messages.
inline unsigned long long ull(uint64_t v) { return (unsigned long long) v; }

}  // namespace spark::io
