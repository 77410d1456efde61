// Maps the tensors of one checkpoint module (e.g. "model.layers.3.mlp.down_proj") onto a canonical
// QWeight, deciding the format from the tensors actually present and their dtypes — not only from
// exclude lists, which are known to be incomplete (formats.md section 9). Every shape and dtype is
// validated against the expected [N, K] before a pointer is trusted. Layouts are used in place from
// the mapped file when they already are canonical (and aligned); otherwise they are converted
// losslessly into buffers owned by a HostStore.
#pragma once

#include "io/tensor_source.h"
#include "quant/qweight.h"
#include "runtime/quant_config.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace spark {

// Owned host buffers backing converted weights; lives as long as the model. alloc() may be called
// from several threads.
class HostStore {
public:
    void * alloc(size_t bytes);
    size_t bytes() const { return bytes_; }

private:
    std::mutex                              mutex_;
    std::vector<std::unique_ptr<uint8_t[]>> blobs_;
    size_t                                  bytes_ = 0;
};

// Resolution only reads the source and allocates from the store: every method may be called from
// several threads at once (a MoE layer's experts are resolved in parallel).
class WeightResolver {
public:
    WeightResolver(const io::TensorSource & src, const QuantConfig & qc, HostStore & store)
        : src_(src), qc_(qc), store_(store), files_(src.files()) {}

    // The Linear weight of `module` with logical shape [n, k]. Throws SPARK_ERR_MISSING_TENSOR,
    // SPARK_ERR_SHAPE_MISMATCH, SPARK_ERR_INVALID_FORMAT (wrong dtypes), SPARK_ERR_UNSUPPORTED.
    QWeight linear(const std::string & module, int64_t n, int64_t k);

    // A dense (F32/F16/BF16) matrix such as the token embedding, [n, k].
    QWeight dense(const std::string & name, int64_t n, int64_t k);

    // A small parameter (norm weights, biases, A_log, conv kernels) converted to float32, checked
    // against `shape` (numel must match; a size-1 middle dim such as conv1d's [C, 1, K] is allowed).
    std::vector<float> f32(const std::string & name, std::initializer_list<int64_t> shape);

    bool has(const std::string & name) const { return src_.has(name); }
    bool has_module(const std::string & module) const;

private:
    const void * aligned(const io::TensorInfo & t, size_t alignment);
    QWeight nvfp4(const std::string & m, const io::TensorInfo & packed, const io::TensorInfo & scale, float global, int64_t n, int64_t k);
    QWeight int4_gptq(const std::string & m, int64_t n, int64_t k);
    QWeight int4_awq(const std::string & m, int64_t n, int64_t k);
    QWeight int4_ct_packed(const std::string & m, int64_t n, int64_t k);
    QWeight fp8(const std::string & m, const io::TensorInfo & w, const io::TensorInfo & scale, int64_t n, int64_t k);
    float   scalar_f32(const io::TensorInfo & t);
    float   activation_scale(const io::TensorInfo & t);
    std::vector<uint8_t> read_small(const io::TensorInfo & t) const;

    const io::TensorSource &                  src_;
    const QuantConfig &                       qc_;
    HostStore &                               store_;
    const std::vector<const io::MappedFile *> files_;
};

}  // namespace spark
