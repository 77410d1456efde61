#include "runtime/models/arch.h"

#include "common/error.h"
#include "common/parallel.h"
#include "io/mapped_file.h"

#include <cstring>

#include <algorithm>

namespace spark {

std::unique_ptr<Architecture> make_qwen3();
std::unique_ptr<Architecture> make_qwen3_moe();
std::unique_ptr<Architecture> make_qwen3_next();
std::unique_ptr<Architecture> make_minimax_m2();

namespace {

// The one list of architectures: adding one is a file and a line here.
using Factory = std::unique_ptr<Architecture> (*)();
constexpr Factory kFactories[] = {make_qwen3, make_qwen3_moe, make_qwen3_next, make_minimax_m2};

struct Registry {
    std::vector<std::unique_ptr<Architecture>> owned;
    std::vector<const Architecture *>          list;
    Registry() {
        for (Factory f : kFactories) {
            owned.push_back(f());
            list.push_back(owned.back().get());
        }
    }
};

const Registry & registry() {
    static const Registry r;
    return r;
}

}  // namespace

const std::vector<const Architecture *> & architectures() { return registry().list; }

const Architecture * find_architecture(const std::string & t) {
    for (const Architecture * a : architectures())
        if (t == a->model_type()) return a;
    return nullptr;
}

const Architecture & architecture_of(const std::string & t) {
    if (const Architecture * a = find_architecture(t)) return *a;
    fail(SPARK_ERR_UNSUPPORTED, "architecture '%s' is not supported (supported: %s)", t.c_str(), architecture_names().c_str());
}

std::string architecture_names() {
    std::string s;
    for (const Architecture * a : architectures()) s += (s.empty() ? "" : ", ") + std::string(a->model_type());
    return s;
}

std::unique_ptr<Architecture> make_architecture(const std::string & model_type) {
    const auto & list = architectures();
    for (size_t i = 0; i < list.size(); ++i)
        if (model_type == list[i]->model_type()) return kFactories[i]();
    fail(SPARK_ERR_UNSUPPORTED, "architecture '%s' is not supported (supported: %s)", model_type.c_str(), architecture_names().c_str());
}

SyntheticTensor::Init Architecture::synthetic_param_init(const std::string &) const { return SyntheticTensor::Init::Norm; }

QWeight ModelLoader::count(const QWeight & w, uint64_t * counter) {
    n_params_ += w.n * w.k;
    if (counter) *counter += qweight_bytes(w).total();
    return w;
}

namespace {

// Host bytes behind the loader's pointers: positioned reads of the checkpoint's files for pointers
// into their mappings (nothing of the mapping is touched), plain copies for converted host buffers.
class SourceReader final : public HostReader {
public:
    explicit SourceReader(const io::TensorSource & source) : files_(source.files()) {}
    void read(void * dst, const void * src, size_t bytes) const override {
        for (const io::MappedFile * f : files_)
            if (f->contains(src)) {
                const size_t offset = size_t(static_cast<const uint8_t *>(src) - f->data());
                f->read_at(dst, offset, bytes);
                return;
            }
        std::memcpy(dst, src, bytes);
    }
    void prefetch(const void * src, size_t bytes) const override {
        for (const io::MappedFile * f : files_)
            if (f->contains(src)) {
                f->prefetch(size_t(static_cast<const uint8_t *>(src) - f->data()), bytes);
                return;
            }
    }
    // The checkpoint's mappings live as long as the model (Model::source).
    Mapping mapping(const void * src, size_t size) const override {
        for (const io::MappedFile * f : files_)
            if (f->contains(src) && size <= f->size() - size_t(static_cast<const uint8_t *>(src) - f->data())) return {f->data(), f->size()};
        return {};
    }

private:
    std::vector<const io::MappedFile *> files_;
};

}  // namespace

CheckpointLoader::CheckpointLoader(Model & model, WeightResolver & resolver, const spark_model_params & params)
    : ModelLoader(model, params), resolver_(resolver), reader_(std::make_unique<SourceReader>(*model.source)),
      batch_(model.backend->begin_weights(model.storage, params.n_threads, reader_.get())) {
    report(0, 0);  // before any work: the total is known once every tensor is resolved
    // The resolver reads some tensors on the host through the mapping: vectors (norms, g_idx to
    // check), GPTQ zero points (to recognise symmetric ones) and the scales of FP8 / pack-quantized
    // weights (converted). Ask for them all now, so that a cold start does
    // not fault them in one at a time.
    auto host_read = [](const io::TensorInfo & t) {
        const auto ends = [&](const char * s) { return t.name.size() >= std::strlen(s) && t.name.compare(t.name.size() - std::strlen(s), std::string::npos, s) == 0; };
        return t.shape.size() <= 1 || ends("qzeros") || ends("weight_scale_inv") || (ends("weight_scale") && t.dtype != DType::F8_E4M3);
    };
    const auto files = model.source->files();
    for (const io::TensorInfo & t : model.source->tensors())
        if (host_read(t))
            for (const io::MappedFile * f : files)
                if (f->contains(t.data)) f->prefetch(size_t(t.data - f->data()), t.nbytes);
}

CheckpointLoader::~CheckpointLoader() = default;

int64_t Cut::length(int64_t whole) const {
    if (none()) return whole;
    int64_t n = 0;
    for (const Range & r : ranges) n += r.size();
    return n;
}

QWeight CheckpointLoader::cut(const QWeight & whole, const Cut & c) {
    if (c.none()) return whole;
    if (c.dim == Cut::Dim::Rows) {
        std::vector<RowRange> rows;
        for (const Range & r : c.ranges) rows.push_back({r.begin, r.end});
        return slice_rows(whole, rows, model_.slices);
    }
    SPARK_ASSERT(c.ranges.size() == 1);
    return slice_cols(whole, c.ranges[0].begin, c.ranges[0].end, model_.slices);
}

QWeight CheckpointLoader::linear(const std::string & module, int64_t n, int64_t k, uint64_t * counter, const Cut & c) {
    return batch_->add(count(cut(resolver_.linear(module, n, k), c), counter));
}

// Resolution only reads the checkpoint (shapes, dtypes, zero points, g_idx), so the specs resolve on
// several threads; the backend takes them in order, as from linear() one by one.
std::vector<QWeight> CheckpointLoader::linears(const std::vector<LinearSpec> & specs, uint64_t * counter) {
    std::vector<QWeight> out(specs.size());
    parallel_for(specs.size(), load_threads(params_.n_threads), [&](size_t i) { out[i] = resolver_.linear(specs[i].module, specs[i].n, specs[i].k); });
    for (size_t i = 0; i < out.size(); ++i) out[i] = batch_->add(count(cut(out[i], specs[i].cut), counter));
    return out;
}

QWeight CheckpointLoader::dense(const std::string & name, int64_t n, int64_t k, uint64_t * counter) {
    return batch_->add(count(resolver_.dense(name, n, k), counter));
}

Param CheckpointLoader::param(const std::string & name, std::initializer_list<int64_t> hf_shape, uint64_t * counter) {
    return param_from(name, resolver_.f32(name, hf_shape), hf_shape, counter);
}

std::vector<float> CheckpointLoader::param_values(const std::string & name, std::initializer_list<int64_t> hf_shape) {
    return resolver_.f32(name, hf_shape);
}

Param ModelLoader::param(const std::string & name, std::initializer_list<int64_t> hf_shape, uint64_t * counter, const Cut & c) {
    if (c.none()) return param(name, hf_shape, counter);
    const std::vector<float> whole = param_values(name, hf_shape);
    std::vector<int64_t>     shape(hf_shape);
    const int64_t            inner = shape[0] ? int64_t(whole.size()) / shape[0] : 0;
    std::vector<float>       part;
    for (const Range & r : c.ranges) {
        SPARK_ASSERT(r.begin >= 0 && r.end <= shape[0] && r.begin < r.end);
        part.insert(part.end(), whole.begin() + r.begin * inner, whole.begin() + r.end * inner);
    }
    shape[0] = c.length(shape[0]);
    return param_from(name, part, shape, counter);
}

void * CheckpointLoader::store(const void * host, size_t bytes) { return batch_->add_copy(host, bytes); }

void CheckpointLoader::finish() {
    const uint64_t total = batch_->bytes();
    report(0, total);
    batch_->commit(*reader_, [this](uint64_t done, uint64_t all) {
        report(done, all);
        return true;
    });
    model_.info.weight_bytes_in_place = batch_->bytes_in_place();
}

std::vector<QWeight> ModelLoader::linears(const std::vector<LinearSpec> & specs, uint64_t * counter) {
    std::vector<QWeight> out;
    for (const LinearSpec & s : specs) out.push_back(linear(s.module, s.n, s.k, counter, s.cut));
    return out;
}

void * ModelLoader::store(const void * host, size_t bytes) {
    auto buf = model_.backend->alloc(bytes);
    model_.backend->upload(buf->data(), host, bytes);
    void * p = buf->data();
    model_.storage.push_back(std::move(buf));
    return p;
}

std::vector<int64_t> ModelLoader::ggml_dims(const std::string & name, std::initializer_list<int64_t> hf_shape) {
    return ggml_dims(name, std::vector<int64_t>(hf_shape));
}

std::vector<int64_t> ModelLoader::ggml_dims(const std::string & name, const std::vector<int64_t> & hf_shape) {
    std::vector<int64_t> ne(hf_shape.begin(), hf_shape.end());
    std::reverse(ne.begin(), ne.end());
    std::vector<int64_t> compact;
    for (int64_t d : ne)
        if (d != 1 || compact.empty()) compact.push_back(d);
    if (compact.size() > 2) fail(SPARK_ERR_INTERNAL, "parameter '%s' has more than 2 non-unit dims", name.c_str());
    return compact;
}

Param ModelLoader::param_from(const std::string & name, const std::vector<float> & values, std::initializer_list<int64_t> hf_shape,
                              uint64_t * counter) {
    return param_from(name, values, std::vector<int64_t>(hf_shape), counter);
}

Param ModelLoader::param_from(const std::string & name, const std::vector<float> & values, const std::vector<int64_t> & hf_shape,
                              uint64_t * counter) {
    Param p{store(values.data(), values.size() * sizeof(float)), ggml_dims(name, hf_shape)};
    n_params_ += int64_t(values.size());
    if (counter) *counter += values.size() * sizeof(float);
    return p;
}

}  // namespace spark

namespace spark {

void ModelLoader::report(uint64_t done, uint64_t total) {
    const float fraction = total ? float(double(done) / double(total)) : 0.0f;
    if (params_.progress_callback && !params_.progress_callback(fraction, params_.progress_callback_user_data))
        fail(SPARK_ERR_ABORTED, "model loading was cancelled by the progress callback");
    if (params_.load_progress && !params_.load_progress(done, total, params_.load_progress_user_data))
        fail(SPARK_ERR_ABORTED, "model loading was cancelled by the progress callback");
}

}  // namespace spark
