// The reading side of the spark file (gguf.h): what loading a model needs.
#pragma once

#include "io/gguf.h"
#include "io/mapped_file.h"

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace spark::io {

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

}  // namespace spark::io
