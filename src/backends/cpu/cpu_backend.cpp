// The CPU backend: host memory, weights used in place (mapped checkpoint), every op in cpu_ops.
#include "backends/backend.h"
#include "backends/comm.h"
#include "backends/cpu/cpu_ops.h"
#include "common/error.h"
#include "quant/random_weights.h"

#include <chrono>
#include <cstdlib>
#include <vector>
#include <cstring>
#include <new>
#include <thread>
#include <unistd.h>

namespace spark {

namespace {

class HostBuffer final : public Buffer {
public:
    explicit HostBuffer(size_t bytes) {
        size_  = bytes;
        if (bytes > SIZE_MAX - 63) fail(SPARK_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory", bytes);
        // 64-byte alignment for vector loads; at least one byte so data() is never null.
        data_ = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
        if (!data_) fail(SPARK_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory", bytes);
        std::memset(data_, 0, bytes);
    }
    ~HostBuffer() override { std::free(data_); }
};

int resolve_threads(int n) { return n > 0 ? n : int(std::max(1u, std::thread::hardware_concurrency())); }

class CpuExecutor final : public Executor {
public:
    explicit CpuExecutor(int n_threads) : pool(resolve_threads(n_threads)) {}
    cpu::ThreadPool pool;
};

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(int n_threads) : pool_(std::make_unique<cpu::ThreadPool>(resolve_threads(n_threads))) {}

    std::string name() const override { return "cpu"; }
    BackendCaps caps() const override { return {true, DType::F32}; }

    std::unique_ptr<Buffer> alloc(size_t bytes) override { return std::make_unique<HostBuffer>(bytes); }
    uint64_t memory_capacity() const override {
        const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
        return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
    }
    void upload(void * dst, const void * src, size_t n) override { std::memcpy(dst, src, n); }
    void download(void * dst, const void * src, size_t n) override { std::memcpy(dst, src, n); }
    void copy(void * dst, const void * src, size_t n) override { std::memmove(dst, src, n); }
    void fill_zero(void * dst, size_t n) override { std::memset(dst, 0, n); }

    QWeight prepare_weight(const QWeight & host, std::vector<std::unique_ptr<Buffer>> &) override { return host; }

    // The canonical layouts (src/quant/qweight.h) filled element by element from
    // src/quant/random_weights.h: the same logical weight the CUDA backend generates.
    QWeight random_weight(const RandomWeightSpec & spec, std::vector<std::unique_ptr<Buffer>> & storage) override {
        namespace rw = random_weights;
        const int64_t N = spec.n, K = spec.k;
        auto buffer = [&](size_t bytes) {
            storage.push_back(alloc(bytes));
            return storage.back()->data();
        };
        QWeight w = random_weight_layout(spec);
        switch (spec.format) {
            case WeightFormat::F32:
            case WeightFormat::F16:
            case WeightFormat::BF16: {
                const size_t es = spec.format == WeightFormat::F32 ? 4 : 2;
                char *       d  = static_cast<char *>(buffer(size_t(N * K) * es));
                for (int64_t n = 0; n < N; ++n)
                    for (int64_t k = 0; k < K; ++k) {
                        const float v = rw::dense(spec.seed, n, k, K, spec.scale);
                        if (es == 4) std::memcpy(d + size_t(n * K + k) * 4, &v, 4);
                        else {
                            const uint16_t h = spec.format == WeightFormat::F16 ? f32_to_f16(v) : f32_to_bf16(v);
                            std::memcpy(d + size_t(n * K + k) * 2, &h, 2);
                        }
                    }
                w.data = d;
                break;
            }
            case WeightFormat::NVFP4: {
                auto * codes  = static_cast<uint8_t *>(buffer(size_t(N * K / 2)));
                auto * scales = static_cast<uint8_t *>(buffer(size_t(N * K / 16)));
                for (int64_t n = 0; n < N; ++n) {
                    for (int64_t k = 0; k < K; k += 2)
                        codes[(n * K + k) / 2] = uint8_t(rw::nvfp4_code(spec.seed, n, k, K) | (rw::nvfp4_code(spec.seed, n, k + 1, K) << 4));
                    for (int64_t b = 0; b < K / 16; ++b) scales[n * (K / 16) + b] = rw::nvfp4_block_scale(spec.seed, n, b, K / 16);
                }
                w.data   = codes;
                w.scales = scales;
                break;
            }
            case WeightFormat::INT4: {
                const int64_t G  = w.n_groups;
                auto *        q  = static_cast<uint32_t *>(buffer(size_t(K / 8 * N) * 4));
                auto *        sc = static_cast<uint16_t *>(buffer(size_t(G * N) * 2));
                for (int64_t r = 0; r < K / 8; ++r)
                    for (int64_t n = 0; n < N; ++n) {
                        uint32_t word = 0;
                        for (int j = 0; j < 8; ++j) word |= rw::int4_code(spec.seed, n, 8 * r + j, K) << (4 * j);
                        q[r * N + n] = word;
                    }
                for (int64_t g = 0; g < G; ++g)
                    for (int64_t n = 0; n < N; ++n) sc[g * N + n] = rw::int4_scale_f16(spec.seed, n, g, G, spec.scale);
                w.data   = q;
                w.scales = sc;
                break;
            }
            case WeightFormat::FP8: {
                const int64_t bn = w.block_n, bk = w.block_k, NB = (N + bn - 1) / bn, KB = (K + bk - 1) / bk;
                auto *        d  = static_cast<uint8_t *>(buffer(size_t(N * K)));
                auto *        sc = static_cast<float *>(buffer(size_t(NB * KB) * 4));
                for (int64_t n = 0; n < N; ++n)
                    for (int64_t k = 0; k < K; ++k) d[n * K + k] = rw::fp8_code(spec.seed, n, k, K);
                for (int64_t a = 0; a < NB; ++a)
                    for (int64_t b = 0; b < KB; ++b) sc[a * KB + b] = rw::fp8_block_scale(spec.seed, a, b, KB, spec.scale);
                w.data   = d;
                w.scales = sc;
                break;
            }
        }
        return w;
    }

    double copy_bandwidth() override {
        const size_t      bytes = size_t(256) << 20;
        std::vector<char> a(bytes, 1), b(bytes, 2);
        const auto        t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 4; ++i) std::memcpy(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(), bytes);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return 2.0 * double(bytes) * 4 / s;
    }

    std::unique_ptr<Executor> make_executor(int n_threads) override { return std::make_unique<CpuExecutor>(n_threads); }

    void compute(Graph & graph, Executor * ex) override {
        cpu::ThreadPool & pool = ex ? static_cast<CpuExecutor *>(ex)->pool : *pool_;
        for (Tensor * node : graph.nodes()) {
            if (ex && ex->should_abort && ex->should_abort()) fail(SPARK_ERR_ABORTED, "decode aborted by the abort callback");
            if (node->op == Op::ALL_REDUCE) all_reduce(graph, *node);
            else run(*node, pool);
        }
    }

private:
    // In the calling thread: the in-process group's ranks are the threads that run their graphs.
    static void all_reduce(const Graph & graph, const Tensor & t) {
        if (!graph.comm()) fail(SPARK_ERR_INTERNAL, "cpu backend: ALL_REDUCE in a graph without a communicator");
        std::memcpy(t.data, t.src[0]->data, t.nbytes());
        graph.comm()->all_reduce_sum(static_cast<float *>(t.data), size_t(t.nelements()));
    }

    static void run(const Tensor & t, cpu::ThreadPool & p) {
        switch (t.op) {
            case Op::NONE:
            case Op::VIEW: return;
            case Op::CONT: return cpu::op_cont(t, p);
            case Op::CONCAT: return cpu::op_concat(t, p);
            case Op::GET_ROWS: return cpu::op_get_rows(t, p);
            case Op::MATMUL: return cpu::op_matmul(t, p);
            case Op::MATMUL_ID: return cpu::op_matmul_id(t, p);
            case Op::ADD:
            case Op::MUL:
            case Op::SWIGLU:
            case Op::MUL_SIGMOID: return cpu::op_binary(t, p);
            case Op::SCALE: return cpu::op_scale(t, p);
            case Op::RMS_NORM: return cpu::op_rms_norm(t, p);
            case Op::L2_NORM: return cpu::op_l2_norm(t, p);
            case Op::ROPE: return cpu::op_rope(t, p);
            case Op::ATTENTION: return cpu::op_attention(t, p);
            case Op::MOE_ROUTE: return cpu::op_moe_route(t, p);
            case Op::MOE_COMBINE: return cpu::op_moe_combine(t, p);
            case Op::CONV1D_SSM: return cpu::op_conv1d_ssm(t, p);
            case Op::GATED_DELTA: return cpu::op_gated_delta(t, p);
            case Op::ARGMAX: return cpu::op_argmax(t, p);
            case Op::SUM_SQR: return cpu::op_sum_sqr(t, p);
            case Op::ALL_REDUCE:
            case Op::COUNT: break;
        }
        fail(SPARK_ERR_INTERNAL, "cpu backend: unknown op %d", int(t.op));
    }

    std::unique_ptr<cpu::ThreadPool> pool_;  // compute() without an executor (tests, tools)
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads) { return std::make_unique<CpuBackend>(n_threads); }

}  // namespace spark
