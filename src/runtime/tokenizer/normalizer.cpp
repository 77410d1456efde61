#include "runtime/tokenizer/normalizer.h"

#include "graph/error.h"

#include <functional>

namespace spark {

namespace {

// GPT-2's pre-tokenization regex, applied by a ByteLevel pre-tokenizer with use_regex: true.
const char * kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string type_of(const nlohmann::json & j, const char * section) {
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
        fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: %s entry has no \"type\"", section);
    return j["type"].get<std::string>();
}

bool bool_field(const nlohmann::json & j, const char * key, bool fallback) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean()) fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: \"%s\" must be a boolean", key);
    return j[key].get<bool>();
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Normalizer

std::unique_ptr<Normalizer> Normalizer::from_json(const nlohmann::json & j) {
    if (j.is_null()) return nullptr;
    auto n = std::make_unique<Normalizer>();
    // Sequences are flattened in order.
    std::function<void(const nlohmann::json &)> add = [&](const nlohmann::json & e) {
        const std::string type = type_of(e, "normalizer");
        if (type == "Sequence") {
            if (!e.contains("normalizers") || !e["normalizers"].is_array())
                fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: Sequence normalizer without \"normalizers\"");
            for (const auto & sub : e["normalizers"]) add(sub);
        } else if (type == "NFC") {
            n->steps_.push_back({Step::Form, unicode::NormalForm::NFC});
        } else if (type == "NFD") {
            n->steps_.push_back({Step::Form, unicode::NormalForm::NFD});
        } else if (type == "NFKC") {
            n->steps_.push_back({Step::Form, unicode::NormalForm::NFKC});
        } else if (type == "NFKD") {
            n->steps_.push_back({Step::Form, unicode::NormalForm::NFKD});
        } else if (type == "Lowercase") {
            n->steps_.push_back({Step::Lowercase});
        } else {
            fail(SPARK_ERR_UNSUPPORTED, "tokenizer.json: normalizer type '%s' is not supported", type.c_str());
        }
    };
    add(j);
    return n;
}

std::string Normalizer::apply(std::string_view text) const {
    std::string s(text);
    for (const Step & step : steps_) {
        if (step.kind == Step::Form) {
            s = unicode::normalize(s, step.form);
        } else {
            std::string lower;
            lower.reserve(s.size());
            for (size_t i = 0; i < s.size();) unicode::append_utf8(lower, unicode::to_lower(unicode::next_codepoint(s, i)));
            s = std::move(lower);
        }
    }
    return s;
}

// ------------------------------------------------------------------------------------------------
// PreTokenizer

std::unique_ptr<PreTokenizer> PreTokenizer::from_json(const nlohmann::json & j) {
    if (j.is_null()) return nullptr;
    auto p = std::make_unique<PreTokenizer>();
    p->add_steps(j);
    return p;
}

void PreTokenizer::add_steps(const nlohmann::json & j) {
    const std::string type = type_of(j, "pre_tokenizer");
    if (type == "Sequence") {
        if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
            fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: Sequence pre_tokenizer without \"pretokenizers\"");
        for (const auto & sub : j["pretokenizers"]) add_steps(sub);
    } else if (type == "Split") {
        Step step{Step::Split, {}};
        if (!j.contains("pattern") || !j["pattern"].is_object())
            fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: Split pre_tokenizer without \"pattern\"");
        const auto & pat = j["pattern"];
        if (pat.contains("Regex") && pat["Regex"].is_string()) {
            step.regex = std::make_unique<Regex>(pat["Regex"].get<std::string>());
        } else if (pat.contains("String") && pat["String"].is_string()) {
            step.regex = std::make_unique<Regex>(pat["String"].get<std::string>(), /*literal=*/true);
        } else {
            fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: Split pattern must be {\"Regex\": ...} or {\"String\": ...}");
        }
        const std::string behavior = j.value("behavior", std::string("Isolated"));
        if (behavior == "Isolated") step.behavior = SplitBehavior::Isolated;
        else if (behavior == "Removed") step.behavior = SplitBehavior::Removed;
        else if (behavior == "MergedWithPrevious") step.behavior = SplitBehavior::MergedWithPrevious;
        else if (behavior == "MergedWithNext") step.behavior = SplitBehavior::MergedWithNext;
        else if (behavior == "Contiguous") step.behavior = SplitBehavior::Contiguous;
        else fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: unknown Split behavior '%s'", behavior.c_str());
        step.invert = bool_field(j, "invert", false);
        steps_.push_back(std::move(step));
    } else if (type == "Digits") {
        // HF splits on char::is_numeric: each digit alone, or runs of digits.
        Step step{Step::Split, {}};
        step.regex    = std::make_unique<Regex>("\\p{N}");
        step.behavior = bool_field(j, "individual_digits", false) ? SplitBehavior::Isolated : SplitBehavior::Contiguous;
        steps_.push_back(std::move(step));
    } else if (type == "ByteLevel") {
        Step step{Step::ByteLevel, {}};
        step.add_prefix_space = bool_field(j, "add_prefix_space", true);
        if (bool_field(j, "use_regex", true)) step.regex = std::make_unique<Regex>(kGpt2Pattern);
        steps_.push_back(std::move(step));
        byte_level_ = true;
    } else {
        fail(SPARK_ERR_UNSUPPORTED, "tokenizer.json: pre_tokenizer type '%s' is not supported", type.c_str());
    }
}

void PreTokenizer::apply_split(const Step & step, std::string_view piece, std::vector<std::string_view> & out) {
    // (begin, end, is_match) over the whole piece, as HF's Pattern::find_matches.
    struct Part {
        size_t begin, end;
        bool   match;
    };
    thread_local std::vector<Part> parts;
    parts.clear();
    size_t prev = 0;
    step.regex->for_each_match(piece, [&](size_t b, size_t e) {
        if (prev != b) parts.push_back({prev, b, step.invert});
        parts.push_back({b, e, !step.invert});
        prev = e;
    });
    if (prev != piece.size()) parts.push_back({prev, piece.size(), step.invert});

    auto emit = [&](size_t b, size_t e) {
        if (e > b) out.push_back(piece.substr(b, e - b));
    };
    switch (step.behavior) {
        case SplitBehavior::Isolated:
            for (const Part & p : parts) emit(p.begin, p.end);
            break;
        case SplitBehavior::Removed:
            for (const Part & p : parts)
                if (!p.match) emit(p.begin, p.end);
            break;
        case SplitBehavior::MergedWithPrevious:
        case SplitBehavior::Contiguous: {
            // A match joins the piece before it (Contiguous: runs of the same kind are joined).
            std::vector<Part> merged;
            bool previous_match = false;
            for (const Part & p : parts) {
                const bool join = step.behavior == SplitBehavior::Contiguous ? p.match == previous_match
                                                                             : (p.match && !previous_match);
                if (join && !merged.empty()) merged.back().end = p.end;
                else merged.push_back(p);
                previous_match = p.match;
            }
            for (const Part & p : merged) emit(p.begin, p.end);
            break;
        }
        case SplitBehavior::MergedWithNext: {
            std::vector<Part> merged;
            bool previous_match = false;
            for (size_t k = parts.size(); k-- > 0;) {
                const Part & p = parts[k];
                if (p.match && !previous_match && !merged.empty()) merged.back().begin = p.begin;
                else merged.push_back(p);
                previous_match = p.match;
            }
            for (size_t k = merged.size(); k-- > 0;) emit(merged[k].begin, merged[k].end);
            break;
        }
    }
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view> & words,
                         std::deque<std::string> & storage) const {
    thread_local std::vector<std::string_view> current, next;
    current.clear();
    if (!text.empty()) current.push_back(text);
    for (const Step & step : steps_) {
        next.clear();
        for (std::string_view piece : current) {
            if (step.kind == Step::ByteLevel && step.add_prefix_space && piece.front() != ' ') {
                storage.emplace_back(1, ' ');
                storage.back().append(piece);
                piece = storage.back();
            }
            if (step.regex) apply_split(step, piece, next);
            else next.push_back(piece);
        }
        std::swap(current, next);
    }
    words.insert(words.end(), current.begin(), current.end());
}

}  // namespace spark
