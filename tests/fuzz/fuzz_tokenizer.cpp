// tokenizer.json (+ tokenizer_config.json, generation_config.json) -> Tokenizer, then an encode /
// decode round trip of a text (docs/RELIABILITY.md, "tokenizer.json"). The input holds up to four
// parts separated by NUL bytes: tokenizer.json, text, tokenizer_config.json, generation_config.json
// (missing parts are empty: the text, or absent config files).
#include "fuzz_util.h"
#include "text/tokenizer.h"

#include <tuple>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string_view in(reinterpret_cast<const char *>(data), size);
    std::string_view part[4], rest = in;  // tokenizer.json, text, tokenizer_config.json, generation_config.json
    for (std::string_view & p : part) std::tie(p, rest) = fuzz::split_at_nul(rest);
    const std::string_view text = part[1];
    fuzz::expect_spark_errors_only([&] {
        const spark::Tokenizer tok = spark::Tokenizer::from_json_strings(std::string(part[0]), std::string(part[2]), std::string(part[3]));
        (void) tok.bos(), (void) tok.eos(), (void) tok.chat_template();
        for (const bool parse_special : {true, false}) {
            std::vector<int32_t> ids;
            fuzz::expect_spark_errors_only([&] { tok.encode(text, parse_special, ids); });  // invalid UTF-8 is an error
            for (const int32_t id : ids) {
                if (!tok.is_valid(id)) __builtin_trap();  // encode must only produce ids of the vocabulary
                (void) tok.piece(id), (void) tok.is_special(id), (void) tok.is_eog(id);
            }
            for (const bool skip_special : {false, true}) (void) tok.decode(ids, skip_special);
        }
        // Ids around the vocabulary's edges: valid ones decode, the rest are INVALID_TOKEN.
        for (const int32_t id : {-1, 0, tok.n_vocab() - 1, tok.n_vocab()}) {
            const int32_t one[] = {id};
            fuzz::expect_spark_errors_only([&] { (void) tok.decode(one, false); });
        }
    });
    return 0;
}
