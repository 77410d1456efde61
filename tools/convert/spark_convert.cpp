// spark-convert: Hugging Face checkpoint directory -> spark file; --info prints a spark file.
//
//   spark-convert MODEL_DIR -o OUT.spark [--quantize nvfp4|int4|fp8] [--group-size 128] [--asym]
//                 [--fp8-per-channel] [--quantize-lm-head] [--force]
//   spark-convert --info FILE.spark
//   spark-convert --synthetic SHAPE:FORMAT -o DIR [--shard-size 5GB] [--threads N] [--force]
//
// Never leaves a half-written file: the output is written to a temporary next to it and renamed at
// the end; errors and Ctrl-C remove the temporary. An existing output is replaced only with -f.
//
// Progress (bytes of tensor data written, the speed and the time left) goes to stderr: the bar of
// the programs' loads (load_progress.h) redrawn in place on a terminal, plain lines otherwise. Exit
// status: 0 done, 1 a conversion that failed, 2 bad options (a value that does not parse, an option
// that does nothing with the others given, e.g. --group-size without --quantize int4).
#include "../common/parse_args.h"
#include "converter.h"
#include "synthetic_checkpoint.h"
#include "synthetic_shapes.h"

#include "../common/load_progress.h"  // LoadProgress::render: the bar's text
#include "../common/version.h"

#include "common/error.h"
#include "io/writer/gguf_writer.h"

#include <CLI/CLI.hpp>

#include <atomic>
#include <cctype>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <unistd.h>

namespace {

void on_interrupt(int sig) {
    spark::io::gguf_remove_temp_file_on_signal();
    static const char msg[] = "\nspark-convert: interrupted; no output written\n";
    ssize_t r = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void) r;
    _exit(128 + sig);
}

// The progress of a conversion (or of --synthetic) in bytes of tensor data written. On a terminal:
// LoadProgress's bar with the time left, redrawn in place at most 10 times a second,
//
//   converting  [#########...............]  7.4 / 16.9 GB  2.3 GB/s  ETA 4s
//
// and erased at the end (a summary line follows). Elsewhere (a pipe, a log file): the same text as
// plain lines, one at each further tenth of the total at most once a second, and one at the end.
class ConvertProgress {
public:
    using Clock = std::chrono::steady_clock;

    explicit ConvertProgress(const char * label, bool tty = isatty(STDERR_FILENO) != 0) : label_(label), tty_(tty) {}
    ~ConvertProgress() { erase(); }
    ConvertProgress(const ConvertProgress &)             = delete;
    ConvertProgress & operator=(const ConvertProgress &) = delete;

    void update(uint64_t done, uint64_t total) {
        const auto now  = Clock::now();
        const bool last = done >= total;
        if (tty_) {
            if (drawn_ && !last && now - last_ < std::chrono::milliseconds(100)) return;
            std::fprintf(stderr, "\r%s\033[K", line(done, total, now).c_str());
            std::fflush(stderr);
            drawn_ = true, last_ = now;
            return;
        }
        const int tenth = total > 0 ? int(double(done) / double(total) * 10) : 10;
        if (last ? ended_ : tenth <= tenth_ || now - last_ < std::chrono::seconds(1)) return;
        std::fprintf(stderr, "%s\n", line(done, total, now).c_str());
        std::fflush(stderr);
        tenth_ = tenth, last_ = now, ended_ = last;
    }

    // Erases the bar before another line goes to stderr (the next update draws it again).
    void erase() {
        if (!drawn_) return;
        std::fputs("\r\033[K", stderr);
        std::fflush(stderr);
        drawn_ = false;
    }

private:
    std::string line(uint64_t done, uint64_t total, Clock::time_point now) const {
        return spark_cli::LoadProgress::render(done, total, std::chrono::duration<double>(now - start_).count(), label_, 24, true);
    }

    const char *      label_;
    const bool        tty_;
    Clock::time_point start_ = Clock::now(), last_ = start_;
    bool              drawn_ = false, ended_ = false;
    int               tenth_ = 0;
};

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

// The library's writer names its `overwrite` parameter; the user's name for it is -f/--force.
std::string user_message(std::string m) {
    const std::string param = "pass overwrite to replace it";
    if (const size_t at = m.find(param); at != std::string::npos) m.replace(at, param.size(), "pass -f/--force to replace it");
    return m;
}

int write_synthetic(spark::convert::SyntheticOptions & so) {
    std::signal(SIGINT, on_interrupt_synthetic);
    std::signal(SIGTERM, on_interrupt_synthetic);
    so.cancel = &g_cancel;
    ConvertProgress progress("writing");
    so.progress      = [&](uint64_t done, uint64_t total) { progress.update(done, total); };
    const auto t0    = std::chrono::steady_clock::now();
    const auto stats = spark::convert::write_synthetic_checkpoint(so);
    progress.erase();
    const double s   = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "spark-convert: wrote %s (%s:%s): %zu tensors in %zu file%s, %.2f GB in %.1f s (%.2f GB/s)\n", so.output.c_str(),
                 so.shape.c_str(), so.format.c_str(), stats.tensors, stats.shards, stats.shards == 1 ? "" : "s", double(stats.bytes) / 1e9, s,
                 double(stats.bytes) / 1e9 / std::max(s, 1e-9));
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    CLI::App    app{"spark-convert: Hugging Face checkpoint -> spark file (GGUF v3 container)"};
    app.option_defaults()->always_capture_default();  // --help shows the defaults
    spark_cli::add_version_flag(app, "spark-convert");
    std::string input, info_path, quantize = "none";
    spark::convert::Options opt;
    bool        quiet = false;
    app.add_option("input", input, "Hugging Face model directory");
    app.add_option("-o,--output", opt.output, "output spark file (--synthetic: the directory to write)");
    app.add_option("--info", info_path, "print the metadata and tensor table of a spark file");
    app.add_option("--quantize", quantize, "quantize a bf16/f16/f32 checkpoint (round to nearest)")
        ->check(CLI::IsMember({"none", "nvfp4", "int4", "fp8"}));
    app.add_option("--group-size", opt.group_size, "--quantize int4: group size, 32, 64, 128, or -1 for per-channel")
        ->check(CLI::Validator(
            [](std::string & v) { return v == "32" || v == "64" || v == "128" || v == "-1" ? std::string() : "'" + v + "' is not one of 32, 64, 128, -1"; },
            "{32,64,128,-1}"));
    app.add_flag("--asym", opt.asymmetric, "--quantize int4: asymmetric (zero points) instead of symmetric");
    app.add_flag("--fp8-per-channel", opt.fp8_per_channel, "--quantize fp8: one scale per output channel instead of 128x128 blocks");
    app.add_flag("--quantize-lm-head", opt.quantize_lm_head, "--quantize: also quantize lm_head");
    app.add_flag("-f,--force", opt.overwrite, "replace an existing output file (--synthetic: an existing model directory)");
    app.add_flag("-q,--quiet", quiet, "no per-tensor report (the relative error of each quantized tensor)");
    std::string synthetic, shard_size = "5GB";
    int         threads = 0;
    app.add_option("--synthetic", synthetic,
                   "write a Hugging Face checkpoint directory (-o DIR) of a synthetic shape with random weights; "
                   "SHAPE:FORMAT, FORMAT one of bf16, int4, nvfp4, fp8");
    app.add_option("--shard-size", shard_size, "--synthetic: largest shard (transformers' max_shard_size), e.g. 5GB, 200MB, 100KB");
    app.add_option("--threads", threads, "--synthetic: generating threads (0: one per hardware thread)")->check(CLI::Range(0, INT_MAX, "NONNEGATIVE"));
    app.footer(std::string(
        "Synthetic checkpoints (for load-time benchmarks without a download):\n"
        "  spark-convert --synthetic SHAPE:FORMAT -o DIR\n"
        "writes DIR as the real producers write such checkpoints, with random weights of plausible size:\n"
        "config.json as transformers writes it, shards model-00001-of-0000N.safetensors of at most\n"
        "--shard-size (5GB) with model.safetensors.index.json (one model.safetensors when it fits).\n"
        "  SHAPE:  ") + spark_cli::kSyntheticShapes + "\n"
        "          (those of spark's in-memory synthetic:SHAPE:FORMAT models: the directory loads into the same tensors)\n"
        "  FORMAT: bf16; int4 (AutoRound auto_round:auto_gptq, symmetric, group 128); nvfp4 (ModelOpt);\n"
        "          fp8 (128x128 blocks). Embeddings, lm_head, MoE routers and shared-expert gates stay bf16.\n"
        "The bytes depend only on SHAPE:FORMAT (and --shard-size). The directory appears only when complete\n"
        "(written as DIR.tmp-PID, then renamed); an existing non-empty DIR is replaced only with -f/--force.\n"
        "A spark file is then made from it as from any checkpoint:\n"
        "  spark-convert DIR -o OUT.spark\n"
        "e.g. spark-convert --synthetic qwen3-30b-a3b:int4 -o /tmp/q30b && spark-bench -m /tmp/q30b -p 0 -n 4\n"
        "\n"
        "Exit status: 0 done, 1 the conversion failed, 2 bad options.");
    if (const auto stop = spark_cli::parse_args(app, argc, argv, "spark-convert")) return *stop;
    auto usage_error = [](const std::string & message) {
        std::fprintf(stderr, "spark-convert: %s\n", message.c_str());
        return 2;
    };

    // Options that would do nothing with the others given are refused, not ignored.
    for (const char * name : {"--group-size", "--asym", "--fp8-per-channel", "--quantize-lm-head"}) {
        if (app.count(name) == 0) continue;
        const std::string only = std::string(name) == "--fp8-per-channel" ? "fp8" : std::string(name) == "--quantize-lm-head" ? "" : "int4";
        if (quantize == "none")
            return usage_error(std::string(name) + " does nothing without --quantize" + (only.empty() ? "" : " (it applies to --quantize " + only + ")"));
        if (!only.empty() && quantize != only) return usage_error(std::string(name) + " applies to --quantize " + only + ", not --quantize " + quantize);
    }
    if (synthetic.empty())
        for (const char * name : {"--shard-size", "--threads"})
            if (app.count(name) > 0) return usage_error(std::string(name) + " goes with --synthetic");

    try {
        if (!synthetic.empty()) {
            if (!input.empty() || !info_path.empty() || quantize != "none") return usage_error("--synthetic takes no MODEL_DIR, --info or --quantize");
            if (opt.output.empty()) return usage_error("--synthetic needs -o DIR");
            spark::convert::SyntheticOptions so;
            try {
                spark::convert::parse_synthetic_spec(synthetic, so);
                so.shard_bytes = parse_size(shard_size);
            } catch (const std::exception & e) {
                return usage_error(e.what());
            }
            so.output    = opt.output;
            so.overwrite = opt.overwrite;
            so.threads   = threads;
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
        if (std::error_code ec; !opt.overwrite && std::filesystem::exists(opt.output, ec)) {
            std::fprintf(stderr, "spark-convert: '%s' already exists (pass -f/--force to replace it)\n", opt.output.c_str());
            return 1;
        }
        opt.input    = input;
        opt.quantize = quantize == "nvfp4" ? spark::convert::Quantize::NVFP4
                     : quantize == "int4"  ? spark::convert::Quantize::INT4
                     : quantize == "fp8"   ? spark::convert::Quantize::FP8
                                           : spark::convert::Quantize::None;
        std::signal(SIGINT, on_interrupt);
        std::signal(SIGTERM, on_interrupt);
        ConvertProgress progress("converting");
        opt.progress_bytes = [&](uint64_t done, uint64_t total) { progress.update(done, total); };
        if (!quiet)
            opt.report = [&](const std::string & tensor, double err) {
                progress.erase();
                std::fprintf(stderr, "%-72s relative error %.4f\n", tensor.c_str(), err);
            };
        auto stats = spark::convert::convert(opt);
        progress.erase();
        std::fprintf(stderr, "spark-convert: wrote %s: %zu tensors (%zu quantized, %zu kept dense), %.2f MiB\n", opt.output.c_str(),
                     stats.tensors_out, stats.quantized, stats.kept_dense, double(stats.bytes_out) / 1048576.0);
        return 0;
    } catch (const spark::Error & e) {
        std::fprintf(stderr, "spark-convert: %s (%s)\n", user_message(e.what()).c_str(), spark_status_str(e.status()));
        return 1;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "spark-convert: %s\n", user_message(e.what()).c_str());
        return 1;
    }
}
