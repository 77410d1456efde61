#include "text/normalizer.h"

#include "common/error.h"
#include "io/config_fields.h"

#include <functional>

namespace spark {

namespace {

// GPT-2's pre-tokenization regex, applied by a ByteLevel pre-tokenizer with use_regex: true.
const char * kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

const std::string kOrigin = "tokenizer.json";

// The "type" of a normalizer or pre-tokenizer entry at `path` ("pre_tokenizer.pretokenizers[1]").
std::string type_of(const nlohmann::json & j, const std::string & path) {
    if (!j.is_object()) fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: '%s' must be an object, not %s", path.c_str(), ConfigFields::shown(j).c_str());
    return ConfigFields(j, kOrigin, path + ".").string("type", "", true);
}

// A regex of a pre-tokenizer; its errors name the file and the entry.
std::unique_ptr<Regex> make_regex(const std::string & pattern, bool literal, const std::string & path) {
    try {
        return std::make_unique<Regex>(pattern, literal);
    } catch (const Error & e) {
        throw Error(e.status(), strfmt("tokenizer.json: '%s': %s", path.c_str(), e.what()));
    }
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Normalizer

std::unique_ptr<Normalizer> Normalizer::from_json(const nlohmann::json & j) {
    if (j.is_null()) return nullptr;
    auto n = std::make_unique<Normalizer>();
    // Sequences are flattened in order.
    std::function<void(const nlohmann::json &, const std::string &)> add = [&](const nlohmann::json & e, const std::string & path) {
        const std::string type = type_of(e, path);
        if (type == "Sequence") {
            const ConfigFields f(e, kOrigin, path + ".");
            const nlohmann::json * subs = f.find("normalizers");
            if (!subs || !subs->is_array()) f.bad("normalizers", "must be a list (a Sequence normalizer)");
            for (size_t i = 0; i < subs->size(); ++i) add((*subs)[i], strfmt("%s.normalizers[%zu]", path.c_str(), i));
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
            fail(SPARK_ERR_UNSUPPORTED, "tokenizer.json: '%s': normalizer type '%s' is not supported", path.c_str(), type.c_str());
        }
    };
    add(j, "normalizer");
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
    p->add_steps(j, "pre_tokenizer");
    return p;
}

void PreTokenizer::add_steps(const nlohmann::json & j, const std::string & path) {
    const std::string  type = type_of(j, path);
    const ConfigFields f(j, kOrigin, path + ".");
    if (type == "Sequence") {
        const nlohmann::json * subs = f.find("pretokenizers");
        if (!subs || !subs->is_array()) f.bad("pretokenizers", "must be a list (a Sequence pre_tokenizer)");
        for (size_t i = 0; i < subs->size(); ++i) add_steps((*subs)[i], strfmt("%s.pretokenizers[%zu]", path.c_str(), i));
    } else if (type == "Split") {
        Step step{Step::Split, nullptr};
        const nlohmann::json * pat = f.find("pattern");
        if (!pat || !pat->is_object()) f.bad("pattern", "must be {\"Regex\": ...} or {\"String\": ...}");
        const ConfigFields p(*pat, kOrigin, path + ".pattern.");
        if (p.find("Regex")) step.regex = make_regex(p.string("Regex", ""), false, path + ".pattern.Regex");
        else if (p.find("String")) step.regex = make_regex(p.string("String", ""), /*literal=*/true, path + ".pattern.String");
        else f.bad("pattern", "must be {\"Regex\": ...} or {\"String\": ...}");
        const std::string behavior = f.string("behavior", "Isolated");
        if (behavior == "Isolated") step.behavior = SplitBehavior::Isolated;
        else if (behavior == "Removed") step.behavior = SplitBehavior::Removed;
        else if (behavior == "MergedWithPrevious") step.behavior = SplitBehavior::MergedWithPrevious;
        else if (behavior == "MergedWithNext") step.behavior = SplitBehavior::MergedWithNext;
        else if (behavior == "Contiguous") step.behavior = SplitBehavior::Contiguous;
        else f.bad("behavior", "'%s' is not a Split behavior", behavior.c_str());
        step.invert = f.boolean("invert", false);
        steps_.push_back(std::move(step));
    } else if (type == "Digits") {
        // HF splits on char::is_numeric: each digit alone, or runs of digits.
        Step step{Step::Split, nullptr};
        step.regex    = make_regex("\\p{N}", false, path);
        step.behavior = f.boolean("individual_digits", false) ? SplitBehavior::Isolated : SplitBehavior::Contiguous;
        steps_.push_back(std::move(step));
    } else if (type == "ByteLevel") {
        Step step{Step::ByteLevel, nullptr};
        step.add_prefix_space = f.boolean("add_prefix_space", true);
        if (f.boolean("use_regex", true)) step.regex = make_regex(kGpt2Pattern, false, path);
        steps_.push_back(std::move(step));
        byte_level_ = true;
    } else {
        fail(SPARK_ERR_UNSUPPORTED, "tokenizer.json: '%s': pre_tokenizer type '%s' is not supported", path.c_str(), type.c_str());
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
