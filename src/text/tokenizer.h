// spark::Tokenizer: a Hugging Face `tokenizers` BPE tokenizer (tokenizer.json) plus what
// tokenizer_config.json / generation_config.json add (chat template, bos/eos, end-of-generation ids).
// Immutable after construction and safe to use from several threads at once.
//
// The model loader builds one from the three JSON strings stored in a spark file
// (Tokenizer::from_json_strings) and owns it as std::unique_ptr<spark_tokenizer>.
#pragma once

#include <spark/spark.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace spark {

class Tokenizer {
public:
    // All constructors throw spark::Error: SPARK_ERR_IO (missing/unreadable file),
    // SPARK_ERR_INVALID_FORMAT (corrupt or truncated JSON, missing vocab/merges),
    // SPARK_ERR_UNSUPPORTED (a model type other than BPE, an unknown normalizer/pre-tokenizer).
    static Tokenizer from_file(const std::string & tokenizer_json_path);
    // tokenizer.json plus optional tokenizer_config.json, generation_config.json and chat_template.jinja.
    static Tokenizer from_directory(const std::string & model_dir);
    // The config strings may be empty (absent).
    static Tokenizer from_json_strings(std::string tokenizer_json, std::string tokenizer_config_json,
                                       std::string generation_config_json);

    Tokenizer(Tokenizer &&) noexcept;
    Tokenizer & operator=(Tokenizer &&) noexcept;
    ~Tokenizer();

    // Encodes valid UTF-8 text (SPARK_ERR_INVALID_TEXT otherwise), appending ids to `out`.
    // parse_special=false leaves special tokens as plain text (HF split_special_tokens=True);
    // non-special added tokens are still matched, as in HF.
    void                 encode(std::string_view text, bool parse_special, std::vector<int32_t> & out) const;
    std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;

    // HF `decode`: bytes of all tokens, invalid UTF-8 replaced by U+FFFD. Throws SPARK_ERR_INVALID_TOKEN.
    std::string decode(std::span<const int32_t> ids, bool skip_special) const;
    // The raw bytes of one token (may be part of a UTF-8 character). Throws SPARK_ERR_INVALID_TOKEN.
    std::string_view piece(int32_t id) const;

    int32_t n_vocab() const;
    int32_t bos() const;  // -1 when absent
    int32_t eos() const;  // -1 when absent
    bool    is_eog(int32_t id) const;
    bool    is_special(int32_t id) const;
    bool    is_valid(int32_t id) const { return id >= 0 && id < n_vocab(); }
    // Id of an exact token string: an added token's content or a vocabulary entry; -1 if none.
    int32_t find(std::string_view token) const;
    // Whether decode() inserts a space between tokens (no decoder configured, as HF's join(" ")).
    bool    joins_with_spaces() const;

    // Chat template from tokenizer_config.json ("" when none) and the bos/eos strings it sees.
    const std::string &               chat_template() const;
    const std::optional<std::string> & bos_token_text() const;
    const std::optional<std::string> & eos_token_text() const;

    // The source documents, so that a converter can store them in a spark file.
    const std::string & tokenizer_json() const;
    const std::string & tokenizer_config_json() const;
    const std::string & generation_config_json() const;

private:
    struct Impl;
    explicit Tokenizer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace spark

// The C handle. The model owns its tokenizer as std::unique_ptr<spark_tokenizer>.
struct spark_tokenizer {
    spark::Tokenizer tokenizer;
};
