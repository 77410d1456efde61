// A read-only set of named checkpoint tensors: a Hugging Face safetensors directory (one file or a
// sharded index) or a spark (GGUF) file. Loaders see only this interface, so both containers go
// through the same weight resolution and give identical models.
#pragma once

#include "graph/dtype.h"

#include <cstdint>
#include <string>
#include <vector>

namespace spark::io {

class MappedFile;

struct TensorInfo {
    std::string          name;
    DType                dtype = DType::F32;
    std::vector<int64_t> shape;         // PyTorch order (outermost first); {} for a scalar
    const uint8_t *      data = nullptr;  // inside a mapping owned by the source; may be unaligned
    size_t               nbytes = 0;

    int64_t numel() const {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        return n;
    }
    std::string shape_str() const;
};

class TensorSource {
public:
    virtual ~TensorSource() = default;
    // nullptr when absent.
    virtual const TensorInfo *               find(const std::string & name) const = 0;
    virtual const std::vector<TensorInfo> &  tensors() const = 0;
    // Human-readable origin for error messages.
    virtual std::string                      describe() const = 0;
    // The mapped files every TensorInfo::data points into.
    virtual std::vector<const MappedFile *>  files() const = 0;

    bool has(const std::string & name) const { return find(name) != nullptr; }
    // Throws Error(SPARK_ERR_MISSING_TENSOR).
    const TensorInfo & get(const std::string & name) const;
};

}  // namespace spark::io
