#include "io/tensor_source.h"

#include "common/error.h"

namespace spark::io {

std::string TensorInfo::shape_str() const {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(shape[i]);
    }
    return s + "]";
}

const TensorInfo & TensorSource::get(const std::string & name) const {
    const TensorInfo * t = find(name);
    if (!t) fail(SPARK_ERR_MISSING_TENSOR, "tensor '%s' not found in %s", name.c_str(), describe().c_str());
    return *t;
}

}  // namespace spark::io
