// spark-bench-tokenizer: measures how long loading a tokenizer takes (median of several loads) and
// how fast one core encodes a large mixed text (code + prose + CJK/emoji, built from files in the
// repository and repeated to the requested size).
//
//   spark-bench-tokenizer [--tokenizer DIR_OR_JSON] [--mb 8] [--loads 7]
//
// Exit status: 0 when the round trip is exact, 1 when it is not or something failed, 2 for bad options.
#include "../common/parse_args.h"
#include "../common/version.h"
#include "text/tokenizer.h"

#include "text/unicode.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string read_file(const fs::path & p) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Text of every file under `dir` whose extension is in `exts`, in a stable order.
std::string collect(const fs::path & dir, const std::vector<std::string> & exts) {
    std::vector<fs::path> files;
    if (!fs::exists(dir)) return {};
    for (const auto & e : fs::recursive_directory_iterator(dir)) {
        if (!e.is_regular_file()) continue;
        const std::string ext = e.path().extension().string();
        if (std::find(exts.begin(), exts.end(), ext) != exts.end()) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    std::string out;
    for (const auto & f : files) {
        std::string text = read_file(f);
        if (spark::unicode::is_valid_utf8(text)) out += text + "\n";
    }
    return out;
}

// The multilingual lines of the tokenizer goldens (CJK, Korean, Arabic, emoji, ...).
std::string multilingual(const fs::path & data) {
    std::string out;
    for (const char * name : {"qwen3/golden.jsonl", "qwen3_extra_golden.jsonl"}) {
        std::ifstream f(data / name);
        std::string line;
        while (std::getline(f, line)) {
            const auto j = nlohmann::json::parse(line, nullptr, false);
            if (!j.is_object() || !j.contains("text")) continue;
            const std::string t = j["text"].get<std::string>();
            if (std::any_of(t.begin(), t.end(), [](char c) { return uint8_t(c) >= 0x80; })) out += t + "\n";
        }
    }
    return out;
}

}  // namespace

int main(int argc, char ** argv) {
    CLI::App app{"spark-bench-tokenizer: tokenizer load time and encode throughput"};
    const fs::path source = SPARK_SOURCE_DIR;
    std::string tokenizer_path = (source / "tests/data/tokenizers/qwen3").string();
    double mb = 8;
    int loads = 7;
    app.option_defaults()->always_capture_default();  // --help shows the defaults
    app.add_option("--tokenizer", tokenizer_path, "model directory or tokenizer.json (default: the Qwen3 test tokenizer)");
    app.add_option("--mb", mb, "size of the encoded text in MB")->check(CLI::Range(1e-3, 1e6, "POSITIVE"));
    app.add_option("--loads", loads, "number of loads for the median load time")->check(CLI::Range(1, 1000000, "POSITIVE"));
    spark_cli::add_version_flag(app, "spark-bench-tokenizer");
    if (const auto stop = spark_cli::parse_args(app, argc, argv, "spark-bench-tokenizer")) return *stop;

    try {
        auto load = [&] {
            return fs::is_directory(tokenizer_path) ? spark::Tokenizer::from_directory(tokenizer_path)
                                                    : spark::Tokenizer::from_file(tokenizer_path);
        };
        std::vector<double> times;
        for (int k = 0; k < std::max(1, loads); ++k) {
            const double t0 = now_ms();
            auto tok = load();
            times.push_back(now_ms() - t0);
        }
        std::sort(times.begin(), times.end());
        std::printf("tokenizer: %s\n", tokenizer_path.c_str());
        std::printf("load: median %.1f ms (min %.1f, max %.1f, %d loads)\n", times[times.size() / 2], times.front(),
                    times.back(), int(times.size()));

        // Corpus: code, prose, multilingual text, interleaved, then repeated to the target size.
        const std::string code  = collect(source / "src", {".cpp", ".h", ".cu", ".cuh"});
        // Prose: the repository's documents and the project's research notes beside it.
        const std::string prose = collect(source / "docs", {".md"}) + collect(source / "../shared", {".md"});
        const std::string intl  = multilingual(source / "tests/data/tokenizers");
        std::string unit = code + prose;
        constexpr int kIntlRepeats = 100;  // the multilingual lines are few: repeated to weigh ~1/10
        for (int k = 0; k < kIntlRepeats; ++k) unit += intl;
        const size_t target = size_t(mb * 1024 * 1024);
        std::string corpus;
        while (corpus.size() < target) corpus += unit;
        size_t non_ascii = 0;
        for (char c : corpus) non_ascii += uint8_t(c) >= 0x80;
        std::printf("corpus: %.2f MB (one unit %.2f MB: code %.2f MB, prose %.2f MB, multilingual %.3f MB x%d; %.1f%% non-ASCII bytes)\n",
                    corpus.size() / 1048576.0, unit.size() / 1048576.0, code.size() / 1048576.0,
                    prose.size() / 1048576.0, intl.size() / 1048576.0, kIntlRepeats, 100.0 * double(non_ascii) / double(corpus.size()));

        // First pass on a fresh tokenizer (cold word cache), then a second pass (warm cache).
        auto tok = load();
        std::vector<int32_t> ids;
        ids.reserve(corpus.size() / 3);
        double t0 = now_ms();
        tok.encode(corpus, true, ids);
        const double cold = now_ms() - t0;
        const size_t n_tokens = ids.size();
        ids.clear();
        t0 = now_ms();
        tok.encode(corpus, true, ids);
        const double warm = now_ms() - t0;
        // A single copy of the unit on a fresh tokenizer: no text is seen twice.
        auto fresh = load();
        ids.clear();
        t0 = now_ms();
        fresh.encode(unit, true, ids);
        const double unique = now_ms() - t0;
        std::printf("encode: %zu tokens (%.2f bytes/token)\n", n_tokens, double(corpus.size()) / double(n_tokens));
        std::printf("encode throughput (1 core): first pass %.1f MB/s, second pass %.1f MB/s, unrepeated unit %.1f MB/s\n",
                    corpus.size() / 1048576.0 / (cold / 1000.0), corpus.size() / 1048576.0 / (warm / 1000.0),
                    unit.size() / 1048576.0 / (unique / 1000.0));
        t0 = now_ms();
        const std::string text = tok.decode(std::span<const int32_t>(ids.data(), ids.size()), false);
        const double dec = now_ms() - t0;
        // The tokenizer normalizes to NFC, so the round trip gives the NFC form of the input.
        const std::string expected = spark::unicode::normalize(unit, spark::unicode::NormalForm::NFC);
        std::printf("decode throughput: %.1f MB/s (round trip %s)\n", text.size() / 1048576.0 / (dec / 1000.0),
                    text == expected ? "exact" : "DIFFERS");
        return text == expected ? 0 : 1;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "spark-bench-tokenizer: %s\n", e.what());
        return 1;
    }
}
