// spark-convert: Hugging Face checkpoint directory -> spark file; --info prints a spark file.
//
//   spark-convert MODEL_DIR -o OUT.spark [--quantize nvfp4|int4|fp8] [--group-size 128] [--asym]
//                 [--fp8-per-channel] [--quantize-lm-head] [--force]
//   spark-convert --info FILE.spark
//   spark-convert --synthetic SHAPE:FORMAT -o DIR [--shard-size 5GB] [--threads N] [--force]
//
// Never leaves a half-written file: the output is written to a temporary next to it and renamed at
// the end; errors and Ctrl-C remove the temporary.
#include "converter.h"
#include "synthetic_checkpoint.h"

#include "graph/error.h"
#include "runtime/io/gguf.h"

#include <CLI/CLI.hpp>

#include <atomic>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <unistd.h>

namespace {

void on_interrupt(int sig) {
    spark::io::gguf_remove_temp_file_on_signal();
    static const char msg[] = "\nspark-convert: interrupted; no output written\n";
    ssize_t r = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void) r;
    _exit(128 + sig);
}

void progress_bar(size_t done, size_t total, const std::string & tensor) {
    static const bool tty = isatty(STDERR_FILENO);
    if (!tty) return;
    const int width = 30, filled = int(double(done) / double(total) * width);
    std::string name = tensor.size() > 48 ? "..." + tensor.substr(tensor.size() - 45) : tensor;
    std::fprintf(stderr, "\r[%.*s%*s] %3d%% %zu/%zu %-48s", filled, "##############################", width - filled, "",
                 int(100.0 * double(done) / double(total)), done, total, name.c_str());
    if (done == total) std::fprintf(stderr, "\n");
}

// --synthetic: Ctrl-C stops the writer, which removes its temporary; a second one exits at once.
std::atomic<bool> g_cancel{false};

void on_interrupt_synthetic(int sig) {
    if (!g_cancel.exchange(true)) return;
    _exit(128 + sig);
}

// "5GB", "500MB", "200KB", "2GiB", "123456" (bytes); decimal units as transformers' max_shard_size.
uint64_t parse_size(const std::string & s) {
    size_t      used = 0;
    double      v    = 0;
    try {
        v = std::stod(s, &used);
    } catch (const std::exception &) {
        throw CLI::ValidationError("--shard-size", "'" + s + "' is not a size (e.g. 5GB, 200KB)");
    }
    std::string unit;
    for (char c : s.substr(used)) unit += char(std::toupper(static_cast<unsigned char>(c)));
    double mult = 0;
    if (unit.empty() || unit == "B") mult = 1;
    else if (unit == "KB") mult = 1e3;
    else if (unit == "MB") mult = 1e6;
    else if (unit == "GB") mult = 1e9;
    else if (unit == "KIB") mult = 1024.0;
    else if (unit == "MIB") mult = 1024.0 * 1024;
    else if (unit == "GIB") mult = 1024.0 * 1024 * 1024;
    if (mult == 0 || !(v * mult >= 1)) throw CLI::ValidationError("--shard-size", "'" + s + "' is not a size (e.g. 5GB, 200KB)");
    return uint64_t(v * mult);
}

class SyntheticProgress {
public:
    void operator()(uint64_t done, uint64_t total) {
        static const bool tty = isatty(STDERR_FILENO);
        const auto        now = std::chrono::steady_clock::now();
        if (!tty || (done != total && done != 0 && now - last_ < std::chrono::milliseconds(100))) return;
        last_ = now;
        const double s = std::chrono::duration<double>(now - start_).count(), rate = s > 0 ? double(done) / s : 0;
        const int    width = 30, filled = total ? int(double(done) / double(total) * width) : width;
        char         eta[32] = "";
        if (rate > 0 && done < total) std::snprintf(eta, sizeof eta, "ETA %.0fs", double(total - done) / rate);
        std::fprintf(stderr, "\r[%.*s%*s] %3d%% %.2f / %.2f GB %.2f GB/s %-12s", filled, "##############################", width - filled, "",
                     total ? int(100.0 * double(done) / double(total)) : 100, double(done) / 1e9, double(total) / 1e9, rate / 1e9, eta);
        if (done == total) std::fprintf(stderr, "\n");
    }

private:
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_ = start_;
};

int write_synthetic(spark::convert::SyntheticOptions & so) {
    std::signal(SIGINT, on_interrupt_synthetic);
    std::signal(SIGTERM, on_interrupt_synthetic);
    so.cancel   = &g_cancel;
    so.progress = SyntheticProgress();
    const auto t0    = std::chrono::steady_clock::now();
    const auto stats = spark::convert::write_synthetic_checkpoint(so);
    const double s   = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "spark-convert: wrote %s (%s:%s): %zu tensors in %zu file%s, %.2f GB in %.1f s (%.2f GB/s)\n", so.output.c_str(),
                 so.shape.c_str(), so.format.c_str(), stats.tensors, stats.shards, stats.shards == 1 ? "" : "s", double(stats.bytes) / 1e9, s,
                 double(stats.bytes) / 1e9 / std::max(s, 1e-9));
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    CLI::App    app{"spark-convert: Hugging Face checkpoint -> spark file (GGUF v3 container)"};
    std::string input, info_path, quantize = "none";
    spark::convert::Options opt;
    bool        quiet = false;
    app.add_option("input", input, "Hugging Face model directory");
    app.add_option("-o,--output", opt.output, "output spark file (--synthetic: the directory to write)");
    app.add_option("--info", info_path, "print the metadata and tensor table of a spark file");
    app.add_option("--quantize", quantize, "quantize a bf16/f16/f32 checkpoint (round to nearest)")
        ->check(CLI::IsMember({"none", "nvfp4", "int4", "fp8"}));
    app.add_option("--group-size", opt.group_size, "INT4 group size: 32, 64, 128, or -1 for per-channel")
        ->check(CLI::IsMember({32, 64, 128, -1}));
    app.add_flag("--asym", opt.asymmetric, "INT4: asymmetric (zero points) instead of symmetric");
    app.add_flag("--fp8-per-channel", opt.fp8_per_channel, "FP8: one scale per output channel instead of 128x128 blocks");
    app.add_flag("--quantize-lm-head", opt.quantize_lm_head, "also quantize lm_head");
    app.add_flag("-f,--force", opt.overwrite, "replace an existing output file (--synthetic: an existing model directory)");
    app.add_flag("-q,--quiet", quiet, "no per-tensor report");
    std::string synthetic, shard_size = "5GB";
    int         threads = 0;
    app.add_option("--synthetic", synthetic,
                   "write a Hugging Face checkpoint directory (-o DIR) of a synthetic shape with random weights; "
                   "SHAPE:FORMAT, FORMAT one of bf16, int4, nvfp4, fp8");
    app.add_option("--shard-size", shard_size, "--synthetic: largest shard (transformers' max_shard_size), e.g. 5GB, 200MB, 100KB");
    app.add_option("--threads", threads, "--synthetic: generating threads (default: one per hardware thread)");
    app.footer(
        "Synthetic checkpoints (for load-time benchmarks without a download):\n"
        "  spark-convert --synthetic SHAPE:FORMAT -o DIR\n"
        "writes DIR as the real producers write such checkpoints, with random weights of plausible size:\n"
        "config.json as transformers writes it, shards model-00001-of-0000N.safetensors of at most\n"
        "--shard-size (5GB) with model.safetensors.index.json (one model.safetensors when it fits).\n"
        "  SHAPE:  qwen3-8b, qwen3-30b-a3b, qwen3-next-80b-a3b, tiny-qwen3, tiny-qwen3-moe, tiny-qwen3-next\n"
        "          (those of spark's in-memory synthetic:SHAPE:FORMAT models: the directory loads into the same tensors)\n"
        "  FORMAT: bf16; int4 (AutoRound auto_round:auto_gptq, symmetric, group 128); nvfp4 (ModelOpt);\n"
        "          fp8 (128x128 blocks). Embeddings, lm_head, MoE routers and shared-expert gates stay bf16.\n"
        "The bytes depend only on SHAPE:FORMAT (and --shard-size). The directory appears only when complete\n"
        "(written as DIR.tmp-PID, then renamed); an existing non-empty DIR is replaced only with --force.\n"
        "A spark file is then made from it as from any checkpoint:\n"
        "  spark-convert DIR -o OUT.spark\n"
        "e.g. spark-convert --synthetic qwen3-30b-a3b:int4 -o /tmp/q30b && spark-bench -m /tmp/q30b -p 0 -n 4");
    CLI11_PARSE(app, argc, argv);

    try {
        if (!synthetic.empty()) {
            if (!input.empty() || !info_path.empty() || quantize != "none") {
                std::fprintf(stderr, "spark-convert: --synthetic takes no MODEL_DIR, --info or --quantize\n");
                return 2;
            }
            if (opt.output.empty()) {
                std::fprintf(stderr, "spark-convert: --synthetic needs -o DIR\n");
                return 2;
            }
            spark::convert::SyntheticOptions so;
            spark::convert::parse_synthetic_spec(synthetic, so);
            so.output      = opt.output;
            so.overwrite   = opt.overwrite;
            so.shard_bytes = parse_size(shard_size);
            so.threads     = threads;
            return write_synthetic(so);
        }
        if (!info_path.empty()) {
            spark::convert::print_info(info_path, stdout);
            return 0;
        }
        if (input.empty() || opt.output.empty()) {
            std::fprintf(stderr, "spark-convert: need MODEL_DIR and -o OUTPUT (or --info FILE, or --synthetic SHAPE:FORMAT -o DIR)\n%s", app.help().c_str());
            return 2;
        }
        opt.input    = input;
        opt.quantize = quantize == "nvfp4" ? spark::convert::Quantize::NVFP4
                     : quantize == "int4"  ? spark::convert::Quantize::INT4
                     : quantize == "fp8"   ? spark::convert::Quantize::FP8
                                           : spark::convert::Quantize::None;
        std::signal(SIGINT, on_interrupt);
        std::signal(SIGTERM, on_interrupt);
        opt.progress = progress_bar;
        if (!quiet)
            opt.report = [](const std::string & tensor, double err) { std::fprintf(stderr, "\r%-72s relative error %.4f\n", tensor.c_str(), err); };
        auto stats = spark::convert::convert(opt);
        std::fprintf(stderr, "spark-convert: wrote %s: %zu tensors (%zu quantized, %zu kept dense), %.2f MiB\n", opt.output.c_str(),
                     stats.tensors_out, stats.quantized, stats.kept_dense, double(stats.bytes_out) / 1048576.0);
        return 0;
    } catch (const spark::Error & e) {
        std::fprintf(stderr, "spark-convert: %s (%s)\n", e.what(), spark_status_str(e.status()));
        return 1;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "spark-convert: %s\n", e.what());
        return 1;
    }
}
