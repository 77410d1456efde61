#include "text/added_tokens.h"

#include "text/unicode.h"

#include <algorithm>

namespace spark {

namespace {

// Last code point before byte `end` of valid UTF-8 text.
uint32_t codepoint_before(std::string_view s, size_t end) {
    size_t b = end - 1;
    while (b > 0 && (uint8_t(s[b]) & 0xC0) == 0x80) --b;
    return unicode::next_codepoint(s, b);
}

}  // namespace

void AddedTokenMatcher::build(std::vector<AddedToken> tokens) {
    tokens_ = std::move(tokens);
    nodes_.assign(1, Node{});
    std::fill(std::begin(first_byte_), std::end(first_byte_), false);
    for (size_t t = 0; t < tokens_.size(); ++t) {
        const std::string & s = tokens_[t].content;
        if (s.empty()) continue;
        first_byte_[uint8_t(s[0])] = true;
        int32_t node = 0;
        for (char c : s) {
            int32_t next = child(node, uint8_t(c));
            if (next < 0) {
                next = int32_t(nodes_.size());
                nodes_.push_back(Node{});
                auto & ch = nodes_[size_t(node)].children;
                ch.insert(std::lower_bound(ch.begin(), ch.end(), std::make_pair(uint8_t(c), int32_t(-1))),
                          {uint8_t(c), next});
            }
            node = next;
        }
        if (nodes_[size_t(node)].token < 0) nodes_[size_t(node)].token = int32_t(t);
    }
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t byte) const {
    const auto & ch = nodes_[size_t(node)].children;
    for (const auto & [b, n] : ch) {
        if (b == byte) return n;
        if (b > byte) break;
    }
    return -1;
}

int32_t AddedTokenMatcher::longest_at(std::string_view text, size_t pos, size_t & length) const {
    int32_t node = 0, best = -1;
    for (size_t i = pos; i < text.size(); ++i) {
        node = child(node, uint8_t(text[i]));
        if (node < 0) break;
        if (nodes_[size_t(node)].token >= 0) {
            best   = nodes_[size_t(node)].token;
            length = i + 1 - pos;
        }
    }
    return best;
}

void AddedTokenMatcher::split(std::string_view text, bool skip_special, std::vector<Segment> & out) const {
    size_t emitted = 0;  // end of what has been output
    size_t pos     = 0;  // where the next match search starts
    while (pos < text.size()) {
        // Leftmost-longest: the first position where any token starts, and the longest token there.
        size_t length = 0;
        int32_t t = -1;
        for (; pos < text.size(); ++pos) {
            if (!first_byte_[uint8_t(text[pos])]) continue;
            t = longest_at(text, pos, length);
            if (t >= 0) break;
        }
        if (t < 0) break;
        size_t start = pos, stop = pos + length;
        pos = stop;
        const AddedToken & tok = tokens_[size_t(t)];
        if (skip_special && tok.special) continue;
        if (tok.single_word) {
            // Only a whole word: no alphanumeric character right before or after.
            const bool word_before = start > 0 && unicode::is_rust_alphanumeric(codepoint_before(text, start));
            size_t k = stop;
            const bool word_after = stop < text.size() && unicode::is_rust_alphanumeric(unicode::next_codepoint(text, k));
            if (word_before || word_after) continue;
        }
        if (tok.lstrip) {
            size_t s = start;
            while (s > emitted && unicode::is_rust_whitespace(codepoint_before(text, s))) {
                --s;
                while (s > 0 && (uint8_t(text[s]) & 0xC0) == 0x80) --s;
            }
            start = std::max(s, emitted);
        }
        if (tok.rstrip) {
            while (stop < text.size()) {
                size_t k = stop;
                if (!unicode::is_rust_whitespace(unicode::next_codepoint(text, k))) break;
                stop = k;
            }
            pos = stop;
        }
        if (emitted < start) out.push_back({-1, emitted, start});
        out.push_back({t, start, stop});
        emitted = stop;
    }
    if (emitted < text.size()) out.push_back({-1, emitted, text.size()});
}

}  // namespace spark
