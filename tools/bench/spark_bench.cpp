// spark-bench: prefill and decode speed the way users measure it (like llama-bench), for a model
// file or directory, or for synthetic models with the exact shapes of Qwen3-8B, Qwen3-30B-A3B and
// Qwen3-Next-80B-A3B in each weight format (random weights generated on the device).
//
//   spark-bench --synthetic qwen3-30b-a3b --format int4,nvfp4 -d 0,2048 [-p 512] [-n 128] [-r 5] [--json]
//   spark-bench -m /path/to/model --device cuda
//   spark-bench --synthetic qwen3-8b --format int4 --context-matrix
//
// pp<P>: tokens/s of one P-token prefill on top of a context of depth d. tg<N>: tokens/s of N
// single-token decode steps with greedy sampling (on the device) starting at depth d. Each figure is
// the median of r runs. For decode it also prints the bytes one step must read (weights actually
// touched, incl. the routed experts, + the KV cache at the mean depth + the recurrent state read and
// written) and the fraction of the device's measured copy bandwidth this speed implies.
#include <spark/spark.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> split(const std::string & s) {
    std::vector<std::string> out;
    std::stringstream        ss(s);
    std::string              item;
    while (std::getline(ss, item, ','))
        if (!item.empty()) out.push_back(item);
    return out;
}

struct Stat {
    double median = 0, stdev = 0;
};

Stat stat_of(std::vector<double> v) {
    Stat s;
    if (v.empty()) return s;
    std::sort(v.begin(), v.end());
    s.median    = v[v.size() / 2];
    double mean = 0;
    for (double x : v) mean += x;
    mean /= double(v.size());
    for (double x : v) s.stdev += (x - mean) * (x - mean);
    s.stdev = std::sqrt(s.stdev / double(v.size()));
    return s;
}

struct Result {
    std::string model, format, test;
    int         depth = 0;
    Stat        tps;
    double      step_bytes = 0, bw_fraction = 0;
};

class Bench {
public:
    Bench(spark_model * m, int32_t n_ctx, int32_t n_batch) : model_(m) {
        spark_model_get_info(m, &info_);
        spark_context_params cp = spark_context_default_params();
        cp.n_ctx                = n_ctx;
        cp.n_batch              = n_batch;
        cp.n_snapshots          = 1;
        if (spark_context_init(m, cp, &ctx_) != SPARK_OK) throw std::runtime_error(std::string("context: ") + spark_last_error());
        batch_ = spark_batch_init(n_batch, 1);
    }
    ~Bench() {
        spark_batch_free(batch_);
        spark_context_free(ctx_);
    }
    const spark_model_info & info() const { return info_; }

    // Fills the context to `depth` tokens (untimed) and snapshots that state.
    void prepare(int depth) {
        if (snapshot_ >= 0) spark_memory_snapshot_free(ctx_, snapshot_);
        spark_memory_clear(ctx_);
        for (int done = 0; done < depth;) {
            const int n = std::min(depth - done, batch_capacity());
            decode_span(done, n, false);
            done += n;
        }
        check(spark_memory_seq_snapshot(ctx_, 0, &snapshot_), "snapshot");
        depth_ = depth;
    }

    double prefill_tps(int n) {
        restore();
        const auto t0 = Clock::now();
        decode_span(depth_, n, true);
        spark_token t;
        check(spark_sampler_sample(greedy(), ctx_, -1, &t), "sample");  // waits for the step
        return n / std::chrono::duration<double>(Clock::now() - t0).count();
    }

    double decode_tps(int n) {
        restore();
        decode_span(depth_, 1, true);  // the first token's logits (not timed: part of prefill)
        const auto t0 = Clock::now();
        spark_token t;
        for (int i = 0; i < n; ++i) {
            check(spark_sampler_sample(greedy(), ctx_, -1, &t), "sample");
            batch_.n_tokens     = 1;
            batch_.token[0]     = t;
            batch_.pos[0]       = depth_ + 1 + i;
            batch_.n_seq_id[0]  = 1;
            batch_.seq_id[0][0] = 0;
            batch_.logits[0]    = 1;
            check(spark_decode(ctx_, &batch_), "decode");
        }
        check(spark_sampler_sample(greedy(), ctx_, -1, &t), "sample");
        return n / std::chrono::duration<double>(Clock::now() - t0).count();
    }

private:
    int batch_capacity() const { return 512; }
    spark_sampler * greedy() {
        if (!greedy_) greedy_ = spark_sampler_init_greedy();
        return greedy_;
    }
    void restore() { check(spark_memory_seq_restore(ctx_, 0, snapshot_), "restore"); }
    static void check(spark_status st, const char * what) {
        if (st != SPARK_OK) throw std::runtime_error(std::string(what) + ": " + spark_last_error());
    }
    // Decodes tokens at positions [pos, pos + n) (pseudo-random ids), logits for the last only.
    void decode_span(int pos, int n, bool last_logits) {
        for (int done = 0; done < n;) {
            const int m = std::min(n - done, batch_capacity());
            for (int i = 0; i < m; ++i) {
                const int p          = pos + done + i;
                batch_.token[i]      = int32_t((uint64_t(p) * 2654435761u + 12345u) % uint64_t(info_.n_vocab));
                batch_.pos[i]        = p;
                batch_.n_seq_id[i]   = 1;
                batch_.seq_id[i][0]  = 0;
                batch_.logits[i]     = last_logits && done + i == n - 1;
            }
            batch_.n_tokens = m;
            check(spark_decode(ctx_, &batch_), "decode");
            done += m;
        }
    }

    spark_model *    model_;
    spark_model_info info_{};
    spark_context *  ctx_ = nullptr;
    spark_batch      batch_{};
    spark_sampler *  greedy_ = nullptr;
    int32_t          snapshot_ = -1;
    int              depth_    = 0;
};

double step_bytes(const spark_model_info & i, double mean_depth) {
    return double(i.decode_weight_bytes) + double(i.kv_bytes_per_token) * mean_depth + 2.0 * double(i.recurrent_bytes);
}

}  // namespace

int main(int argc, char ** argv) {
    CLI::App    app{"spark-bench: prefill (pp) and decode (tg) tokens/s, with the roofline fraction"};
    std::vector<std::string> models;
    std::string synthetic, formats = "int4", depths_arg = "0", device = "cuda";
    int         n_prompt = 512, n_gen = 128, reps = 3;
    bool        json = false, matrix = false;
    app.add_option("-m,--model", models, "model directory or spark file (repeatable)");
    app.add_option("--synthetic", synthetic, "synthetic shapes: qwen3-8b,qwen3-30b-a3b,qwen3-next-80b-a3b");
    app.add_option("--format", formats, "formats of the synthetic models: bf16,int4,nvfp4,fp8");
    app.add_option("-d,--depth", depths_arg, "context depths, comma separated");
    app.add_option("-p,--n-prompt", n_prompt, "prefill length (0: skip)");
    app.add_option("-n,--n-gen", n_gen, "decode length (0: skip)");
    app.add_option("-r,--repetitions", reps, "runs per figure (median)");
    app.add_option("--device", device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
    app.add_flag("--json", json, "print JSON instead of a table");
    app.add_flag("--context-matrix", matrix, "decode speed for generations of 20/150/400 tokens at depths 0/512/2K/8K/16K");
    CLI11_PARSE(app, argc, argv);

    for (const std::string & s : split(synthetic))
        for (const std::string & f : split(formats)) models.push_back("synthetic:" + s + ":" + f);
    if (models.empty()) {
        std::fprintf(stderr, "spark-bench: nothing to run (give -m or --synthetic)\n");
        return 2;
    }
    std::vector<int> depths;
    for (const std::string & d : split(matrix ? "0,512,2048,8192,16384" : depths_arg)) depths.push_back(std::stoi(d));
    const std::vector<int> gens = matrix ? std::vector<int>{20, 150, 400} : std::vector<int>{n_gen};

    std::vector<Result> results;
    double              bandwidth = 0;
    std::string         device_name = device;
    if (device == "cuda") {
        spark_device_info di{};
        if (spark_cuda_device_info(0, &di) == SPARK_OK) device_name = di.name;
    }
    if (!json) {
        std::printf("| model | format | test | depth | t/s | step MB | %% of copy BW |\n|---|---|---|---:|---:|---:|---:|\n");
        std::fflush(stdout);
    }
    for (const std::string & path : models) {
        spark_model_params mp = spark_model_default_params();
        mp.device             = device == "cuda" ? SPARK_DEVICE_CUDA : SPARK_DEVICE_CPU;
        mp.load_tokenizer     = false;
        spark_model * model   = nullptr;
        const auto    t0      = Clock::now();
        if (spark_model_load(path.c_str(), mp, &model) != SPARK_OK) {
            std::fprintf(stderr, "spark-bench: %s: %s (%s)\n", path.c_str(), spark_last_error(), "skipped");
            if (!json) std::printf("| %s | - | - | - | %s | | |\n", path.c_str(), "not run (see stderr)");
            continue;
        }
        const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (bandwidth == 0) spark_model_measure_bandwidth(model, &bandwidth);
        spark_model_info info{};
        spark_model_get_info(model, &info);
        std::fprintf(stderr, "spark-bench: %s: %.2f GB of weights, %.3f GB read per decode step at depth 0, loaded in %.1f s; copy bandwidth %.0f GB/s\n",
                     path.c_str(), double(info.weight_bytes) / 1e9, step_bytes(info, 0) / 1e9, load_s, bandwidth / 1e9);
        const std::string name   = path.rfind("synthetic:", 0) == 0 ? path.substr(10, path.rfind(':') - 10) : path;
        const std::string format = path.rfind("synthetic:", 0) == 0 ? path.substr(path.rfind(':') + 1) : info.weight_format;
        try {
            const int max_depth = *std::max_element(depths.begin(), depths.end());
            const int max_gen   = *std::max_element(gens.begin(), gens.end());
            Bench     b(model, max_depth + std::max(n_prompt, max_gen + 1) + 8, 512);
            for (int depth : depths) {
                b.prepare(depth);
                auto emit = [&](const std::string & test, const std::vector<double> & v, double bytes) {
                    Result r{name, format, test, depth, stat_of(v), bytes, 0.0};
                    if (bytes > 0 && bandwidth > 0) r.bw_fraction = bytes * r.tps.median / bandwidth;
                    results.push_back(r);
                    if (!json) {
                        std::printf("| %s | %s | %s | %d | %.1f ± %.1f | %s | %s |\n", r.model.c_str(), r.format.c_str(), r.test.c_str(), r.depth,
                                    r.tps.median, r.tps.stdev, bytes > 0 ? std::to_string(bytes / 1e6).substr(0, std::to_string(bytes / 1e6).find(".") + 2).c_str() : "",
                                    bytes > 0 ? (std::to_string(int(100 * r.bw_fraction + 0.5)) + "%").c_str() : "");
                        std::fflush(stdout);
                    }
                };
                if (n_prompt > 0 && !matrix) {
                    std::vector<double> v;
                    b.prefill_tps(n_prompt);  // warm-up (captures nothing: prefill shapes vary)
                    for (int r = 0; r < reps; ++r) v.push_back(b.prefill_tps(n_prompt));
                    emit("pp" + std::to_string(n_prompt), v, 0);
                }
                for (int g : gens) {
                    if (g <= 0) continue;
                    std::vector<double> v;
                    b.decode_tps(std::min(g, 8));  // warm-up: the single-token step is captured
                    for (int r = 0; r < reps; ++r) v.push_back(b.decode_tps(g));
                    emit("tg" + std::to_string(g), v, step_bytes(b.info(), depth + g / 2.0));
                }
            }
        } catch (const std::exception & e) {
            std::fprintf(stderr, "spark-bench: %s: %s\n", path.c_str(), e.what());
        }
        spark_model_free(model);
    }
    if (matrix && !json) {
        // Depth x generation length, decode tokens/s (end-to-end style tables users publish).
        std::string last;
        for (const Result & r : results) {
            const std::string id = r.model + " " + r.format;
            if (id != last) {
                std::printf("\n%s: decode tokens/s by context depth (rows) and generation length (columns)\n| depth |", id.c_str());
                for (int g : gens) std::printf(" %d |", g);
                std::printf("\n|---:|");
                for (size_t i = 0; i < gens.size(); ++i) std::printf("---:|");
                last = id;
                std::printf("\n");
            }
            if (r.test == "tg" + std::to_string(gens.front())) std::printf("| %d |", r.depth);
            std::printf(" %.1f |", r.tps.median);
            if (r.test == "tg" + std::to_string(gens.back())) std::printf("\n");
        }
    }
    if (json) {
        std::printf("{\"device\": \"%s\", \"copy_bandwidth_gbs\": %.1f, \"results\": [\n", device_name.c_str(), bandwidth / 1e9);
        for (size_t i = 0; i < results.size(); ++i) {
            const Result & r = results[i];
            std::printf("  {\"model\": \"%s\", \"format\": \"%s\", \"test\": \"%s\", \"depth\": %d, \"tps\": %.2f, \"tps_stdev\": %.2f, "
                        "\"step_bytes\": %.0f, \"bw_fraction\": %.4f}%s\n",
                        r.model.c_str(), r.format.c_str(), r.test.c_str(), r.depth, r.tps.median, r.tps.stdev, r.step_bytes, r.bw_fraction,
                        i + 1 < results.size() ? "," : "");
        }
        std::printf("]}\n");
    } else {
        std::printf("\ndevice: %s, measured copy bandwidth %.0f GB/s (bytes read + written), build %s\n", device_name.c_str(), bandwidth / 1e9,
                    spark_build_info());
    }
    return 0;
}
