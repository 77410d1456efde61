// The CPU backend: host memory, weights used in place (mapped checkpoint), every op in cpu_ops.
#include "backends/backend.h"
#include "backends/cpu/cpu_ops.h"
#include "graph/error.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

namespace spark {

namespace {

class HostBuffer final : public Buffer {
public:
    explicit HostBuffer(size_t bytes) {
        size_  = bytes;
        // 64-byte alignment for vector loads; at least one byte so data() is never null.
        data_ = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
        if (!data_) fail(SPARK_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory", bytes);
        std::memset(data_, 0, bytes);
    }
    ~HostBuffer() override { std::free(data_); }
};

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(int n_threads) { set_n_threads(n_threads); }

    std::string name() const override { return "cpu"; }
    BackendCaps caps() const override { return {true, DType::F32}; }

    std::unique_ptr<Buffer> alloc(size_t bytes) override { return std::make_unique<HostBuffer>(bytes); }
    void upload(void * dst, const void * src, size_t n) override { std::memcpy(dst, src, n); }
    void download(void * dst, const void * src, size_t n) override { std::memcpy(dst, src, n); }
    void copy(void * dst, const void * src, size_t n) override { std::memmove(dst, src, n); }
    void fill_zero(void * dst, size_t n) override { std::memset(dst, 0, n); }

    QWeight prepare_weight(const QWeight & host, std::vector<std::unique_ptr<Buffer>> &) override { return host; }

    void set_n_threads(int n) override {
        if (n <= 0) n = int(std::max(1u, std::thread::hardware_concurrency()));
        if (!pool_ || pool_->size() != n) pool_ = std::make_unique<cpu::ThreadPool>(n);
    }

    void compute(Graph & graph) override {
        for (Tensor * node : graph.nodes()) run(*node);
    }

private:
    void run(const Tensor & t) {
        cpu::ThreadPool & p = *pool_;
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
            case Op::COUNT: break;
        }
        fail(SPARK_ERR_INTERNAL, "cpu backend: unknown op %d", int(t.op));
    }

    std::unique_ptr<cpu::ThreadPool> pool_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads) { return std::make_unique<CpuBackend>(n_threads); }

}  // namespace spark
