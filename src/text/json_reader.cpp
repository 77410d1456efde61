#include "text/json_reader.h"

#include "common/error.h"
#include "text/unicode.h"

#include <cstring>
#include <vector>

namespace spark {

namespace {
constexpr size_t kMaxDepth = 512;  // hostile input must not exhaust anything

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}
}  // namespace

JsonReader::JsonReader(std::string_view text, std::string what, std::string_view whole, size_t base)
    : text_(text), whole_(whole.empty() ? text : whole), base_(base), what_(std::move(what)) {}

void JsonReader::error(const char * message) const {
    const size_t at = base_ + pos_;
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < whole_.size(); ++i) {
        if (whole_[i] == '\n') {
            ++line;
            col = 1;
        } else {
            ++col;
        }
    }
    if (pos_ >= text_.size())
        fail(SPARK_ERR_INVALID_FORMAT, "%s: unexpected end of input at byte %zu (line %zu): %s (truncated file?)",
             what_.c_str(), at, line, message);
    fail(SPARK_ERR_INVALID_FORMAT, "%s: %s at line %zu, column %zu (byte %zu)", what_.c_str(), message, line, col, at);
}

void JsonReader::skip_ws() {
    while (pos_ < text_.size()) {
        const char c = text_[pos_];
        if (c != ' ' && c != '\n' && c != '\r' && c != '\t') return;
        ++pos_;
    }
}

void JsonReader::expect(char c) {
    skip_ws();
    if (pos_ >= text_.size() || text_[pos_] != c) {
        const char msg[] = {'e', 'x', 'p', 'e', 'c', 't', 'e', 'd', ' ', '\'', c, '\'', 0};
        error(msg);
    }
    ++pos_;
}

char JsonReader::peek_value() {
    skip_ws();
    if (pos_ >= text_.size()) error("expected a value");
    return text_[pos_];
}

void JsonReader::begin_object() {
    skip_ws();
    if (pos_ >= text_.size() || text_[pos_] != '{') error("expected an object");
    ++pos_;
}

bool JsonReader::next_key(std::string & key, bool & first) {
    skip_ws();
    if (pos_ >= text_.size()) error("expected '}' or a key");
    if (text_[pos_] == '}') {
        ++pos_;
        return false;
    }
    if (!first) {
        if (text_[pos_] != ',') error("expected ',' or '}'");
        ++pos_;
        skip_ws();
    }
    first = false;
    read_string(key);
    expect(':');
    return true;
}

void JsonReader::begin_array() {
    skip_ws();
    if (pos_ >= text_.size() || text_[pos_] != '[') error("expected an array");
    ++pos_;
}

bool JsonReader::next_element(bool & first) {
    skip_ws();
    if (pos_ >= text_.size()) error("expected ']' or a value");
    if (text_[pos_] == ']') {
        ++pos_;
        return false;
    }
    if (!first) {
        if (text_[pos_] != ',') error("expected ',' or ']'");
        ++pos_;
    }
    first = false;
    return true;
}

void JsonReader::read_string(std::string & out) {
    skip_ws();
    if (pos_ >= text_.size() || text_[pos_] != '"') error("expected a string");
    ++pos_;
    out.clear();
    const char * data = text_.data();
    const size_t n = text_.size();
    while (true) {
        // Copy the run up to the next quote, backslash or control character.
        size_t run = pos_;
        while (run < n) {
            const auto c = uint8_t(data[run]);
            if (c == '"' || c == '\\' || c < 0x20) break;
            ++run;
        }
        out.append(data + pos_, run - pos_);
        pos_ = run;
        if (pos_ >= n) error("unterminated string");
        const char c = data[pos_];
        if (c == '"') {
            ++pos_;
            return;
        }
        if (c != '\\') error("control character in string");
        if (pos_ + 1 >= n) {
            pos_ = n;
            error("unterminated escape");
        }
        const char e = data[pos_ + 1];
        pos_ += 2;
        switch (e) {
            case '"': out += '"'; break;
            case '\\': out += '\\'; break;
            case '/': out += '/'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'n': out += '\n'; break;
            case 'r': out += '\r'; break;
            case 't': out += '\t'; break;
            case 'u': {
                auto read_hex4 = [&]() -> uint32_t {
                    if (pos_ + 4 > n) {
                        pos_ = n;
                        error("truncated \\u escape");
                    }
                    uint32_t v = 0;
                    for (int k = 0; k < 4; ++k) {
                        const int h = hex_value(data[pos_ + size_t(k)]);
                        if (h < 0) error("bad \\u escape");
                        v = v * 16 + uint32_t(h);
                    }
                    pos_ += 4;
                    return v;
                };
                uint32_t cp = read_hex4();
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (pos_ + 2 > n || data[pos_] != '\\' || data[pos_ + 1] != 'u') error("lone surrogate in \\u escape");
                    pos_ += 2;
                    const uint32_t lo = read_hex4();
                    if (lo < 0xDC00 || lo > 0xDFFF) error("bad surrogate pair in \\u escape");
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    error("lone surrogate in \\u escape");
                }
                unicode::append_utf8(out, cp);
                break;
            }
            default: pos_ -= 1; error("bad escape in string");
        }
    }
}

void JsonReader::skip_string() {
    ++pos_;  // opening quote
    const char * data = text_.data();
    const size_t n = text_.size();
    while (pos_ < n) {
        const auto c = uint8_t(data[pos_]);
        if (c == '"') {
            ++pos_;
            return;
        }
        if (c < 0x20) error("control character in string");
        if (c == '\\') {
            if (pos_ + 1 >= n) break;
            const char e = data[pos_ + 1];
            if (e == 'u') {
                for (size_t k = 2; k < 6; ++k) {
                    if (pos_ + k >= n) {
                        pos_ = n;
                        error("truncated \\u escape");
                    }
                    if (hex_value(data[pos_ + k]) < 0) error("bad \\u escape");
                }
                pos_ += 6;
                continue;
            }
            if (!std::strchr("\"\\/bfnrt", e) || e == 0) error("bad escape in string");
            pos_ += 2;
            continue;
        }
        ++pos_;
    }
    pos_ = n;
    error("unterminated string");
}

void JsonReader::skip_number() {
    const size_t n = text_.size();
    auto digit = [&](size_t p) { return p < n && text_[p] >= '0' && text_[p] <= '9'; };
    if (pos_ < n && text_[pos_] == '-') ++pos_;
    if (!digit(pos_)) error("bad number");
    if (text_[pos_] == '0') {
        ++pos_;
    } else {
        while (digit(pos_)) ++pos_;
    }
    if (pos_ < n && text_[pos_] == '.') {
        ++pos_;
        if (!digit(pos_)) error("bad number");
        while (digit(pos_)) ++pos_;
    }
    if (pos_ < n && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
        ++pos_;
        if (pos_ < n && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
        if (!digit(pos_)) error("bad number");
        while (digit(pos_)) ++pos_;
    }
}

void JsonReader::skip_literal(const char * lit) {
    const size_t len = std::strlen(lit);
    for (size_t k = 0; k < len; ++k) {
        if (pos_ >= text_.size()) error("truncated literal");
        if (text_[pos_] != lit[k]) error("bad literal");
        ++pos_;
    }
}

int64_t JsonReader::read_int() {
    skip_ws();
    const size_t start = pos_;
    skip_number();
    bool neg = false;
    size_t p = start;
    if (text_[p] == '-') {
        neg = true;
        ++p;
    }
    int64_t v = 0;
    for (; p < pos_; ++p) {
        const char c = text_[p];
        if (c < '0' || c > '9') {
            pos_ = start;
            error("expected an integer");
        }
        if (v > (INT64_MAX - 9) / 10) {
            pos_ = start;
            error("integer out of range");
        }
        v = v * 10 + (c - '0');
    }
    return neg ? -v : v;
}

bool JsonReader::read_bool() {
    const char c = peek_value();
    if (c == 't') {
        skip_literal("true");
        return true;
    }
    if (c == 'f') {
        skip_literal("false");
        return false;
    }
    error("expected true or false");
}

bool JsonReader::try_read_null() {
    if (peek_value() != 'n') return false;
    skip_literal("null");
    return true;
}

std::string_view JsonReader::skip_value() {
    skip_ws();
    const size_t start = pos_;
    // Iterative, with an explicit stack of open containers ('{' or '['), so depth is bounded.
    std::vector<char> stack;
    bool expect_value = true;
    while (true) {
        skip_ws();
        if (expect_value) {
            if (pos_ >= text_.size()) error("expected a value");
            const char c = text_[pos_];
            if (c == '{' || c == '[') {
                if (stack.size() >= kMaxDepth) error("nesting too deep");
                stack.push_back(c);
                ++pos_;
                skip_ws();
                if (pos_ < text_.size() && text_[pos_] == (c == '{' ? '}' : ']')) {
                    ++pos_;
                    stack.pop_back();
                    expect_value = false;
                } else if (c == '{') {
                    skip_ws();
                    if (pos_ >= text_.size() || text_[pos_] != '"') error("expected a key");
                    skip_string();
                    expect(':');
                }
                if (stack.empty() && !expect_value) break;
                continue;
            }
            if (c == '"') skip_string();
            else if (c == 't') skip_literal("true");
            else if (c == 'f') skip_literal("false");
            else if (c == 'n') skip_literal("null");
            else if (c == '-' || (c >= '0' && c <= '9')) skip_number();
            else error("unexpected character");
            expect_value = false;
        }
        if (stack.empty()) break;
        skip_ws();
        if (pos_ >= text_.size()) error("unclosed container");
        const char c = text_[pos_];
        const char close = stack.back() == '{' ? '}' : ']';
        if (c == close) {
            ++pos_;
            stack.pop_back();
            if (stack.empty()) break;
            continue;
        }
        if (c != ',') error(close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
        ++pos_;
        if (stack.back() == '{') {
            skip_ws();
            if (pos_ >= text_.size() || text_[pos_] != '"') error("expected a key");
            skip_string();
            expect(':');
        }
        expect_value = true;
    }
    return text_.substr(start, pos_ - start);
}

void JsonReader::expect_end() {
    skip_ws();
    if (pos_ != text_.size()) error("unexpected data after the document");
}

}  // namespace spark
