// safetensors reader (https://github.com/huggingface/safetensors): validated like the reference
// implementation before anything is trusted (header size, JSON, dtypes, shapes vs byte sizes,
// offsets inside the file, no overlaps or holes, duplicate names). Single files and sharded
// directories (model.safetensors.index.json).
#pragma once

#include "io/mapped_file.h"
#include "io/tensor_source.h"

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace spark::io {

class SafetensorsFile {
public:
    // Throws Error(SPARK_ERR_IO / SPARK_ERR_INVALID_FORMAT / SPARK_ERR_UNSUPPORTED).
    static std::unique_ptr<SafetensorsFile> open(const std::string & path);

    const std::vector<TensorInfo> &              tensors() const { return tensors_; }
    const std::map<std::string, std::string> &   metadata() const { return metadata_; }
    const std::string &                          path() const { return file_->path(); }
    const MappedFile &                           mapping() const { return *file_; }

private:
    friend class SafetensorsSource;  // takes the tensors over
    std::shared_ptr<MappedFile>        file_;
    std::vector<TensorInfo>            tensors_;
    std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint directory: model.safetensors, or the shards listed by
// model.safetensors.index.json (every listed tensor must be in its shard).
class SafetensorsSource final : public TensorSource {
public:
    static std::unique_ptr<SafetensorsSource> open_dir(const std::string & dir);
    static std::unique_ptr<SafetensorsSource> open_file(const std::string & path);
    SafetensorsSource(const SafetensorsSource &)             = delete;  // the index views the names
    SafetensorsSource & operator=(const SafetensorsSource &) = delete;

    const TensorInfo *              find(const std::string & name) const override;
    const std::vector<TensorInfo> & tensors() const override { return all_; }
    std::string                     describe() const override { return origin_; }
    std::vector<const MappedFile *> files() const override;
    // The files the tensors are read from (the shards, or the one file).
    std::vector<std::string>        file_paths() const;

private:
    SafetensorsSource() = default;
    void take(std::vector<std::unique_ptr<SafetensorsFile>> files);
    std::vector<std::unique_ptr<SafetensorsFile>>    files_;  // their tensors moved to all_
    std::vector<TensorInfo>                          all_;
    std::unordered_map<std::string_view, size_t>     index_;  // views of all_'s names
    std::string                                   origin_;
};

}  // namespace spark::io
