// PCRE2 (UTF + UCP, JIT-compiled) regex used by the pre-tokenizers. Hugging Face tokenizers uses
// Oniguruma; the patterns are translated where the two engines disagree (see translate_pattern).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace spark {

class Regex {
public:
    // Throws Error(SPARK_ERR_INVALID_FORMAT) when the pattern does not compile, or when searching a
    // sample of ordinary text fails (unbounded recursion: it would fail on every text).
    explicit Regex(const std::string & pattern, bool literal = false);
    ~Regex();
    Regex(const Regex &) = delete;
    Regex & operator=(const Regex &) = delete;

    // Finds the first match at or after byte `from`; false when there is none. `text` must be valid
    // UTF-8 (it is not re-checked). Throws Error(SPARK_ERR_INVALID_FORMAT), naming the pattern, when
    // the search exceeds its bounds (steps, JIT stack, depth): the pattern is at fault, not the text.
    bool find(std::string_view text, size_t from, size_t & start, size_t & end) const;

    // Calls on_match(start, end) for every non-overlapping match, left to right (byte offsets). An
    // empty match is reported, then the search resumes one character further on.
    template <typename Fn> void for_each_match(std::string_view text, Fn && on_match) const {
        size_t from = 0, start, end;
        while (from <= text.size() && find(text, from, start, end)) {
            on_match(start, end);
            if (end > start) {
                from = end;
            } else {
                from = end + 1;
                while (from < text.size() && (uint8_t(text[from]) & 0xC0) == 0x80) ++from;
            }
        }
    }

    const std::string & pattern() const { return pattern_; }

    // Oniguruma's \s (Unicode White_Space) includes U+0085, PCRE2's does not: \s and \S are rewritten
    // into explicit classes. Exposed for tests.
    static std::string translate_pattern(const std::string & onig_pattern);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    std::string           pattern_;
};

}  // namespace spark
