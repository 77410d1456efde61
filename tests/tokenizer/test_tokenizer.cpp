// Tokenizer tests: Hugging Face goldens (encode ids, decode text), the C API contract, error
// handling for corrupt inputs, and the streaming detokenizer.
#include "common/error.h"
#include "text/bpe.h"
#include "text/regex.h"
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "tokenizer_test_util.h"

#include <doctest/doctest.h>
#include <spark/spark.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

using tokenizer_test::data_path;
using tokenizer_test::read_file;
using tokenizer_test::read_jsonl;

namespace {

const spark::Tokenizer & qwen3() {
    static const spark::Tokenizer tok = spark::Tokenizer::from_directory(data_path("qwen3"));
    return tok;
}

const spark::Tokenizer & demo() {
    static const spark::Tokenizer tok = spark::Tokenizer::from_directory(data_path("demo"));
    return tok;
}

std::vector<int32_t> ids_of(const nlohmann::ordered_json & j) { return j.get<std::vector<int32_t>>(); }

// Runs every line of a golden file: {"text", "ids", "decoded"[, "parse_special"]}.
void check_goldens(const spark::Tokenizer & tok, const std::string & file, size_t min_lines) {
    const auto lines = read_jsonl(file);
    REQUIRE(lines.size() >= min_lines);
    size_t n = 0;
    for (const auto & g : lines) {
        const std::string text   = g["text"].get<std::string>();
        const bool parse_special = g.value("parse_special", true);
        CAPTURE(text);
        const std::vector<int32_t> ids = tok.encode(text, parse_special);
        CHECK(ids == ids_of(g["ids"]));
        if (g.contains("decoded")) CHECK(tok.decode(ids_of(g["ids"]), false) == g["decoded"].get<std::string>());
        if (g.contains("decoded_skip_special"))
            CHECK(tok.decode(ids_of(g["ids"]), true) == g["decoded_skip_special"].get<std::string>());
        ++n;
    }
    MESSAGE(file << ": " << n << " goldens");
}

}  // namespace

TEST_CASE("qwen3 tokenizer matches the Hugging Face goldens") {
    check_goldens(qwen3(), data_path("qwen3/golden.jsonl"), 36);
}

TEST_CASE("qwen3 tokenizer matches the extra goldens (tokenizers library)") {
    check_goldens(qwen3(), data_path("qwen3_extra_golden.jsonl"), 20);
}

TEST_CASE("demo tokenizer matches its goldens (tokenizers library)") {
    check_goldens(demo(), data_path("demo_golden.jsonl"), 20);
}

TEST_CASE("tokenizer variants match their goldens (add_prefix_space - use_regex - added token flags - split behaviors)") {
    const auto base = nlohmann::json::parse(read_file(data_path("demo/tokenizer.json")));
    size_t n = 0;
    for (const auto & entry : read_jsonl(data_path("variant_golden.jsonl"))) {
        // Each line is a JSON Patch of the demo tokenizer.json and the HF results on it.
        const auto patch = nlohmann::json::parse(entry["patch"].dump());
        const auto tok   = spark::Tokenizer::from_json_strings(base.patch(patch).dump(), "", "");
        ++n;
        CAPTURE(entry["variant"].get<std::string>());
        for (const auto & c : entry["cases"]) {
            const std::string text = c["text"].get<std::string>();
            CAPTURE(text);
            CHECK(tok.encode(text, c.value("parse_special", true)) == ids_of(c["ids"]));
            CHECK(tok.decode(ids_of(c["ids"]), false) == c["decoded"].get<std::string>());
        }
    }
    CHECK(n >= 20);
}

TEST_CASE("special tokens - eos - end-of-generation ids") {
    const auto & q = qwen3();
    CHECK(q.n_vocab() == 151669);
    CHECK(q.find("<|im_end|>") == 151645);
    CHECK(q.find("<|endoftext|>") == 151643);
    CHECK(q.find("Hello") == 9707);
    CHECK(q.find("not-a-token-at-all") == -1);
    CHECK(q.eos() == 151645);
    CHECK(q.bos() == -1);
    CHECK(q.is_eog(151645));
    CHECK_FALSE(q.is_eog(151643));  // no generation_config.json for this one
    CHECK(q.is_special(151644));
    CHECK_FALSE(q.is_special(151667));  // <think> is an added token but not special
    CHECK_FALSE(q.is_special(9707));
    CHECK(q.chat_template().find("<|im_start|>") != std::string::npos);

    const auto & d = demo();
    CHECK(d.n_vocab() == 8192);
    CHECK(d.eos() == 8191);
    CHECK(d.is_eog(8191));
    CHECK(d.is_eog(8189));  // from generation_config.json's eos_token_id list
    CHECK_FALSE(d.is_eog(8190));
}

TEST_CASE("parse_special=false keeps special tokens as text but still matches added tokens") {
    const auto & q = qwen3();
    const std::string text = "<|im_start|>user<think>x</think><|im_end|>";
    const auto with    = q.encode(text, true);
    const auto without = q.encode(text, false);
    CHECK(with.front() == 151644);
    CHECK(std::count(without.begin(), without.end(), 151644) == 0);
    CHECK(std::count(without.begin(), without.end(), 151667) == 1);  // <think> is not special
    CHECK(q.decode(without, false) == text);
}

TEST_CASE("the three source documents are kept for the converter") {
    const auto & d = demo();
    CHECK(d.tokenizer_json() == read_file(data_path("demo/tokenizer.json")));
    CHECK(d.tokenizer_config_json() == read_file(data_path("demo/tokenizer_config.json")));
    CHECK(d.generation_config_json() == read_file(data_path("demo/generation_config.json")));
    const auto copy = spark::Tokenizer::from_json_strings(d.tokenizer_json(), d.tokenizer_config_json(),
                                                          d.generation_config_json());
    CHECK(copy.encode("def main():\n    return 42\n") == d.encode("def main():\n    return 42\n"));
    CHECK(copy.is_eog(8189));
}

TEST_CASE("BPE: the linear scan and the heap merge loops agree") {
    // Random byte strings over a small alphabet produce many competing merges.
    const auto tok_json = read_file(data_path("demo/tokenizer.json"));
    const auto j        = nlohmann::json::parse(tok_json);
    std::vector<std::pair<std::string, int32_t>> vocab;
    for (const auto & [k, v] : j["model"]["vocab"].items()) vocab.emplace_back(k, v.get<int32_t>());
    std::vector<std::pair<std::string, std::string>> merges;
    for (const auto & m : j["model"]["merges"]) merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    spark::BpeOptions opt;
    opt.byte_level = true;
    spark::BpeModel model(vocab, merges, opt);
    std::mt19937 rng(7);
    const std::string alphabet = "aeinrst _\n(){}";
    for (int iter = 0; iter < 300; ++iter) {
        std::vector<int32_t> a;
        const size_t len = 1 + rng() % 90;
        for (size_t k = 0; k < len; ++k) {
            std::string ch;
            spark::unicode::append_utf8(ch, spark::unicode::byte_to_codepoint()[uint8_t(alphabet[rng() % alphabet.size()])]);
            a.push_back(model.token_to_id(ch));
            REQUIRE(a.back() >= 0);
        }
        std::vector<int32_t> b = a;
        model.merge_symbols(a, false);
        model.merge_symbols(b, true);
        REQUIRE(a == b);
    }
}

TEST_CASE("regex translation keeps Oniguruma's \\s (U+0085 is whitespace)") {
    spark::Regex re("\\s+");
    size_t s, e;
    const std::string nel = "a\xC2\x85" "b";
    REQUIRE(re.find(nel, 0, s, e));
    CHECK(s == 1);
    CHECK(e == 3);
    CHECK(spark::Regex::translate_pattern("[^\\s\\p{L}]") == "[^\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}\\p{L}]");
}

TEST_CASE("long words (heap merge path) and long inputs") {
    const auto & q = qwen3();
    const std::string long_word(5000, 'a');
    const auto ids = q.encode(long_word);
    CHECK(q.decode(ids, false) == long_word);
    std::string mixed;
    for (int k = 0; k < 200; ++k) mixed += "int x" + std::to_string(k) + " = 你好世界 😀;\n";
    CHECK(q.decode(q.encode(mixed), false) == mixed);
}

TEST_CASE("encoding from several threads at once gives the same ids") {
    const auto & q = qwen3();
    std::vector<std::string> texts;
    for (const auto & g : read_jsonl(data_path("qwen3/golden.jsonl"))) texts.push_back(g["text"].get<std::string>());
    std::vector<std::vector<int32_t>> expected;
    for (const auto & t : texts) expected.push_back(q.encode(t));
    std::atomic<int> mismatches{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&] {
            for (int rep = 0; rep < 20; ++rep)
                for (size_t k = 0; k < texts.size(); ++k)
                    if (q.encode(texts[k]) != expected[k]) ++mismatches;
        });
    }
    for (auto & th : threads) th.join();
    CHECK(mismatches == 0);
}

// ------------------------------------------------------------------------------------------------
// C API

TEST_CASE("C API: load - tokenize - pieces - detokenize with the buffer protocol") {
    spark_tokenizer * tok = nullptr;
    REQUIRE(spark_tokenizer_load(data_path("qwen3").c_str(), &tok) == SPARK_OK);
    REQUIRE(tok);
    CHECK(spark_tokenizer_n_vocab(tok) == 151669);
    CHECK(spark_tokenizer_eos(tok) == 151645);
    CHECK(spark_tokenizer_bos(tok) == -1);
    CHECK(spark_tokenizer_find(tok, "<|im_start|>") == 151644);
    CHECK(spark_tokenizer_is_special(tok, 151644));
    CHECK(spark_tokenizer_is_eog(tok, 151645));
    REQUIRE(spark_tokenizer_chat_template(tok) != nullptr);

    const char * text = "Hello, world! How are you today?";
    int32_t n = 0;
    CHECK(spark_tokenize(tok, text, std::strlen(text), true, nullptr, 0, &n) == SPARK_ERR_BUFFER_TOO_SMALL);
    CHECK(n == 9);
    spark_token small[4] = {-1, -1, -1, -1};
    CHECK(spark_tokenize(tok, text, std::strlen(text), true, small, 4, &n) == SPARK_ERR_BUFFER_TOO_SMALL);
    CHECK(n == 9);
    CHECK(std::string(spark_last_error()).find("do not fit") != std::string::npos);
    spark_token ids[16];
    REQUIRE(spark_tokenize(tok, text, std::strlen(text), true, ids, 16, &n) == SPARK_OK);
    CHECK(n == 9);
    CHECK(ids[0] == 9707);
    CHECK(ids[8] == 30);
    CHECK(std::string(spark_last_error()).empty());

    char buf[64];
    size_t len = 0;
    REQUIRE(spark_token_to_piece(tok, 9707, buf, sizeof buf, &len) == SPARK_OK);
    CHECK(std::string(buf, len) == "Hello");
    CHECK(spark_token_to_piece(tok, 9707, buf, 2, &len) == SPARK_ERR_BUFFER_TOO_SMALL);
    CHECK(len == 5);
    CHECK(spark_token_to_piece(tok, 999999, buf, sizeof buf, &len) == SPARK_ERR_INVALID_TOKEN);
    CHECK(spark_token_to_piece(tok, -1, buf, sizeof buf, &len) == SPARK_ERR_INVALID_TOKEN);

    REQUIRE(spark_detokenize(tok, ids, n, false, buf, sizeof buf, &len) == SPARK_OK);
    CHECK(std::string(buf, len) == text);
    CHECK(spark_detokenize(tok, ids, n, false, buf, 3, &len) == SPARK_ERR_BUFFER_TOO_SMALL);
    CHECK(len == std::strlen(text));
    const spark_token bad[2] = {9707, 200000};
    CHECK(spark_detokenize(tok, bad, 2, false, buf, sizeof buf, &len) == SPARK_ERR_INVALID_TOKEN);

    // skip_special drops <|im_start|>/<|im_end|> but not <think>.
    const spark_token turn[4] = {151644, 9707, 151667, 151645};
    REQUIRE(spark_detokenize(tok, turn, 4, true, buf, sizeof buf, &len) == SPARK_OK);
    CHECK(std::string(buf, len) == "Hello<think>");
    REQUIRE(spark_detokenize(tok, turn, 4, false, buf, sizeof buf, &len) == SPARK_OK);
    CHECK(std::string(buf, len) == "<|im_start|>Hello<think><|im_end|>");

    CHECK(spark_tokenize(nullptr, text, 3, true, ids, 16, &n) == SPARK_ERR_INVALID_ARGUMENT);
    CHECK(spark_tokenize(tok, text, 3, true, ids, 16, nullptr) == SPARK_ERR_INVALID_ARGUMENT);
    CHECK(spark_tokenize(tok, nullptr, 0, true, ids, 16, &n) == SPARK_OK);
    CHECK(n == 0);
    spark_tokenizer_free(tok);
    spark_tokenizer_free(nullptr);
}

TEST_CASE("C API: invalid UTF-8 input is SPARK_ERR_INVALID_TEXT") {
    spark_tokenizer * tok = nullptr;
    REQUIRE(spark_tokenizer_load(data_path("demo/tokenizer.json").c_str(), &tok) == SPARK_OK);
    const char * bad_inputs[] = {"abc\xff", "\xc3", "\xe4\xbd", "\xed\xa0\x80", "\xc0\xaf", "ok \xf4\x90\x80\x80"};
    for (const char * s : bad_inputs) {
        int32_t n = 0;
        spark_token ids[16];
        CHECK(spark_tokenize(tok, s, std::strlen(s), true, ids, 16, &n) == SPARK_ERR_INVALID_TEXT);
        CHECK(std::string(spark_last_error()).find("UTF-8") != std::string::npos);
    }
    spark_tokenizer_free(tok);
}

TEST_CASE("C API: load errors") {
    spark_tokenizer * tok = nullptr;
    CHECK(spark_tokenizer_load("/nonexistent/tokenizer.json", &tok) == SPARK_ERR_IO);
    CHECK(tok == nullptr);
    CHECK(spark_tokenizer_load(nullptr, &tok) == SPARK_ERR_INVALID_ARGUMENT);

    const auto dir = std::filesystem::temp_directory_path() / ("spark-tok-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    auto write = [&](const std::string & name, const std::string & content) {
        std::ofstream(dir / name, std::ios::binary) << content;
        return (dir / name).string();
    };
    // A truncated spark (GGUF) file: the container's validation error. (Loading a tokenizer from a
    // real spark file is tested with the converter in tests/models/test_spark_tokenizer.cpp.)
    const auto gguf = write("model.spark", std::string("GGUF\x03\0\0\0", 8));
    CHECK(spark_tokenizer_load(gguf.c_str(), &tok) == SPARK_ERR_INVALID_FORMAT);
    CHECK(tok == nullptr);
    // A directory without tokenizer.json.
    CHECK(spark_tokenizer_load(dir.c_str(), &tok) == SPARK_ERR_IO);
    // Other model types.
    const auto wp = write("wordpiece.json", R"({"model": {"type": "WordPiece", "vocab": {"a": 0}, "merges": []}})");
    CHECK(spark_tokenizer_load(wp.c_str(), &tok) == SPARK_ERR_UNSUPPORTED);
    const auto meta = write("meta.json", R"({"pre_tokenizer": {"type": "Metaspace"}, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
    CHECK(spark_tokenizer_load(meta.c_str(), &tok) == SPARK_ERR_UNSUPPORTED);
    // Missing vocab or merges.
    const auto nov = write("novocab.json", R"({"model": {"type": "BPE", "merges": []}})");
    CHECK(spark_tokenizer_load(nov.c_str(), &tok) == SPARK_ERR_INVALID_FORMAT);
    const auto nom = write("nomerges.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}}})");
    CHECK(spark_tokenizer_load(nom.c_str(), &tok) == SPARK_ERR_INVALID_FORMAT);
    const auto badmerge = write("badmerge.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})");
    CHECK(spark_tokenizer_load(badmerge.c_str(), &tok) == SPARK_ERR_INVALID_FORMAT);
    CHECK(std::string(spark_last_error()).find("merge 0") != std::string::npos);
    // A corrupt tokenizer_config.json in a directory.
    std::filesystem::copy_file(data_path("demo/tokenizer.json"), dir / "tokenizer.json");
    write("tokenizer_config.json", "{\"eos_token\": ");
    CHECK(spark_tokenizer_load(dir.c_str(), &tok) == SPARK_ERR_INVALID_FORMAT);
    CHECK(std::string(spark_last_error()).find("tokenizer_config.json") != std::string::npos);
    std::filesystem::remove_all(dir);
    CHECK(tok == nullptr);
}

TEST_CASE("truncated and corrupt tokenizer.json never crash and report INVALID_FORMAT") {
    const std::string full = read_file(data_path("demo/tokenizer.json"));
    // Cut at many points, including inside the vocab, the merges and the final brace.
    const size_t cuts[] = {0, 1, 2, 10, 100, 1000, full.size() / 7, full.size() / 3, full.size() / 2,
                           full.size() * 9 / 10, full.size() - 3, full.size() - 2};
    for (const size_t cut : cuts) {
        CAPTURE(cut);
        try {
            spark::Tokenizer::from_json_strings(full.substr(0, cut), "", "");
            FAIL("a truncated tokenizer.json loaded");
        } catch (const spark::Error & e) {
            CHECK(e.status() == SPARK_ERR_INVALID_FORMAT);
            CHECK(std::string(e.what()).find("tokenizer.json") != std::string::npos);
        }
    }
    // Byte flips at random positions: any outcome but a crash; a failure must be INVALID_FORMAT
    // (or UNSUPPORTED when a type name was hit).
    std::mt19937 rng(1234);
    int failures = 0;
    for (int k = 0; k < 60; ++k) {
        std::string corrupt = full;
        const size_t at = rng() % corrupt.size();
        corrupt[at] = "{}[]\",:\\x\xff"[rng() % 11];
        try {
            const auto tok = spark::Tokenizer::from_json_strings(corrupt, "", "");
            (void) tok.encode("hello world");
        } catch (const spark::Error & e) {
            ++failures;
            const bool expected = e.status() == SPARK_ERR_INVALID_FORMAT || e.status() == SPARK_ERR_UNSUPPORTED;
            CHECK_MESSAGE(expected, std::string(e.what()));
        }
    }
    CHECK(failures > 0);
    // Hostile nesting depth.
    try {
        spark::Tokenizer::from_json_strings(std::string(100000, '['), "", "");
        FAIL("deep nesting loaded");
    } catch (const spark::Error & e) {
        CHECK(e.status() == SPARK_ERR_INVALID_FORMAT);
    }
}

// ------------------------------------------------------------------------------------------------
// Streaming detokenizer

namespace {

// Pushes ids one by one; returns the concatenated output and checks each chunk is valid UTF-8.
std::string stream_all(const spark_tokenizer * tok, const std::vector<int32_t> & ids, bool skip_special) {
    spark_detok_stream * s = spark_detok_stream_init(tok, skip_special);
    REQUIRE(s);
    std::string all;
    char buf[256];
    size_t len = 0;
    for (int32_t id : ids) {
        REQUIRE(spark_detok_stream_push(s, id, buf, sizeof buf, &len) == SPARK_OK);
        const std::string chunk(buf, len);
        CHECK(spark::unicode::is_valid_utf8(chunk));
        all += chunk;
    }
    REQUIRE(spark_detok_stream_flush(s, buf, sizeof buf, &len) == SPARK_OK);
    all += std::string(buf, len);
    spark_detok_stream_free(s);
    return all;
}

}  // namespace

TEST_CASE("streaming detokenizer never emits half a character") {
    // The demo tokenizer (8k vocab) encodes 你好 as six one-byte tokens (checked against HF):
    // nothing comes out until a character completes.
    spark_tokenizer * demo_tok = nullptr;
    REQUIRE(spark_tokenizer_load(data_path("demo").c_str(), &demo_tok) == SPARK_OK);
    const auto & d = demo_tok->tokenizer;
    const auto ids = d.encode("你好");
    REQUIRE(ids.size() == 6);
    spark_detok_stream * s = spark_detok_stream_init(demo_tok, false);
    char buf[64];
    size_t len = 99;
    std::vector<size_t> lens;
    for (int32_t id : ids) {
        REQUIRE(spark_detok_stream_push(s, id, buf, sizeof buf, &len) == SPARK_OK);
        lens.push_back(len);
    }
    CHECK(lens == std::vector<size_t>{0, 0, 3, 0, 0, 3});

    // A too-small buffer leaves the stream unchanged, so the push can be retried.
    const auto emoji = d.encode("😀");
    REQUIRE(emoji.size() >= 2);
    for (size_t k = 0; k + 1 < emoji.size(); ++k) REQUIRE(spark_detok_stream_push(s, emoji[k], buf, sizeof buf, &len) == SPARK_OK);
    CHECK(spark_detok_stream_push(s, emoji.back(), buf, 2, &len) == SPARK_ERR_BUFFER_TOO_SMALL);
    CHECK(len == 4);
    REQUIRE(spark_detok_stream_push(s, emoji.back(), buf, sizeof buf, &len) == SPARK_OK);
    CHECK(std::string(buf, len) == "😀");

    // An incomplete tail is flushed as U+FFFD, and the stream starts over.
    const auto first_byte = d.encode("你").front();
    REQUIRE(spark_detok_stream_push(s, first_byte, buf, sizeof buf, &len) == SPARK_OK);
    CHECK(len == 0);
    REQUIRE(spark_detok_stream_flush(s, buf, sizeof buf, &len) == SPARK_OK);
    CHECK(std::string(buf, len) == "\xEF\xBF\xBD");
    REQUIRE(spark_detok_stream_flush(s, buf, sizeof buf, &len) == SPARK_OK);
    CHECK(len == 0);
    spark_detok_stream_free(s);
    const std::vector<int32_t> broken = {d.encode("你").back(), d.encode("a").front()};
    CHECK(stream_all(demo_tok, broken, false) == d.decode(broken, false));
    CHECK(d.decode(broken, false) == "\xEF\xBF\xBD" "a");
    spark_tokenizer_free(demo_tok);

    spark_tokenizer * tok = nullptr;
    REQUIRE(spark_tokenizer_load(data_path("qwen3").c_str(), &tok) == SPARK_OK);
    const auto & q = tok->tokenizer;
    // On every golden the stream's output equals detokenize.
    for (const auto & g : read_jsonl(data_path("qwen3/golden.jsonl"))) {
        const auto gids = ids_of(g["ids"]);
        CHECK(stream_all(tok, gids, false) == q.decode(gids, false));
        CHECK(stream_all(tok, gids, true) == q.decode(gids, true));
    }
    // Emoji and rare CJK split inside characters by the 151k vocabulary as well.
    const std::string rare = "😀😃😄 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ 龘靐齉";
    const auto rare_ids = q.encode(rare);
    CHECK(std::any_of(rare_ids.begin(), rare_ids.end(), [&](int32_t id) { return !spark::unicode::is_valid_utf8(q.piece(id)); }));
    CHECK(stream_all(tok, rare_ids, false) == rare);
    CHECK(spark_detok_stream_init(nullptr, false) == nullptr);
    spark_tokenizer_free(tok);
}

TEST_CASE("unicode helpers: lossy UTF-8 replacement matches Python's errors='replace'") {
    // Expected strings from Python: bytes.decode("utf-8", "replace").
    auto lossy = [](const std::string & b) {
        std::string out;
        spark::unicode::append_utf8_lossy(out, b);
        return out;
    };
    const std::string R = "\xEF\xBF\xBD";
    CHECK(lossy("a\x80" "b") == "a" + R + "b");
    CHECK(lossy("\xE4\xBD") == R);                   // one truncated sequence, one replacement
    CHECK(lossy("\xE4\xBD" "a") == R + "a");
    CHECK(lossy("\xED\xA0\x80") == R + R + R);       // surrogates: each byte replaced
    CHECK(lossy("\xF0\x9F\x98") == R);
    CHECK(lossy("\xC0\xAF") == R + R);
    CHECK(lossy("\xF4\x90\x80\x80") == R + R + R + R);
}
