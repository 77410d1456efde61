// spark-tokenize: prints the token ids of a UTF-8 text as a JSON array, or (--decode) the text of a
// JSON array of ids. The input is the TEXT argument or a file. Errors go to stderr with a non-zero
// exit status (2 for bad options, 1 for other errors).
//
//   spark-tokenize --tokenizer PATH "TEXT" [--no-special]
//   spark-tokenize --tokenizer PATH --in FILE [--no-special]
//   spark-tokenize --tokenizer PATH --decode "[1, 2, 3]" [--skip-special]
//   spark-tokenize --tokenizer PATH --in FILE --decode [--skip-special]
//
// PATH is a tokenizer.json, a model directory or a spark file. FILE "-" reads standard input.
#include <spark/spark.h>

#include <CLI/CLI.hpp>

#include "../common/parse_args.h"
#include "../common/version.h"
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace {

bool read_input(const std::string & path, std::string & out) {
    if (path == "-") {
        out.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
        return true;
    }
    std::ifstream f(path, std::ios::binary);
    if (!f) return false;
    std::ostringstream ss;
    ss << f.rdbuf();
    out = ss.str();
    return true;
}

int report(spark_status st, const char * what) {
    std::fprintf(stderr, "spark-tokenize: %s: %s (%s)\n", what, spark_last_error(), spark_status_str(st));
    return 1;
}

int encode(const spark_tokenizer * tok, const std::string & text, bool parse_special) {
    int32_t n = 0;
    spark_status st = spark_tokenize(tok, text.data(), text.size(), parse_special, nullptr, 0, &n);
    std::vector<spark_token> ids(size_t(n > 0 ? n : 0));
    if (st == SPARK_ERR_BUFFER_TOO_SMALL)
        st = spark_tokenize(tok, text.data(), text.size(), parse_special, ids.data(), n, &n);
    if (st != SPARK_OK) return report(st, "cannot tokenize the input");
    std::string out = "[";
    for (size_t k = 0; k < ids.size(); ++k) {
        if (k) out += ", ";
        out += std::to_string(ids[k]);
    }
    out += "]\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
}

int decode(const spark_tokenizer * tok, const std::string & json_text, bool skip_special) {
    std::vector<spark_token> ids;
    try {
        const auto j = nlohmann::json::parse(json_text);
        if (!j.is_array()) throw std::runtime_error("not a JSON array");
        for (const auto & v : j) {
            if (!v.is_number_integer()) throw std::runtime_error("the array must hold integer token ids");
            const auto id = v.get<int64_t>();
            if (id < INT32_MIN || id > INT32_MAX) throw std::runtime_error("token id out of range");
            ids.push_back(spark_token(id));
        }
    } catch (const std::exception & e) {
        std::fprintf(stderr, "spark-tokenize: --decode expects a JSON array of token ids: %s\n", e.what());
        return 1;
    }
    size_t len = 0;
    spark_status st = spark_detokenize(tok, ids.data(), int32_t(ids.size()), skip_special, nullptr, 0, &len);
    std::string text(len, '\0');
    if (st == SPARK_ERR_BUFFER_TOO_SMALL)
        st = spark_detokenize(tok, ids.data(), int32_t(ids.size()), skip_special, text.data(), text.size(), &len);
    if (st != SPARK_OK) return report(st, "cannot decode the ids");
    std::fwrite(text.data(), 1, len, stdout);
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    CLI::App app{"spark-tokenize: text to token ids (JSON array) and back"};
    app.option_defaults()->always_capture_default();  // --help shows the defaults
    std::string tokenizer_path, input_path, text;
    bool no_special = false, do_decode = false, skip_special = false;
    app.add_option("--tokenizer", tokenizer_path, "tokenizer.json, model directory or spark file")->required();
    CLI::Option * text_opt = app.add_option("text", text, "the text (with --decode: a JSON array of ids); after -- when it starts with -");
    CLI::Option * in_opt   = app.add_option("--in", input_path, "read the input from this file instead (UTF-8 text, or a JSON array with --decode); - for stdin");
    text_opt->excludes(in_opt);
    app.add_flag("--no-special", no_special, "treat special tokens in the text as plain text");
    app.add_flag("--decode", do_decode, "read a JSON array of ids and print the text");
    app.add_flag("--skip-special", skip_special, "with --decode: drop special tokens");
    spark_cli::add_version_flag(app, "spark-tokenize");
    if (const auto stop = spark_cli::parse_args(app, argc, argv, "spark-tokenize")) return *stop;
    if (text_opt->count() == 0 && in_opt->count() == 0) {
        std::fprintf(stderr, "spark-tokenize: give the TEXT to %s, or --in FILE (--in - reads standard input)\n", do_decode ? "decode" : "tokenize");
        return 2;
    }
    if (skip_special && !do_decode) {
        std::fprintf(stderr, "spark-tokenize: --skip-special goes with --decode\n");
        return 2;
    }
    if (no_special && do_decode) {
        std::fprintf(stderr, "spark-tokenize: --no-special applies to tokenizing, not to --decode (--skip-special drops special tokens)\n");
        return 2;
    }

    std::string input = text;
    if (in_opt->count() > 0 && !read_input(input_path, input)) {
        std::fprintf(stderr, "spark-tokenize: cannot read %s\n", input_path.c_str());
        return 1;
    }
    spark_tokenizer * tok = nullptr;
    const spark_status st = spark_tokenizer_load(tokenizer_path.c_str(), &tok);
    if (st != SPARK_OK) return report(st, "cannot load the tokenizer");
    const int rc = do_decode ? decode(tok, input, skip_special) : encode(tok, input, !no_special);
    spark_tokenizer_free(tok);
    return rc;
}
