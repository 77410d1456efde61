// spark-tokenize driven end to end (the tool is built before test-tokenizer: see
// tools/tokenize/CMakeLists.txt).
#include "tokenizer_test_util.h"

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

using tokenizer_test::data_path;
using tokenizer_test::read_file;
using tokenizer_test::read_jsonl;

namespace {

struct Run {
    int         status;
    std::string out;
};

const std::string kTool = std::string(SPARK_BINARY_DIR) + "/tools/tokenize/spark-tokenize";

Run run(const std::string & args) {
    const std::string cmd = kTool + " " + args + " 2>/dev/null";
    FILE * p = popen(cmd.c_str(), "r");
    REQUIRE(p);
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int rc = pclose(p);
    return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

}  // namespace

TEST_CASE("spark-tokenize encodes and decodes like the goldens") {
#ifdef SPARK_TOKENIZE_TOOL_BUILT
    // Part of this build (a dependency of test-tokenizer): a missing binary is a failure, not a skip.
    REQUIRE_MESSAGE(std::filesystem::exists(kTool), "spark-tokenize is part of this build but missing: " << kTool);
#else
    MESSAGE("spark-tokenize is not part of this build (SPARK_BUILD_EXAMPLES=OFF): not tested");
    return;
#endif
    const auto dir = std::filesystem::temp_directory_path() / ("spark-tokenize-cli-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string in = (dir / "in.txt").string(), ids_file = (dir / "ids.json").string();
    int checked = 0;
    for (const auto & g : read_jsonl(data_path("qwen3_extra_golden.jsonl"))) {
        if (++checked > 12) break;  // a process per case: a sample is enough here
        const std::string text = g["text"].get<std::string>();
        std::ofstream(in, std::ios::binary) << text;
        const bool parse_special = g["parse_special"].get<bool>();
        const Run enc = run("--tokenizer " + data_path("qwen3") + " --in " + in + (parse_special ? "" : " --no-special"));
        CAPTURE(text);
        REQUIRE(enc.status == 0);
        CHECK(nlohmann::ordered_json::parse(enc.out) == g["ids"]);
        std::ofstream(ids_file, std::ios::binary) << enc.out;
        const Run dec = run("--tokenizer " + data_path("qwen3/tokenizer.json") + " --in " + ids_file + " --decode");
        REQUIRE(dec.status == 0);
        CHECK(dec.out == g["decoded"].get<std::string>());
    }
    // Errors: non-zero exit, nothing on stdout.
    std::ofstream(in, std::ios::binary) << "bad \xff utf-8";
    Run bad = run("--tokenizer " + data_path("qwen3") + " --in " + in);
    CHECK(bad.status != 0);
    CHECK(bad.out.empty());
    bad = run("--tokenizer /nonexistent --in " + in);
    CHECK(bad.status != 0);
    std::ofstream(ids_file, std::ios::binary) << "[1, 2, \"x\"]";
    bad = run("--tokenizer " + data_path("demo") + " --in " + ids_file + " --decode");
    CHECK(bad.status != 0);
    std::ofstream(ids_file, std::ios::binary) << "[1, 999999]";
    bad = run("--tokenizer " + data_path("demo") + " --in " + ids_file + " --decode");
    CHECK(bad.status != 0);
    bad = run("--in " + in);  // --tokenizer is required
    CHECK(bad.status != 0);
    std::filesystem::remove_all(dir);
}
