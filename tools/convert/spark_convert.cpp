// spark-convert: Hugging Face checkpoint directory -> spark file; --info prints a spark file.
//
//   spark-convert MODEL_DIR -o OUT.spark [--quantize nvfp4|int4|fp8] [--group-size 128] [--asym]
//                 [--fp8-per-channel] [--quantize-lm-head] [--force]
//   spark-convert --info FILE.spark
//
// Never leaves a half-written file: the output is written to a temporary next to it and renamed at
// the end; errors and Ctrl-C remove the temporary.
#include "converter.h"

#include "graph/error.h"
#include "runtime/io/gguf.h"

#include <CLI/CLI.hpp>

#include <atomic>
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

}  // namespace

int main(int argc, char ** argv) {
    CLI::App    app{"spark-convert: Hugging Face checkpoint -> spark file (GGUF v3 container)"};
    std::string input, info_path, quantize = "none";
    spark::convert::Options opt;
    bool        quiet = false;
    app.add_option("input", input, "Hugging Face model directory");
    app.add_option("-o,--output", opt.output, "output spark file");
    app.add_option("--info", info_path, "print the metadata and tensor table of a spark file");
    app.add_option("--quantize", quantize, "quantize a bf16/f16/f32 checkpoint (round to nearest)")
        ->check(CLI::IsMember({"none", "nvfp4", "int4", "fp8"}));
    app.add_option("--group-size", opt.group_size, "INT4 group size: 32, 64, 128, or -1 for per-channel")
        ->check(CLI::IsMember({32, 64, 128, -1}));
    app.add_flag("--asym", opt.asymmetric, "INT4: asymmetric (zero points) instead of symmetric");
    app.add_flag("--fp8-per-channel", opt.fp8_per_channel, "FP8: one scale per output channel instead of 128x128 blocks");
    app.add_flag("--quantize-lm-head", opt.quantize_lm_head, "also quantize lm_head");
    app.add_flag("-f,--force", opt.overwrite, "replace an existing output file");
    app.add_flag("-q,--quiet", quiet, "no per-tensor report");
    CLI11_PARSE(app, argc, argv);

    try {
        if (!info_path.empty()) {
            spark::convert::print_info(info_path, stdout);
            return 0;
        }
        if (input.empty() || opt.output.empty()) {
            std::fprintf(stderr, "spark-convert: need MODEL_DIR and -o OUTPUT (or --info FILE)\n%s", app.help().c_str());
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
