// PCRE2 (UTF + UCP, JIT-compiled) regex used by the pre-tokenizers. Hugging Face tokenizers uses
// Oniguruma; the patterns are translated where the two engines disagree (see translate_pattern).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace spark {

// Bounds the time of all the regex searches the calling thread makes while it lives (one encode
// of `text_bytes`): once they have run for 1 s plus 50 us per byte, and the thread has then used
// half that again in CPU time, the next search throws Error(SPARK_ERR_INVALID_FORMAT). Each search
// is bounded on its own too (Regex::find); this bounds their sum.
class RegexBudget {
public:
    explicit RegexBudget(size_t text_bytes);
    ~RegexBudget();
    RegexBudget(const RegexBudget &)             = delete;
    RegexBudget & operator=(const RegexBudget &) = delete;

    void charge(const std::string & pattern);  // called by each search

private:
    int64_t       limit_ns_;
    int64_t       wall_deadline_ns_ = 0;   // steady clock
    int64_t       cpu_mark_ns_      = -1;  // the thread's CPU time when the wall deadline was seen passed
    uint32_t      searches_         = 0;
    RegexBudget * outer_;
};

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
    // the search exceeds its bounds (steps in proportion to the text, JIT stack, depth) or the
    // searches exceed the thread's RegexBudget: the pattern is at fault, not the text.
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
