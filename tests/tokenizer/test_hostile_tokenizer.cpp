// Hostile tokenizer files (docs/RELIABILITY.md, "Tokenizers"): ids that would size allocations,
// ids that do not fit 32 bits, fields of the wrong JSON type, pre-tokenizer regexes that cannot
// match. Each must fail at load, fast, with SPARK_ERR_INVALID_FORMAT and a message naming the field
// and the file; nothing may fail later at encode time or abort.
#include "common/error.h"
#include "text/regex.h"
#include "text/tokenizer.h"
#include "tokenizer_test_util.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <spark/spark.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>

using tokenizer_test::data_path;
using tokenizer_test::read_file;
using json = nlohmann::json;

namespace {

// A small, valid tokenizer.json: byte-level BPE over "a", "b", "ab".
json tiny_tokenizer() {
    return json::parse(R"({
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3}, "merges": ["a b"]},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
        "decoder": {"type": "ByteLevel"},
        "added_tokens": [{"id": 4, "content": "<s>", "special": true}]
    })");
}

struct Rejection {
    spark_status status = SPARK_OK;
    std::string  message;
    double       seconds = 0.0;
};

Rejection load_strings(const std::string & tokenizer_json, const std::string & config = "", const std::string & generation = "") {
    Rejection  r;
    const auto t0 = std::chrono::steady_clock::now();
    try {
        const spark::Tokenizer tok = spark::Tokenizer::from_json_strings(tokenizer_json, config, generation);
        (void) tok.encode("ab ba <s> abab");
    } catch (const spark::Error & e) {
        r.status  = e.status();
        r.message = e.what();
    } catch (const std::exception & e) {
        r.status  = SPARK_ERR_INTERNAL;
        r.message = e.what();
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
}

bool contains(const std::string & s, const std::string & part) { return s.find(part) != std::string::npos; }

void check_rejected(const Rejection & r, const char * file, const char * field) {
    CAPTURE(r.message);
    CHECK(r.status == SPARK_ERR_INVALID_FORMAT);
    CHECK(contains(r.message, file));
    CHECK(contains(r.message, field));
    CHECK(r.seconds < 1.0);
}

}  // namespace

TEST_CASE("the tiny tokenizer of these tests loads") {
    const auto tok = spark::Tokenizer::from_json_strings(tiny_tokenizer().dump(), "", "");
    CHECK(tok.encode("ab", true) == std::vector<int32_t>{2});
    CHECK(tok.n_vocab() == 5);
}

TEST_CASE("a vocabulary id far above the number of entries is refused, not allocated") {
    json t = tiny_tokenizer();
    t["model"]["vocab"]["b"] = (1 << 30) - 1;  // one entry would size a 2^30-entry table
    check_rejected(load_strings(t.dump()), "tokenizer.json", "vocab");
    // Small gaps stay allowed (HF vocabularies have a few holes).
    t["model"]["vocab"]["b"] = 10;
    const auto tok = spark::Tokenizer::from_json_strings(t.dump(), "", "");
    CHECK(tok.encode("b", true) == std::vector<int32_t>{10});
}

TEST_CASE("token ids that do not fit 32 bits are refused, never truncated") {
    json t = tiny_tokenizer();
    t["model"]["vocab"]["b"] = (int64_t(1) << 32) + 1;
    check_rejected(load_strings(t.dump()), "tokenizer.json", "vocab");
    check_rejected(load_strings(tiny_tokenizer().dump(), "", R"({"eos_token_id": 4294967297})"), "generation_config.json", "eos_token_id");
    check_rejected(load_strings(tiny_tokenizer().dump(), "", R"({"eos_token_id": [1, 18446744073709551615]})"), "generation_config.json",
                   "eos_token_id");
    check_rejected(load_strings(tiny_tokenizer().dump(), R"({"added_tokens_decoder": {"4294967300": {"content": "x"}}})"),
                   "tokenizer_config.json", "added_tokens_decoder");
    // Ids that fit but are not in the vocabulary (5 ids: 4 entries and <s>).
    check_rejected(load_strings(tiny_tokenizer().dump(), "", R"({"eos_token_id": [4, 5]})"), "generation_config.json", "eos_token_id");
    CHECK(spark::Tokenizer::from_json_strings(tiny_tokenizer().dump(), "", R"({"eos_token_id": [4, -1]})").is_eog(4));
    json a = tiny_tokenizer();
    a["added_tokens"][0]["id"] = uint64_t(18446744073709551615ull);
    check_rejected(load_strings(a.dump()), "tokenizer.json", "id");
}

TEST_CASE("fields of the wrong JSON type are INVALID_FORMAT naming the field, not internal errors") {
    json d = tiny_tokenizer();
    d["decoder"]["type"] = 5;
    check_rejected(load_strings(d.dump()), "tokenizer.json", "decoder");
    json s = tiny_tokenizer();
    s["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", 7}};
    check_rejected(load_strings(s.dump()), "tokenizer.json", "behavior");
    json n = tiny_tokenizer();
    n["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", json::array()}}}}};
    check_rejected(load_strings(n.dump()), "tokenizer.json", "normalizer");
    check_rejected(load_strings(tiny_tokenizer().dump(), R"({"chat_template": [{"name": 5, "template": "x"}]})"), "tokenizer_config.json",
                   "chat_template");
    check_rejected(load_strings(tiny_tokenizer().dump(), R"({"eos_token": {"content": 5}})"), "tokenizer_config.json", "eos_token");
    check_rejected(load_strings(tiny_tokenizer().dump(), R"({"clean_up_tokenization_spaces": "yes"})"), "tokenizer_config.json",
                   "clean_up_tokenization_spaces");
    json m = tiny_tokenizer();
    m["model"]["dropout"] = "0.1";
    check_rejected(load_strings(m.dump()), "tokenizer.json", "dropout");
}

TEST_CASE("a pre-tokenizer regex that cannot match is refused at load, not at every encode") {
    for (const std::string pattern : {"(?R)", "a(?R)?b|(?R)", "(?1)(a|(?1))", "(?&x)(?<x>(?&x))"}) {
        CAPTURE(pattern);
        json t = tiny_tokenizer();
        t["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}};
        const Rejection r = load_strings(t.dump());
        CAPTURE(r.message);
        CHECK(r.status == SPARK_ERR_INVALID_FORMAT);
        CHECK(contains(r.message, "tokenizer.json"));
        CHECK(contains(r.message, "regex"));
        CHECK(r.seconds < 1.0);
    }
}

TEST_CASE("a regex that fails on one input is a clean error from the API, and the tokenizer stays usable") {
    // Exponential backtracking: fine on short words, over the match limit on a long one.
    spark::Regex re("(a|aa)+$");
    size_t       start = 0, end = 0;
    CHECK(re.find("aaaa", 0, start, end));
    const std::string hostile = std::string(200, 'a') + "!";
    const auto        t0      = std::chrono::steady_clock::now();
    try {
        re.find(hostile, 0, start, end);
        FAIL("matched");
    } catch (const spark::Error & e) {
        CHECK(e.status() == SPARK_ERR_INVALID_FORMAT);
        CHECK(contains(e.what(), "(a|aa)+$"));
    }
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0);

    json t = tiny_tokenizer();
    t["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(a|aa)+$"}}}, {"behavior", "Isolated"}};
    const auto path = std::filesystem::temp_directory_path() / ("spark-hostile-regex-" + std::to_string(::getpid()) + ".json");
    std::ofstream(path) << t.dump();
    spark_tokenizer * tok = nullptr;
    REQUIRE(spark_tokenizer_load(path.c_str(), &tok) == SPARK_OK);
    std::filesystem::remove(path);
    spark_token ids[16];
    int32_t     n = 0;
    CHECK(spark_tokenize(tok, hostile.data(), hostile.size(), true, ids, 16, &n) == SPARK_ERR_INVALID_FORMAT);
    CHECK(contains(spark_last_error(), "regex"));
    CHECK(spark_tokenize(tok, "ab", 2, true, ids, 16, &n) == SPARK_OK);
    CHECK(n == 1);
    spark_tokenizer_free(tok);
}

TEST_CASE("C API: tokenizing empty text gives zero tokens") {
    spark_tokenizer * tok = nullptr;
    REQUIRE(spark_tokenizer_load(data_path("demo/tokenizer.json").c_str(), &tok) == SPARK_OK);
    spark_token ids[4] = {-1, -1, -1, -1};
    int32_t     n      = -1;
    CHECK(spark_tokenize(tok, "", 0, true, ids, 4, &n) == SPARK_OK);
    CHECK(n == 0);
    CHECK(ids[0] == -1);
    CHECK(spark_tokenize(tok, nullptr, 0, true, ids, 4, &n) == SPARK_OK);
    CHECK(n == 0);
    spark_tokenizer_free(tok);
}

TEST_CASE("an added token too long to match in linear time is refused; encoding stays linear") {
    json t = tiny_tokenizer();
    t["added_tokens"].push_back({{"id", 5}, {"content", std::string(100000, 'a')}, {"special", true}});
    check_rejected(load_strings(t.dump()), "tokenizer.json", "added_tokens[1].content");
    // The longest allowed token against a text that matches all of it but its last byte, everywhere.
    json longest = tiny_tokenizer();
    longest["added_tokens"].push_back({{"id", 5}, {"content", std::string(1023, 'a') + "!"}, {"special", true}});
    const auto tok = spark::Tokenizer::from_json_strings(longest.dump(), "", "");
    const auto t0  = std::chrono::steady_clock::now();
    (void) tok.encode(std::string(20000, 'a'));
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 2.0);
    // And in tokenizer_config.json.
    check_rejected(load_strings(tiny_tokenizer().dump(), json{{"added_tokens_decoder", {{"9", {{"content", std::string(2000, 'x')}}}}}}.dump()),
                   "tokenizer_config.json", "content");
}

namespace {

int64_t thread_cpu_ns() {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// A tokenizer whose only pre-tokenizer is a Split on `pattern`.
spark::Tokenizer split_tokenizer(const std::string & pattern) {
    json t             = tiny_tokenizer();
    t["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}};
    return spark::Tokenizer::from_json_strings(t.dump(), "", "");
}

Rejection encode_timed(const spark::Tokenizer & tok, const std::string & text) {
    Rejection  r;
    const auto t0 = std::chrono::steady_clock::now();
    try {
        (void) tok.encode(text);
    } catch (const spark::Error & e) {
        r.status  = e.status();
        r.message = e.what();
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
}

}  // namespace

TEST_CASE("a search costs at most a bound in proportion to its text") {
    // 2^17 steps at every 'a': over the bound of a search of 2000 bytes (it took 10 s when each
    // search could take PCRE2's default of 10M steps).
    const auto      tok = split_tokenizer("(?:a|a){16}b|a");
    const Rejection r   = encode_timed(tok, std::string(2000, 'a'));
    CAPTURE(r.message);
    CHECK(r.status == SPARK_ERR_INVALID_FORMAT);
    CHECK(contains(r.message, "(?:a|a){16}b|a"));
    CHECK(r.seconds < 1.0);
    CHECK(tok.encode("ab", true) == std::vector<int32_t>{0, 1});  // other text still encodes
}

TEST_CASE("the searches of one encode together are bounded by CPU time in proportion to the text") {
    // 2^18 steps at every 'a', within the bound of each search of 20000 bytes (324k steps), 20000
    // times: many seconds without the budget of an encode (1 s + 50 us per byte: 2 s, then 1 s of
    // CPU time). CPU time is what is measured: wall time depends on the machine's load.
    const auto    tok      = split_tokenizer("(?:a|a){17}b|a");
    const int64_t cpu0     = thread_cpu_ns();
    const Rejection r      = encode_timed(tok, std::string(20000, 'a'));
    const double  cpu_secs = double(thread_cpu_ns() - cpu0) * 1e-9;
    CAPTURE(r.message);
    CAPTURE(cpu_secs);
    CHECK(r.status == SPARK_ERR_INVALID_FORMAT);
    CHECK(contains(r.message, "ran for more than 2.0 s"));
    CHECK(cpu_secs < 4.5);  // at most the budget and a half, and 32 searches more
    CHECK(tok.encode("aab", true) == std::vector<int32_t>{0, 0, 1});
}
