// A model split over 2 GPUs (NCCL; docs/DISTRIBUTED.md) computes what it computes on one GPU: every
// fixture architecture in every format, tensor- and expert-parallel, through the C API. Runs where
// at least 2 GPUs are visible (a MESSAGE says so elsewhere).
//
// Tolerance: the ranks' partial sums are added in another order than one GPU's matmuls add their
// products, and the prefill GEMM rounds its operands to fp16 (test_models_cuda.cpp): an activation
// that differs in its last float bit may round to another fp16 value, 2^-11 relative. So the
// relative logit error per position (||split - one|| / ||one||) is bounded by 1e-3, and greedy
// tokens must agree wherever one GPU's top-1 leads by more than 0.05.
#include "../models/harness.h"

#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <vector>

using namespace test;

namespace {

ModelPtr load_on_gpus(const std::string & dir, int32_t n, spark_split_mode mode) {
    spark_model_params p = spark_model_default_params();
    p.device             = SPARK_DEVICE_CUDA;
    p.n_threads          = 4;
    p.n_devices          = n;
    p.split_mode         = mode;
    spark_model * m      = nullptr;
    const spark_status st = spark_model_load(dir.c_str(), p, &m);
    INFO(dir << ": " << spark_last_error());
    REQUIRE(st == SPARK_OK);
    return ModelPtr(m);
}

// The prompt in one step, then its last token again as a decode step after removing it (the
// decode path: GEMV, attention over the cache, the recurrent state's rollback), all rows' logits.
std::vector<float> logits_of(spark_model * m, const Golden & g) {
    spark_context_params cp = spark_context_default_params();
    cp.n_ctx = 256, cp.n_batch = 256, cp.n_seq_max = 1, cp.n_rollback = 1;
    spark_context * c = nullptr;
    REQUIRE(spark_context_init(m, cp, &c) == SPARK_OK);
    ContextPtr         ctx(c);
    std::vector<float> out;
    const size_t       n = g.prompt.size();
    REQUIRE(decode_range(ctx.get(), g.prompt, 0, n, 0, int32_t(g.n_vocab), out) == SPARK_OK);
    REQUIRE(spark_memory_seq_rm(ctx.get(), 0, int32_t(n - 1), -1) == SPARK_OK);
    REQUIRE(decode_range(ctx.get(), g.prompt, n - 1, n, 0, int32_t(g.n_vocab), out) == SPARK_OK);
    return out;
}

}  // namespace

TEST_CASE("split models on 2 GPUs: tensor and expert parallelism give one GPU's logits, every fixture") {
    int n_gpus = 0;
    if (cudaGetDeviceCount(&n_gpus) != cudaSuccess || n_gpus < 2) {
        MESSAGE("fewer than 2 GPUs visible: split models on GPUs not run");
        return;
    }
    for (const char * name : kGoldenFixtures) {
        const std::string dir = model_dir(name);
        CAPTURE(dir);
        const Golden             g      = load_golden(dir);
        ModelPtr                 one    = load_on_gpus(dir, 1, SPARK_SPLIT_NONE);
        const std::vector<float> expect = logits_of(one.get(), g);
        one.reset();
        for (spark_split_mode mode : {SPARK_SPLIT_TENSOR, SPARK_SPLIT_EXPERT}) {
            ModelPtr                 split = load_on_gpus(dir, 2, mode);
            const std::vector<float> got   = logits_of(split.get(), g);
            REQUIRE(got.size() == expect.size());
            const size_t nv    = size_t(g.n_vocab);
            double       worst = 0.0;
            int          misses = 0;
            for (size_t p = 0; p < got.size() / nv; ++p) {
                double num = 0, den = 0;
                size_t best = 0, second = 1, best_got = 0;
                const float * a = got.data() + p * nv, * r = expect.data() + p * nv;
                if (r[second] > r[best]) std::swap(best, second);
                for (size_t i = 0; i < nv; ++i) {
                    num += double(a[i] - r[i]) * (a[i] - r[i]);
                    den += double(r[i]) * r[i];
                    if (a[i] > a[best_got]) best_got = i;
                    if (i >= 2 && r[i] > r[best]) second = best, best = i;
                    else if (i >= 2 && r[i] > r[second]) second = i;
                }
                worst = std::max(worst, std::sqrt(num / den));
                if (r[best] - r[second] > 0.05f && best_got != best) ++misses;
            }
            MESSAGE(std::string(name) << (mode == SPARK_SPLIT_TENSOR ? " tp" : " ep") << " x2: worst relative error " << worst << ", top-1 misses " << misses);
            CHECK(worst <= 1e-3);
            CHECK(misses == 0);
        }
    }
}
