// Added (and special) tokens: found in the text before any other processing and never split,
// with HF's AddedVocabulary semantics (leftmost-longest matching, lstrip/rstrip/single_word).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace spark {

struct AddedToken {
    int32_t     id = -1;
    std::string content;
    bool        single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

class AddedTokenMatcher {
public:
    // split() tries, at each byte of the text where a token may start, the tokens that start there:
    // its cost per byte of text is the length of the longest token. Published added tokens are
    // short (special tokens, whitespace runs: tens of bytes); longer ones are refused when a
    // tokenizer is loaded, so that encoding stays linear in the text.
    static constexpr size_t kMaxTokenBytes = 1024;

    // A piece of the input: an added token (index into the tokens given to build) or plain text.
    struct Segment {
        int32_t token;  // -1: plain text
        size_t  begin, end;
    };

    void build(std::vector<AddedToken> tokens);
    bool empty() const { return tokens_.empty(); }

    // Splits `text`. With skip_special, matches of special tokens are ignored (the text stays plain),
    // as HF does with encode_special_tokens / split_special_tokens.
    void split(std::string_view text, bool skip_special, std::vector<Segment> & out) const;

    const AddedToken & token(int32_t index) const { return tokens_[size_t(index)]; }

private:
    struct Node {
        std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
        int32_t                                  token = -1;
    };
    int32_t child(int32_t node, uint8_t byte) const;
    // Longest token starting at `pos`: its index and length; -1 if none.
    int32_t longest_at(std::string_view text, size_t pos, size_t & length) const;

    std::vector<AddedToken> tokens_;
    std::vector<Node>       nodes_;
    bool                    first_byte_[256] = {};
};

}  // namespace spark
