#include "text/regex.h"

#include "common/error.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <chrono>
#include <ctime>

namespace spark {

namespace {

// Unicode White_Space, which is what Oniguruma's \s matches in UTF-8 mode.
constexpr const char * kWhiteSpaceRanges = "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}"
                                           "\\x{202f}\\x{205f}\\x{3000}";

// Bounds of one search. Published pre-tokenizer patterns need a few match steps per search, at
// most about one per byte of the text searched (Qwen's `\s*[\r\n]+` backtracks over a run of
// spaces); a search may take 16 steps per byte (plus a constant), and never more than PCRE2's
// default. A hostile pattern (nested quantifiers that backtrack exponentially, unbounded
// recursion) stops there with an error instead of running for hours or overflowing the stack. The
// JIT stack is the JIT matcher's only recursion space; the depth and heap limits bound the
// interpreter (when JIT is unavailable).
constexpr uint32_t kMatchStepsBase    = 4096;
constexpr uint32_t kMatchStepsPerByte = 16;
constexpr uint32_t kMatchLimit        = 10'000'000;
constexpr uint32_t kDepthLimit        = 10'000;
constexpr uint32_t kHeapLimitKiB      = 64 * 1024;
constexpr size_t   kJitStackMaxSize   = 8 << 20;

uint32_t match_limit(size_t text_bytes) {
    return text_bytes >= (kMatchLimit - kMatchStepsBase) / kMatchStepsPerByte ? kMatchLimit
                                                                                : kMatchStepsBase + kMatchStepsPerByte * uint32_t(text_bytes);
}

// The searches of one encode together: a pattern can stay just under the bound of each search at
// every position of the text (quadratic or worse). Legitimate searches cost well under a
// microsecond per byte; an encode whose searches take far longer stops. Time is read from the
// steady clock (cheap) every few searches; once that says the budget is spent, the thread's CPU
// time must confirm it (half the budget more), so that a thread that was descheduled or stopped
// is not failed.
constexpr double   kBudgetBaseSeconds    = 1.0;
constexpr double   kBudgetSecondsPerByte = 50e-6;
constexpr uint32_t kBudgetCheckEvery     = 32;

int64_t steady_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int64_t thread_cpu_ns() {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

thread_local RegexBudget * t_budget = nullptr;

// A text every pre-tokenizer pattern sees in ordinary use (letters, digits, punctuation,
// contractions, whitespace runs, newlines, CJK, emoji). A pattern whose search fails on it (the
// search errors rather than matching or not) would fail on every encode: it is refused when the
// regex is built.
constexpr const char * kProbeText = "Hello, World! It's 2024-01-01: x=3.14; y_1 += 42 'll 've\n\n\t  indent\r\n"
                                    "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x99\x82 <|end|> [a] {b} \\ /c/ \"q\"   ";

// Per-thread match state: the tokenizer is shared between threads, PCRE2 match data is not.
struct MatchScratch {
    pcre2_match_data *    data    = nullptr;
    pcre2_match_context * context = nullptr;
    pcre2_jit_stack *     stack   = nullptr;
    MatchScratch() {
        data    = pcre2_match_data_create(1, nullptr);
        context = pcre2_match_context_create(nullptr);
        stack   = pcre2_jit_stack_create(32 * 1024, kJitStackMaxSize, nullptr);
        if (context && stack) pcre2_jit_stack_assign(context, nullptr, stack);
        if (context) {
            pcre2_set_depth_limit(context, kDepthLimit);
            pcre2_set_heap_limit(context, kHeapLimitKiB);
        }
    }
    ~MatchScratch() {
        pcre2_match_data_free(data);
        pcre2_match_context_free(context);
        pcre2_jit_stack_free(stack);
    }
};

MatchScratch & scratch() {
    thread_local MatchScratch s;
    if (!s.data || !s.context || !s.stack) throw std::bad_alloc();
    return s;
}

}  // namespace

struct Regex::Impl {
    pcre2_code * code = nullptr;
    bool         jit  = false;
    ~Impl() { pcre2_code_free(code); }
};

std::string Regex::translate_pattern(const std::string & p) {
    std::string out;
    out.reserve(p.size() + 64);
    bool in_class = false;
    for (size_t i = 0; i < p.size(); ++i) {
        const char c = p[i];
        if (c == '\\' && i + 1 < p.size()) {
            const char e = p[i + 1];
            if (e == 's') {
                if (in_class) out += kWhiteSpaceRanges;
                else out += std::string("[") + kWhiteSpaceRanges + "]";
                ++i;
                continue;
            }
            if (e == 'S' && !in_class) {
                out += std::string("[^") + kWhiteSpaceRanges + "]";
                ++i;
                continue;
            }
            out += c;
            out += e;
            ++i;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            out += c;
            // A ']' right after '[' or '[^' is a literal.
            if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
            if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
            continue;
        }
        if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
            // POSIX class inside a bracket expression: copy through its closing ":]".
            const size_t close = p.find(":]", i + 2);
            if (close != std::string::npos) {
                out.append(p, i, close + 2 - i);
                i = close + 1;
                continue;
            }
        }
        if (in_class && c == ']') in_class = false;
        out += c;
    }
    return out;
}

Regex::Regex(const std::string & pattern, bool literal) : impl_(std::make_unique<Impl>()), pattern_(pattern) {
    const std::string translated = literal ? pattern : translate_pattern(pattern);
    int        err     = 0;
    PCRE2_SIZE err_off = 0;
    // PCRE2_LITERAL does not combine with PCRE2_UCP (which a literal does not need).
    const uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
    impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options, &err,
                                &err_off, nullptr);
    if (!impl_->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        fail(SPARK_ERR_INVALID_FORMAT, "pre-tokenizer regex does not compile at offset %zu: %s (pattern: %s)",
             size_t(err_off), reinterpret_cast<const char *>(msg), pattern.c_str());
    }
    impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
    // Unbounded recursion such as (?R) compiles, and then fails every search: refuse it now.
    try {
        for_each_match(kProbeText, [](size_t, size_t) {});
    } catch (const Error & e) {
        fail(SPARK_ERR_INVALID_FORMAT, "%s, on a sample of ordinary text: every encode would fail", e.what());
    }
}

Regex::~Regex() = default;

RegexBudget::RegexBudget(size_t text_bytes)
    : limit_ns_(int64_t((kBudgetBaseSeconds + kBudgetSecondsPerByte * double(text_bytes)) * 1e9)), outer_(t_budget) {
    wall_deadline_ns_ = steady_ns() + limit_ns_;
    t_budget          = this;
}

RegexBudget::~RegexBudget() { t_budget = outer_; }

void RegexBudget::charge(const std::string & pattern) {
    if (++searches_ % kBudgetCheckEvery != 0 || steady_ns() < wall_deadline_ns_) return;
    const int64_t cpu = thread_cpu_ns();
    if (cpu_mark_ns_ < 0) cpu_mark_ns_ = cpu;
    if (cpu - cpu_mark_ns_ < limit_ns_ / 2) return;
    fail(SPARK_ERR_INVALID_FORMAT, "pre-tokenizer regex %s: the searches of this text ran for more than %.1f s (%.0f s plus %.0f us per byte), "
         "then %.1f s more of CPU time", pattern.c_str(), double(limit_ns_) * 1e-9, kBudgetBaseSeconds, kBudgetSecondsPerByte * 1e6,
         double(limit_ns_ / 2) * 1e-9);
}

bool Regex::find(std::string_view text, size_t from, size_t & start, size_t & end) const {
    if (from > text.size()) return false;
    if (t_budget) t_budget->charge(pattern_);
    MatchScratch & s = scratch();
    pcre2_set_match_limit(s.context, match_limit(text.size()));
    const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    const int  rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), from, 0, s.data, s.context)
                               : pcre2_match(impl_->code, subject, text.size(), from, PCRE2_NO_UTF_CHECK, s.data,
                                             s.context);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
        // The pattern, not the text, is at fault: no valid text may make a tokenizer fail.
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        fail(SPARK_ERR_INVALID_FORMAT, "pre-tokenizer regex %s: search failed (%s)", pattern_.c_str(), reinterpret_cast<const char *>(msg));
    }
    const PCRE2_SIZE * ov = pcre2_get_ovector_pointer(s.data);
    start = size_t(ov[0]);
    end   = size_t(ov[1]);
    return true;
}

}  // namespace spark
