// Loading: the progress callbacks (bytes, cancel) and that every way of moving the weights gives the
// same model. Runs on the CPU here; SPARK_TEST_DEVICE=cuda runs it on the GPU, where the weights
// stream through the CUDA backend's parallel loader (src/backends/cuda/weight_batch.cpp).
#include "harness.h"

#include <cstdlib>
#include <functional>
#include <thread>

using namespace test;

namespace {

struct Report {
    uint64_t        done, total;
    std::thread::id thread;
};

struct Recorder {
    std::vector<Report>                  reports;
    std::vector<float>                   fractions;
    std::function<bool(const Report &)>  stop_when;  // return false (cancel) at the first report it accepts
};

bool on_bytes(uint64_t done, uint64_t total, void * user) {
    auto * r = static_cast<Recorder *>(user);
    r->reports.push_back({done, total, std::this_thread::get_id()});
    return !(r->stop_when && r->stop_when(r->reports.back()));
}

bool on_fraction(float f, void * user) {
    static_cast<Recorder *>(user)->fractions.push_back(f);
    return true;
}

spark_model_params params_with(Recorder & r) {
    spark_model_params p          = spark_model_default_params();
    p.device                      = test_device();
    p.n_threads                   = 2;
    p.load_progress               = on_bytes;
    p.load_progress_user_data     = &r;
    p.progress_callback           = on_fraction;
    p.progress_callback_user_data = &r;
    return p;
}

std::vector<float> golden_prompt_logits(spark_model * m, const Golden & g) {
    auto ctx = new_context(m);
    return prompt_logits(ctx.get(), g.prompt, int32_t(g.n_vocab));
}

const char * const kFixtures[] = {"qwen3-int4-autoround", "qwen3_moe-int4-autoround-asym", "qwen3-nvfp4-modelopt", "qwen3_moe-fp8-block",
                                  "qwen3_next-bf16"};

}  // namespace

TEST_CASE("load progress: bytes from 0 to the total, on the loading thread, the fraction alongside") {
    for (const char * name : kFixtures) {
        CAPTURE(name);
        Recorder      r;
        spark_model * m = nullptr;
        REQUIRE(spark_model_load(model_dir(name).c_str(), params_with(r), &m) == SPARK_OK);
        ModelPtr owned(m);
        REQUIRE(r.reports.size() >= 3);
        CHECK(r.reports[0].done == 0);  // before any work, the total still unknown
        CHECK(r.reports[0].total == 0);
        CHECK(r.reports[1].done == 0);
        const uint64_t total = r.reports.back().total;
        CHECK(total > 0);
        CHECK(r.reports.back().done == total);
        for (size_t i = 0; i < r.reports.size(); ++i) {
            if (i) CHECK(r.reports[i].total == total);
            CHECK(r.reports[i].thread == std::this_thread::get_id());
            if (i) CHECK(r.reports[i].done >= r.reports[i - 1].done);
        }
        // The weights moved are the model's weights (what spark_model_info reports), plus the
        // parameters converted to f32: at least weight_bytes' quantized part.
        spark_model_info info{};
        REQUIRE(spark_model_get_info(m, &info) == SPARK_OK);
        CHECK(total >= info.weight_bytes_attention);
        REQUIRE(r.fractions.size() == r.reports.size());
        CHECK(r.fractions.front() == 0.0f);
        CHECK(r.fractions.back() == 1.0f);
    }
}

TEST_CASE("load progress: a cancel at any report fails the load with SPARK_ERR_ABORTED and leaves nothing behind") {
    const std::string dir = model_dir("qwen3_moe-int4-autoround-asym");
    const Golden      g   = load_golden(dir);
    ModelPtr                 first  = load_model(dir);
    const std::vector<float> before = golden_prompt_logits(first.get(), g);
    first.reset();

    // How many reports a GPU load makes depends on its threads' timing: cancel at moments defined by
    // the bytes instead (before any work, once sized, half-way, at the very end).
    const std::pair<const char *, std::function<bool(const Report &)>> moments[] = {
        {"before any work", [](const Report & r) { return r.total == 0; }},
        {"once sized", [](const Report & r) { return r.total > 0; }},
        {"half-way", [](const Report & r) { return r.total > 0 && r.done >= r.total / 2; }},
        {"at the end", [](const Report & r) { return r.total > 0 && r.done == r.total; }},
    };
    for (const auto & moment : moments) {
        CAPTURE(moment.first);
        Recorder r;
        r.stop_when        = moment.second;
        auto *        sentinel = reinterpret_cast<spark_model *>(uintptr_t(0x1));
        spark_model * out      = sentinel;
        CHECK(spark_model_load(dir.c_str(), params_with(r), &out) == SPARK_ERR_ABORTED);
        CHECK(out == sentinel);  // untouched
        CHECK(std::string(spark_last_error()).find("cancelled") != std::string::npos);
        REQUIRE_FALSE(r.reports.empty());
        CHECK(moment.second(r.reports.back()));  // no report after the one that said stop
        for (size_t i = 0; i + 1 < r.reports.size(); ++i) CHECK_FALSE(moment.second(r.reports[i]));
    }
    // Loading again after every cancel gives the same model.
    ModelPtr again = load_model(dir);
    CHECK(golden_prompt_logits(again.get(), g) == before);
}

TEST_CASE("load: both ways of allocating the weights' memory give identical logits") {
    // CUDA: one virtual-memory arena backed at commit, or (SPARK_CUDA_VMM=0) cudaMalloc chunks taken
    // as the weights are sized (src/backends/cuda/weight_arena.h). On the CPU both loads map the file.
    for (const char * name : {"qwen3-int4-autoround", "qwen3_next-bf16", "qwen3-fp8-block"}) {
        CAPTURE(name);
        const std::string dir = model_dir(name);
        const Golden      g   = load_golden(dir);
        ModelPtr          a   = load_model(dir);
        const auto        la  = golden_prompt_logits(a.get(), g);
        setenv("SPARK_CUDA_VMM", "0", 1);
        ModelPtr b = load_model(dir);
        unsetenv("SPARK_CUDA_VMM");
        CHECK(golden_prompt_logits(b.get(), g) == la);
    }
}
