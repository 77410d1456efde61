// The spark file: a GGUF v3 container (docs/FORMAT.md is the specification) holding hyper-parameters,
// tokenizer, chat template, quantization provenance and every checkpoint tensor in its native
// Hugging Face layout, 64-byte aligned and mmap-able.
//
//   GgufFile    validating reader over a MappedFile; typed metadata getters.
//   GgufSource  a TensorSource over a GgufFile (same interface as a safetensors directory).
//   GgufWriter  streaming writer: metadata + tensor descriptors up front, then the data of one
//               tensor at a time from a callback, into a temporary file renamed on success.
//
// Errors are spark::Error: SPARK_ERR_IO (missing/unwritable file), SPARK_ERR_INVALID_FORMAT (anything
// malformed or hostile), SPARK_ERR_UNSUPPORTED (unknown tensor type id, dtype id or future version),
// SPARK_ERR_INVALID_ARGUMENT (writer misuse), SPARK_ERR_ABORTED (the writer's callback said stop).
#pragma once

#include "io/mapped_file.h"
#include "io/tensor_source.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

namespace spark::io {

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

class GgufValue;

// An array value: one element type; the elements live in the member that type selects.
struct GgufArray {
    GgufType                 elem_type = GgufType::UINT8;
    std::vector<uint8_t>     raw;      // fixed-size element types: little-endian bytes, as in the file
    std::vector<std::string> strings;  // STRING
    std::vector<GgufValue>   arrays;   // ARRAY (nested; the writer refuses them, ggml cannot read them)
    size_t                   count = 0;

    size_t size() const { return count; }
    bool   operator==(const GgufArray & o) const;
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

// ---- reader ------------------------------------------------------------------------------------

// One tensor as the GGUF header describes it.
struct GgufTensorInfo {
    std::string          name;
    uint32_t             ggml_type = 0;
    std::vector<int64_t> ne;          // GGUF order: ne[0] is the fastest-varying dimension
    uint64_t             offset = 0;  // relative to the data section
    uint64_t             nbytes = 0;
};

class GgufFile {
public:
    // Validates the whole header (docs/FORMAT.md "Validation") before returning.
    static std::unique_ptr<GgufFile> open(const std::string & path);
    GgufFile(const GgufFile &)             = delete;  // the index views the names
    GgufFile & operator=(const GgufFile &) = delete;

    const std::string & path() const { return file_->path(); }
    uint32_t            version() const { return version_; }
    uint32_t            alignment() const { return alignment_; }
    uint64_t            data_offset() const { return data_offset_; }  // file offset of the data section
    // True when the file carries spark.format_version (then all spark keys were validated).
    bool                is_spark() const { return spark_format_version_ != 0; }
    uint32_t            spark_format_version() const { return spark_format_version_; }
    const MappedFile &  mapping() const { return *file_; }

    // Metadata in file order.
    const std::vector<std::pair<std::string, GgufValue>> & metadata() const { return kv_; }
    const GgufValue * find(const std::string & key) const;  // nullptr when absent

    // Typed getters: nullopt when the key is absent; Error(SPARK_ERR_INVALID_FORMAT) when it is
    // present with another type or a value out of the requested range. Integer getters accept any
    // GGUF integer type (writers differ: gguf-py writes UINT32 where the spec says UINT64); float
    // getters accept FLOAT32 and FLOAT64.
    std::optional<std::string>              get_string(const std::string & key) const;
    std::optional<uint32_t>                 get_u32(const std::string & key) const;
    std::optional<int32_t>                  get_i32(const std::string & key) const;
    std::optional<uint64_t>                 get_u64(const std::string & key) const;
    std::optional<int64_t>                  get_i64(const std::string & key) const;
    std::optional<float>                    get_f32(const std::string & key) const;
    std::optional<double>                   get_f64(const std::string & key) const;
    std::optional<bool>                     get_bool(const std::string & key) const;
    std::optional<std::vector<std::string>> get_string_array(const std::string & key) const;
    std::optional<std::vector<int64_t>>     get_i64_array(const std::string & key) const;  // integer elements
    std::optional<std::vector<double>>      get_f64_array(const std::string & key) const;  // float elements

    // Tensors in header order: raw GGUF view, and spark's view (dtype, PyTorch shape, data pointer).
    const std::vector<GgufTensorInfo> & gguf_tensors() const { return raw_tensors_; }
    const std::vector<TensorInfo> &     tensors() const { return tensors_; }
    const TensorInfo *                  find_tensor(const std::string & name) const;

private:
    GgufFile() = default;
    void parse();
    void resolve_tensors();

    std::shared_ptr<MappedFile>                    file_;
    uint32_t                                       version_ = 0;
    uint32_t                                       alignment_ = kGgufDefaultAlignment;
    uint64_t                                       data_offset_ = 0;
    uint32_t                                       spark_format_version_ = 0;
    std::vector<std::pair<std::string, GgufValue>> kv_;
    std::unordered_map<std::string, size_t>        kv_index_;
    std::vector<GgufTensorInfo>                    raw_tensors_;
    std::vector<TensorInfo>                        tensors_;
    std::unordered_map<std::string_view, size_t>   tensor_index_;  // views of raw_tensors_'s names
};

// The tensors of a spark (or plain GGUF) file for the loaders.
class GgufSource final : public TensorSource {
public:
    static std::unique_ptr<GgufSource> open(const std::string & path);
    explicit GgufSource(std::unique_ptr<GgufFile> file) : file_(std::move(file)) {}

    const TensorInfo *              find(const std::string & name) const override { return file_->find_tensor(name); }
    const std::vector<TensorInfo> & tensors() const override { return file_->tensors(); }
    std::string                     describe() const override { return file_->path(); }
    std::vector<const MappedFile *> files() const override { return {&file_->mapping()}; }

    // Metadata (hyper-parameters, tokenizer, template, provenance).
    const GgufFile & file() const { return *file_; }

private:
    std::unique_ptr<GgufFile> file_;
};

// ---- writer ------------------------------------------------------------------------------------

class GgufWriter {
public:
    struct Tensor {
        std::string          name;
        DType                dtype = DType::F32;
        std::vector<int64_t> shape;  // PyTorch order; {} for a scalar
        uint64_t             nbytes = 0;
    };

    // Receives the bytes of one tensor, in one or more pieces; together exactly Tensor::nbytes.
    class Sink {
    public:
        virtual ~Sink() = default;
        virtual void write(const void * data, size_t n) = 0;
    };

    // Called once per tensor, in add_tensor order, with the tensor's index. Returning false aborts
    // the write (Error(SPARK_ERR_ABORTED)); an exception thrown here aborts it too and propagates.
    using DataProvider = std::function<bool(size_t index, const Tensor & tensor, Sink & out)>;

    GgufWriter();

    // Adds or replaces a KV pair (first insertion fixes its position). Keys are printable ASCII
    // without spaces, at most 65535 bytes. general.alignment, spark.format_version,
    // spark.tensor_dtypes and spark.tensor_shapes are the writer's own: setting them is an error.
    // Strings must be well-formed UTF-8. Nested arrays are refused (ggml's reader rejects a whole
    // file that has one).
    void set(const std::string & key, GgufValue value);
    void set_string(const std::string & key, std::string v) { set(key, GgufValue(std::move(v))); }
    void set_u32(const std::string & key, uint32_t v) { set(key, GgufValue(v)); }
    void set_i32(const std::string & key, int32_t v) { set(key, GgufValue(v)); }
    void set_u64(const std::string & key, uint64_t v) { set(key, GgufValue(v)); }
    void set_i64(const std::string & key, int64_t v) { set(key, GgufValue(v)); }
    void set_f32(const std::string & key, float v) { set(key, GgufValue(v)); }
    void set_f64(const std::string & key, double v) { set(key, GgufValue(v)); }
    void set_bool(const std::string & key, bool v) { set(key, GgufValue(v)); }
    void set_string_array(const std::string & key, std::vector<std::string> v) { set(key, GgufValue::string_array(std::move(v))); }
    const GgufValue * find(const std::string & key) const;

    // Declares a tensor. Error(SPARK_ERR_INVALID_ARGUMENT) for an empty, duplicate, non-UTF-8 or
    // > 63-byte name, a rank above 8, a negative dimension, or nbytes != numel * dtype size.
    void add_tensor(const std::string & name, DType dtype, std::vector<int64_t> shape, uint64_t nbytes);
    const std::vector<Tensor> & tensors() const { return tensors_; }

    // Writes the file: `<path>.tmp-<pid>` first, renamed to `path` on success. On any error the
    // temporary is removed and `path` is untouched. Refuses (SPARK_ERR_IO) to replace an existing
    // `path` unless `overwrite`. Requires general.architecture and spark.hf_config_json (strings).
    // Temporaries of `path` left by writers that were killed (their process is gone) are removed.
    void write(const std::string & path, const DataProvider & provide, bool overwrite = false) const;

private:
    std::vector<std::pair<std::string, GgufValue>> kv_;
    std::unordered_map<std::string, size_t>        kv_index_;
    std::vector<Tensor>                            tensors_;
    std::unordered_map<std::string, size_t>        tensor_index_;
};

// For a SIGINT/SIGTERM handler of a program that writes spark files: removes the temporary file of
// the GgufWriter::write in progress, if any, with only async-signal-safe calls (unlink). The handler
// should then end the process (_exit) rather than return into the interrupted write. Only one write
// at a time is tracked (the first of concurrent writes); the others still clean up on errors.
void gguf_remove_temp_file_on_signal() noexcept;

}  // namespace spark::io
