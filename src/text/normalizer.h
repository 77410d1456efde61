// Normalizers and pre-tokenizers of the Hugging Face tokenizers format (the subset byte-level BPE
// models use), configured from the "normalizer" and "pre_tokenizer" sections of tokenizer.json.
#pragma once

#include "text/regex.h"
#include "text/unicode.h"

#include <nlohmann/json.hpp>

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace spark {

class Normalizer {
public:
    // null -> nullptr. Throws SPARK_ERR_UNSUPPORTED for normalizer types spark does not implement.
    static std::unique_ptr<Normalizer> from_json(const nlohmann::json & j);
    std::string apply(std::string_view text) const;

private:
    struct Step {
        enum Kind { Form, Lowercase } kind;
        unicode::NormalForm form = unicode::NormalForm::NFC;
    };
    std::vector<Step> steps_;
};

// How a Split pre-tokenizer treats the matched pieces (HF SplitDelimiterBehavior).
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

class PreTokenizer {
public:
    // null -> nullptr. Throws SPARK_ERR_UNSUPPORTED for unknown types, INVALID_FORMAT for bad fields.
    static std::unique_ptr<PreTokenizer> from_json(const nlohmann::json & j);

    // Splits `text` into words (appended to `words`). Words are views into `text` or into strings
    // kept alive in `storage` (a ByteLevel prefix space creates new text).
    void split(std::string_view text, std::vector<std::string_view> & words, std::deque<std::string> & storage) const;

    // True when a ByteLevel step maps bytes to the GPT-2 alphabet (the BPE model then sees bytes).
    bool byte_level() const { return byte_level_; }

private:
    struct Step {
        enum Kind { Split, ByteLevel } kind;
        std::unique_ptr<Regex> regex;  // Split, or ByteLevel with use_regex
        SplitBehavior behavior = SplitBehavior::Isolated;
        bool invert = false, add_prefix_space = false;
    };
    void add_steps(const nlohmann::json & j, const std::string & path);  // path: "pre_tokenizer..." for messages
    static void apply_split(const Step & step, std::string_view piece, std::vector<std::string_view> & out);

    std::vector<Step> steps_;
    bool              byte_level_ = false;
};

}  // namespace spark
