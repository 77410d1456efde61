#include "op_harness.h"

#include "backends/cuda/cuda_backend.h"
#include "common/error.h"
#include "graph/planner.h"
#include "quant/formats.h"
#include "quant/quantize.h"
#include "quant/repack.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <numeric>
#include <random>

namespace test {

using namespace spark;

namespace {

// Everything one backend's build of a case owns.
class BuilderImpl final : public OpBuilder {
public:
    BuilderImpl(Backend & be, uint64_t seed) : be_(be), rng_(seed) {}

    Graph & graph() override { return g_; }

    Tensor * input(std::vector<int64_t> ne, float scale) override {
        Tensor * t = make_leaf(ne, DType::F32, /*external=*/false);
        std::vector<float> v(static_cast<size_t>(t->nelements()));
        for (float & x : v) x = normal() * scale;
        pending_.push_back({t, bytes_of(v)});
        return t;
    }

    Tensor * input_i32(std::vector<int64_t> ne, const std::vector<int32_t> & v) override {
        Tensor * t = make_leaf(ne, DType::I32, false);
        REQUIRE(size_t(t->nelements()) == v.size());
        pending_.push_back({t, bytes_of(v)});
        return t;
    }

    Tensor * param(std::vector<int64_t> ne, float scale, float offset) override {
        Tensor * t = make_leaf(ne, DType::F32, true);
        std::vector<float> v(static_cast<size_t>(t->nelements()));
        for (float & x : v) x = offset + normal() * scale;
        auto buf = be_.alloc(v.size() * 4);
        be_.upload(buf->data(), v.data(), v.size() * 4);
        t->data = buf->data();
        buffers_.push_back(std::move(buf));
        return t;
    }

    Tensor * state(std::vector<int64_t> ne, float scale, bool kv) override {
        const DType type = kv ? be_.caps().kv_type : DType::F32;
        Tensor *    t    = make_leaf(ne, type, true);
        std::vector<float> v(static_cast<size_t>(t->nelements()));
        for (float & x : v) {
            x = normal() * scale;
            // KV values are F16-representable (RNE), so the F32 cache of the CPU and the F16 cache of
            // CUDA start from identical values (|x| is far below f16's 65504).
            if (kv) x = f16_to_f32(f32_to_f16(x));
        }
        std::vector<uint8_t> bytes;
        if (type == DType::F16) {
            std::vector<uint16_t> h(v.size());
            for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_f16(v[i]);
            bytes = bytes_of(h);
        } else {
            // A BF16 cache could not hold the f16 values above exactly: the two backends would differ.
            REQUIRE_MESSAGE(type == DType::F32, "KV state of type " << dtype_name(type) << " is not supported by the harness");
            bytes = bytes_of(v);
        }
        auto buf = be_.alloc(bytes.size());
        t->data  = buf->data();
        buffers_.push_back(std::move(buf));
        states_.push_back({t, bytes});
        return t;
    }

    const QWeight & weight(int64_t n, int64_t k, const WeightSpec & spec) override {
        return *experts(1, n, k, spec);
    }

    const QWeight * experts(int32_t count, int64_t n, int64_t k, const WeightSpec & spec) override {
        return experts_held(std::vector<bool>(size_t(count), true), n, k, spec);
    }

    const QWeight * experts_held(const std::vector<bool> & held, int64_t n, int64_t k, const WeightSpec & spec) override {
        // Contiguous array of prepared weights (every expert drawn, so the generator state does not
        // depend on which are held).
        expert_sets_.emplace_back();
        auto & set = expert_sets_.back();
        set.resize(held.size());
        for (size_t e = 0; e < held.size(); ++e) {
            const QWeight w = make_host_weight(n, k, spec);
            if (held[e]) set[e] = be_.prepare_weight(w, wstorage_);
        }
        return set.data();
    }

    // ---- running
    void bind_and_upload() {
        plan_  = plan_memory(g_);
        arena_ = be_.alloc(std::max<size_t>(plan_.arena_bytes, 256));
        bind_memory(g_, plan_, arena_->data());
        upload_inputs();
    }
    void upload_inputs() {
        for (auto & p : pending_) be_.upload(p.t->data, p.bytes.data(), p.bytes.size());
        for (auto & s : states_) be_.upload(s.t->data, s.initial.data(), s.initial.size());
    }

    // A tensor's values as floats in logical order (I32 converted), read back from the backend.
    std::vector<float> read(const Tensor & t) {
        const size_t         span = t.nbytes();
        std::vector<uint8_t> raw(span);
        be_.download(raw.data(), t.data, span);
        std::vector<float> out;
        out.reserve(size_t(t.nelements()));
        for (int64_t i3 = 0; i3 < t.ne[3]; ++i3)
            for (int64_t i2 = 0; i2 < t.ne[2]; ++i2)
                for (int64_t i1 = 0; i1 < t.ne[1]; ++i1)
                    for (int64_t i0 = 0; i0 < t.ne[0]; ++i0) {
                        const uint8_t * p = raw.data() + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
                        switch (t.type) {
                            case DType::F32: {
                                float f;
                                std::memcpy(&f, p, 4);
                                out.push_back(f);
                                break;
                            }
                            case DType::I32: {
                                int32_t v;
                                std::memcpy(&v, p, 4);
                                out.push_back(float(v));
                                break;
                            }
                            case DType::BF16: {
                                uint16_t h;
                                std::memcpy(&h, p, 2);
                                out.push_back(bf16_to_f32(h));
                                break;
                            }
                            case DType::F16: {
                                uint16_t h;
                                std::memcpy(&h, p, 2);
                                out.push_back(f16_to_f32(h));
                                break;
                            }
                            default: FAIL("unsupported output dtype");
                        }
                    }
        return out;
    }

    struct State {
        Tensor *             t;
        std::vector<uint8_t> initial;
    };
    const std::vector<State> & states() const { return states_; }
    Backend &                  backend() { return be_; }

private:
    template <typename T> static std::vector<uint8_t> bytes_of(const std::vector<T> & v) {
        std::vector<uint8_t> b(v.size() * sizeof(T));
        std::memcpy(b.data(), v.data(), b.size());
        return b;
    }

    Tensor * make_leaf(const std::vector<int64_t> & ne, DType type, bool external) {
        REQUIRE((ne.size() >= 1 && ne.size() <= 4));
        Tensor * t = nullptr;
        switch (ne.size()) {
            case 1: t = external ? g_.external(type, {ne[0]}, nullptr, "leaf") : g_.input(type, {ne[0]}, "leaf"); break;
            case 2: t = external ? g_.external(type, {ne[0], ne[1]}, nullptr, "leaf") : g_.input(type, {ne[0], ne[1]}, "leaf"); break;
            case 3: t = external ? g_.external(type, {ne[0], ne[1], ne[2]}, nullptr, "leaf") : g_.input(type, {ne[0], ne[1], ne[2]}, "leaf"); break;
            default: t = external ? g_.external(type, {ne[0], ne[1], ne[2], ne[3]}, nullptr, "leaf") : g_.input(type, {ne[0], ne[1], ne[2], ne[3]}, "leaf"); break;
        }
        return t;
    }

    float normal() { return dist_(rng_); }

    // A random weight quantized by the reference quantizers (identical for both backends, since the
    // generator state is the same); kept alive in host memory for the backend's prepare_weight.
    QWeight make_host_weight(int64_t n, int64_t k, const WeightSpec & spec) {
        std::vector<float> w(static_cast<size_t>(n * k));
        for (float & x : w) x = normal() * 0.05f;
        QWeight q;
        switch (spec.format) {
            case WeightFormat::F32: {
                host_f32_.push_back(std::move(w));
                q.format = WeightFormat::F32;
                q.data   = host_f32_.back().data();
                break;
            }
            case WeightFormat::F16:
            case WeightFormat::BF16: {
                std::vector<uint16_t> h(w.size());
                for (size_t i = 0; i < w.size(); ++i) h[i] = spec.format == WeightFormat::F16 ? f32_to_f16(w[i]) : f32_to_bf16(w[i]);
                host_u16_.push_back(std::move(h));
                q.format = spec.format;
                q.data   = host_u16_.back().data();
                break;
            }
            case WeightFormat::NVFP4: {
                quantized_.push_back(quantize_nvfp4(w.data(), n, k));
                q = quantized_.back().weight;
                break;
            }
            case WeightFormat::FP8: {
                quantized_.push_back(quantize_fp8(w.data(), n, k, spec.block_n, spec.block_k == 0 ? int32_t(k) : spec.block_k));
                q = quantized_.back().weight;
                break;
            }
            case WeightFormat::INT4: {
                Int4QuantizeOptions o;
                o.group_size = spec.group_size;
                o.scheme     = spec.symmetric ? Int4Scheme::SymmetricGptq : Int4Scheme::Asymmetric;
                if (!spec.act_order) {
                    quantized_.push_back(quantize_int4(w.data(), n, k, o));
                    q = quantized_.back().weight;
                    break;
                }
                // Act-order: quantize with groups over a random permutation of the input channels,
                // then store the codes in channel order with g_idx[k] = group of channel k.
                std::vector<int64_t> perm(static_cast<size_t>(k));
                std::iota(perm.begin(), perm.end(), 0);
                std::shuffle(perm.begin(), perm.end(), rng_);
                std::vector<float> wp(w.size());
                for (int64_t r = 0; r < n; ++r)
                    for (int64_t c = 0; c < k; ++c) wp[size_t(r * k + c)] = w[size_t(r * k + perm[size_t(c)])];
                QuantizedWeight qp = quantize_int4(wp.data(), n, k, o);
                std::vector<uint8_t> codes_p(static_cast<size_t>(n * k)), codes(static_cast<size_t>(n * k));
                // Unpacked GPTQ words: element (k, n) sits at 8 * ((k / 8) * N + n) + k % 8.
                auto at = [&](int64_t kk, int64_t nn) { return size_t(8 * ((kk / 8) * n + nn) + kk % 8); };
                unpack_nibbles(reinterpret_cast<const int32_t *>(qp.data.data()), k / 8 * n, codes_p.data());
                for (int64_t c = 0; c < k; ++c)  // permuted column c is input channel perm[c]
                    for (int64_t r = 0; r < n; ++r) codes[at(perm[size_t(c)], r)] = codes_p[at(c, r)];
                std::vector<int32_t> g_idx(static_cast<size_t>(k));
                const int64_t gs = spec.group_size > 0 ? spec.group_size : k;
                for (int64_t c = 0; c < k; ++c) g_idx[size_t(perm[size_t(c)])] = int32_t(c / gs);
                pack_nibbles(codes.data(), n * k, reinterpret_cast<int32_t *>(qp.data.data()));
                host_i32_.push_back(std::move(g_idx));
                quantized_.push_back(std::move(qp));
                q        = quantized_.back().weight;
                q.data   = quantized_.back().data.data();
                q.g_idx  = host_i32_.back().data();
                break;
            }
        }
        q.n = n;
        q.k = k;
        return q;
    }

    struct Pending {
        Tensor *             t;
        std::vector<uint8_t> bytes;
    };

    Backend &                            be_;
    std::mt19937_64                      rng_;
    std::normal_distribution<float>      dist_{0.0f, 1.0f};
    Graph                                g_;
    MemoryPlan                           plan_;
    std::unique_ptr<Buffer>              arena_;
    std::vector<Pending>                 pending_;
    std::vector<State>                   states_;
    std::vector<std::unique_ptr<Buffer>> buffers_, wstorage_;
    std::deque<std::vector<QWeight>>     expert_sets_;
    std::deque<QuantizedWeight>          quantized_;
    std::deque<std::vector<float>>       host_f32_;
    std::deque<std::vector<uint16_t>>    host_u16_;
    std::deque<std::vector<int32_t>>     host_i32_;
};

double nmse(const std::vector<float> & got, const std::vector<float> & ref) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
        if (!std::isfinite(got[i]) || !std::isfinite(ref[i])) return INFINITY;
        const double d = double(got[i]) - double(ref[i]);
        num += d * d;
        den += double(ref[i]) * ref[i];
    }
    return den > 0.0 ? num / den : num;
}

}  // namespace

struct OpHarness::Impl {
    std::unique_ptr<Backend> cpu  = make_cpu_backend(0);  // all cores: the oracle runs big shapes too
    std::unique_ptr<Backend> cuda = make_cuda_backend(0);
};

OpHarness::OpHarness(uint64_t seed) : impl_(std::make_unique<Impl>()), seed_(seed) {}
OpHarness::~OpHarness() = default;
Backend & OpHarness::cpu() { return *impl_->cpu; }
Backend & OpHarness::cuda() { return *impl_->cuda; }

CheckResult OpHarness::check(const std::string & name, double max_nmse, const std::function<Tensor *(OpBuilder &)> & build) {
    return check_multi(name, max_nmse, [&](OpBuilder & b) { return std::vector<Tensor *>{build(b)}; });
}

CheckResult OpHarness::check_multi(const std::string & name, double max_nmse,
                                   const std::function<std::vector<Tensor *>(OpBuilder &)> & build) {
    CheckResult result;
    try {
        BuilderImpl cpu(*impl_->cpu, seed_), gpu(*impl_->cuda, seed_);
        auto        out_cpu = build(cpu);
        auto        out_gpu = build(gpu);
        REQUIRE(out_cpu.size() == out_gpu.size());
        for (Tensor * t : out_cpu) cpu.graph().mark_output(t);
        for (Tensor * t : out_gpu) gpu.graph().mark_output(t);
        cpu.bind_and_upload();
        gpu.bind_and_upload();
        impl_->cpu->compute(cpu.graph());
        impl_->cuda->compute(gpu.graph());
        impl_->cuda->synchronize();

        auto compare = [&](const std::vector<float> & g, const std::vector<float> & c, const std::string & what, bool exact) {
            REQUIRE(g.size() == c.size());
            double e = exact ? (g == c ? 0.0 : INFINITY) : nmse(g, c);
            if (!(e <= result.nmse) || result.worst.empty()) {
                if (!(e <= result.nmse)) result.nmse = e;
                result.worst = what;
            }
        };
        std::vector<std::vector<float>> first_gpu;
        for (size_t i = 0; i < out_cpu.size(); ++i) {
            auto g = gpu.read(*out_gpu[i]);
            compare(g, cpu.read(*out_cpu[i]), "output " + std::to_string(i), out_cpu[i]->type == DType::I32);
            first_gpu.push_back(std::move(g));
        }
        for (size_t i = 0; i < cpu.states().size(); ++i) {
            auto g = gpu.read(*gpu.states()[i].t);
            compare(g, cpu.read(*cpu.states()[i].t), "state " + std::to_string(i), false);
            first_gpu.push_back(std::move(g));
        }
        if (replay_) {
            // Second run is captured into a CUDA graph, third replays it: results must not change.
            for (int run = 0; run < 2; ++run) {
                gpu.upload_inputs();
                impl_->cuda->compute(gpu.graph());
                impl_->cuda->synchronize();
                size_t j = 0;
                for (Tensor * t : out_gpu) CHECK_MESSAGE(gpu.read(*t) == first_gpu[j++], name << ": replay " << run << " differs");
                for (const auto & s : gpu.states()) CHECK_MESSAGE(gpu.read(*s.t) == first_gpu[j++], name << ": replayed state differs");
            }
        }
    } catch (const spark::Error & e) {
        FAIL_CHECK(name << ": " << std::string(e.what()));  // (doctest prints a const char * as a pointer)
        return result;
    }
    result.ok = result.nmse <= max_nmse;
    INFO(name << ": nmse " << result.nmse << " (max " << max_nmse << ") worst at " << result.worst);
    CHECK(result.ok);
    MESSAGE(name << ": nmse " << result.nmse);
    return result;
}

std::vector<float> run_cuda_only(const std::function<Tensor *(OpBuilder &)> & build, uint64_t seed) {
    auto        be = make_cuda_backend(0);
    BuilderImpl b(*be, seed);
    Tensor *    out = build(b);
    b.graph().mark_output(out);
    b.bind_and_upload();
    be->compute(b.graph());
    be->synchronize();
    return b.read(*out);
}

}  // namespace test
