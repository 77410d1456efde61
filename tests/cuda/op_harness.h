// Cross-backend op tests (test-backend-ops style): the same small graph runs on the CPU backend (the
// oracle) and on the CUDA backend, from the same random inputs, weights and state; outputs and
// updated state are compared by normalized mean squared error
//     nmse = sum((cuda - cpu)^2) / sum(cpu^2)
// against a tolerance stated per case (with the reason next to it).
//
// Usage:
//     OpHarness h(seed);
//     h.check("rms_norm 4096", 1e-10, [&](OpBuilder & b) {
//         Tensor * x = b.input({4096, 3});                 // random N(0, 1)
//         Tensor * w = b.param({4096});                     // random parameter vector
//         return b.graph().rms_norm(x, w, 1e-6f);           // the output to compare
//     });
// The builder lambda is called once per backend; it must build the same graph both times (use only
// the OpBuilder to make leaves, and derive all randomness from it).
#pragma once

#include "backends/backend.h"
#include "graph/graph.h"
#include "quant/qweight.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace test {

using spark::DType;
using spark::QWeight;
using spark::Tensor;
using spark::WeightFormat;

struct WeightSpec {
    WeightFormat format     = WeightFormat::BF16;
    int32_t      group_size = 128;    // INT4
    bool         symmetric  = true;   // INT4
    bool         act_order  = false;  // INT4: random g_idx (uniform groups, shuffled channels)
    int32_t      block_n = 128, block_k = 128;  // FP8 (block_n = 1, block_k = K: per channel)
};

class OpBuilder {
public:
    virtual ~OpBuilder() = default;
    virtual spark::Graph & graph() = 0;
    // Leaves. Shapes in ggml order (ne[0] innermost). Values are drawn from the harness's seeded
    // generator in creation order, so both backends see the same numbers.
    virtual Tensor * input(std::vector<int64_t> ne, float scale = 1.0f) = 0;                  // F32 ~ N(0, scale^2)
    virtual Tensor * input_i32(std::vector<int64_t> ne, const std::vector<int32_t> & v) = 0;  // given values
    virtual Tensor * param(std::vector<int64_t> ne, float scale = 1.0f, float offset = 0.0f) = 0;  // F32 constant
    // Persistent state updated in place by the op (conv/delta state): random initial values,
    // compared after the run like an output. kv = true makes it a KV-cache tensor in the backend's
    // KV dtype (F32 on the CPU, BF16 on CUDA); initial values are BF16-representable on both.
    virtual Tensor * state(std::vector<int64_t> ne, float scale = 1.0f, bool kv = false) = 0;
    // A random [n, k] weight quantized with the reference quantizers (src/quant/quantize.h) into
    // `spec`'s format, prepared for this backend. Returned references stay valid for the check.
    virtual const QWeight & weight(int64_t n, int64_t k, const WeightSpec & spec) = 0;
    // n_experts weights of the same shape and format (contiguous array, for matmul_id).
    virtual const QWeight * experts(int32_t n_experts, int64_t n, int64_t k, const WeightSpec & spec) = 0;
    // The same set as one rank of an expert-parallel split holds it (runtime/shard.h): expert e is
    // prepared where held[e], else an empty QWeight (n == 0; the slots routed to it output zeros).
    // The held experts are the weights experts(held.size(), ...) would make.
    virtual const QWeight * experts_held(const std::vector<bool> & held, int64_t n, int64_t k, const WeightSpec & spec) = 0;
};

struct CheckResult {
    double      nmse = 0.0;       // worst over outputs and states
    std::string worst;            // which tensor
    bool        ok = false;
};

class OpHarness {
public:
    explicit OpHarness(uint64_t seed = 1234);
    ~OpHarness();
    // Builds + runs on both backends, compares every returned output and every state tensor.
    // Fails the doctest case (CHECK) when nmse > max_nmse or anything is NaN.
    CheckResult check(const std::string & name, double max_nmse, const std::function<Tensor *(OpBuilder &)> & build);
    // Several outputs.
    CheckResult check_multi(const std::string & name, double max_nmse,
                            const std::function<std::vector<Tensor *>(OpBuilder &)> & build);
    // Run the CUDA side twice more after the first run (exercises graph capture and replay; the
    // state is reset to its initial value before each run) and require identical results.
    void set_replay_check(bool on) { replay_ = on; }

    spark::Backend & cpu();
    spark::Backend & cuda();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    uint64_t              seed_;
    bool                  replay_ = false;
};

// Runs the build on the CUDA backend only and returns the output copied to the host (for tests that
// compare with a hand-written reference, e.g. bit-exact activation quantization).
std::vector<float> run_cuda_only(const std::function<Tensor *(OpBuilder &)> & build, uint64_t seed = 1);

}  // namespace test
