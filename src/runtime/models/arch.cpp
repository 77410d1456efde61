#include "runtime/models/arch.h"

#include "graph/error.h"

#include <algorithm>

namespace spark {

std::unique_ptr<Architecture> make_qwen3();
std::unique_ptr<Architecture> make_qwen3_moe();
std::unique_ptr<Architecture> make_qwen3_next();

std::unique_ptr<Architecture> make_architecture(const std::string & model_type) {
    if (model_type == "qwen3") return make_qwen3();
    if (model_type == "qwen3_moe") return make_qwen3_moe();
    if (model_type == "qwen3_next") return make_qwen3_next();
    fail(SPARK_ERR_UNSUPPORTED, "architecture '%s' is not supported", model_type.c_str());
}

QWeight ModelLoader::count(const QWeight & w, uint64_t * counter) {
    n_params_ += w.n * w.k;
    if (counter) *counter += qweight_bytes(w).total();
    return w;
}

QWeight CheckpointLoader::linear(const std::string & module, int64_t n, int64_t k, uint64_t * counter) {
    QWeight host = count(resolver_.linear(module, n, k), counter);
    return model_.backend->prepare_weight(host, model_.storage);
}

QWeight CheckpointLoader::dense(const std::string & name, int64_t n, int64_t k, uint64_t * counter) {
    QWeight host = count(resolver_.dense(name, n, k), counter);
    return model_.backend->prepare_weight(host, model_.storage);
}

Param CheckpointLoader::param(const std::string & name, std::initializer_list<int64_t> hf_shape, uint64_t * counter) {
    return param_from(name, resolver_.f32(name, hf_shape), hf_shape, counter);
}

Param ModelLoader::param_from(const std::string & name, const std::vector<float> & values, std::initializer_list<int64_t> hf_shape,
                              uint64_t * counter) {
    std::vector<int64_t> ne(hf_shape.begin(), hf_shape.end());
    std::reverse(ne.begin(), ne.end());
    // Collapse to at most 2 dims (conv1d's [C, 1, K] becomes ne = {K, C}).
    std::vector<int64_t> compact;
    for (int64_t d : ne)
        if (d != 1 || compact.empty()) compact.push_back(d);
    if (compact.size() > 2) fail(SPARK_ERR_INTERNAL, "parameter '%s' has more than 2 non-unit dims", name.c_str());
    auto buf = model_.backend->alloc(values.size() * sizeof(float));
    model_.backend->upload(buf->data(), values.data(), values.size() * sizeof(float));
    Param p{buf->data(), std::move(compact)};
    n_params_ += int64_t(values.size());
    if (counter) *counter += values.size() * sizeof(float);
    model_.storage.push_back(std::move(buf));
    return p;
}

}  // namespace spark

namespace spark {

void ModelLoader::progress(float fraction) {
    if (params_.progress_callback && !params_.progress_callback(fraction, params_.progress_callback_user_data))
        fail(SPARK_ERR_ABORTED, "model loading was cancelled by the progress callback");
}

}  // namespace spark
