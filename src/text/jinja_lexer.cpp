#include "text/jinja_lexer.h"

#include "text/jinja_ast.h"
#include "text/jinja_value.h"
#include "text/unicode.h"

#include <cctype>
#include <cstring>

namespace spark::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

size_t count_newlines(const std::string & s, size_t from, size_t to) {
    size_t n = 0;
    for (size_t i = from; i < to && i < s.size(); ++i) n += s[i] == '\n';
    return n;
}

// Python's str.isspace() over the whole (non-empty) tail, as jinja2's whitespace_re.fullmatch.
bool all_whitespace(const std::string & s, size_t from) {
    if (from >= s.size()) return false;
    for (size_t i = from; i < s.size();) {
        if (!unicode::is_python_space(unicode::next_codepoint(s, i))) return false;
    }
    return true;
}

std::string rstrip_whitespace(const std::string & s) {
    size_t end = s.size();
    while (end > 0) {
        size_t b = end - 1;
        while (b > 0 && (uint8_t(s[b]) & 0xC0) == 0x80) --b;
        size_t k = b;
        if (!unicode::is_python_space(unicode::next_codepoint(s, k))) break;
        end = b;
    }
    return s.substr(0, end);
}

// Python's "unicode-escape" decoding of a string literal body.
std::string unescape(const std::string & body, int line) {
    std::string out;
    for (size_t i = 0; i < body.size(); ++i) {
        const char c = body[i];
        if (c != '\\' || i + 1 >= body.size()) {
            out += c;
            continue;
        }
        const char e = body[++i];
        auto hex = [&](size_t digits) {
            uint32_t v = 0;
            if (i + digits >= body.size()) template_error(line, "truncated escape in string literal");
            for (size_t k = 1; k <= digits; ++k) {
                const char h = body[i + k];
                int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
                if (d < 0) template_error(line, "bad escape in string literal");
                v = v * 16 + uint32_t(d);
            }
            i += digits;
            return v;
        };
        switch (e) {
            case '\n': break;  // line continuation
            case '\\': out += '\\'; break;
            case '\'': out += '\''; break;
            case '"': out += '"'; break;
            case 'a': out += '\a'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'n': out += '\n'; break;
            case 'r': out += '\r'; break;
            case 't': out += '\t'; break;
            case 'v': out += '\v'; break;
            case 'x': unicode::append_utf8(out, hex(2)); break;
            case 'u': unicode::append_utf8(out, hex(4)); break;
            case 'U': {
                const uint32_t cp = hex(8);
                if (cp > 0x10FFFF) template_error(line, "bad \\U escape in string literal");
                unicode::append_utf8(out, cp);
                break;
            }
            default:
                if (e >= '0' && e <= '7') {
                    uint32_t v = uint32_t(e - '0');
                    for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
                        v = v * 8 + uint32_t(body[++i] - '0');
                    unicode::append_utf8(out, v);
                } else {
                    out += '\\';  // unknown escapes stay as written
                    out += e;
                }
        }
    }
    return out;
}

class Lexer {
public:
    explicit Lexer(std::string src) : s_(std::move(src)) {}

    std::vector<Token> run() {
        while (pos_ < s_.size()) {
            const size_t tag = find_tag(pos_);
            if (tag == std::string::npos) {
                emit_text(s_.substr(pos_));
                break;
            }
            const char kind = s_[tag + 1];  // '{', '%' or '#'
            char sign = tag + 2 < s_.size() ? s_[tag + 2] : '\0';
            if (sign != '-' && sign != '+') sign = '\0';
            std::string text = s_.substr(pos_, tag - pos_);
            const bool raw = kind == '%' && is_raw_begin(tag);
            // Whitespace control of the text before the tag.
            if (sign == '-') {
                text = rstrip_whitespace(text);
            } else if (sign != '+' && kind != '{') {
                const size_t nl    = text.rfind('\n');
                const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
                if ((l_pos > 0 || line_starting_) && all_whitespace(text, l_pos)) text.resize(l_pos);
            }
            emit_text(text);
            line_ += int(count_newlines(s_, pos_, tag));
            pos_ = tag + 2 + (sign ? 1 : 0);
            if (raw) lex_raw();
            else if (kind == '#') lex_comment();
            else lex_tag(kind == '{');
        }
        push(Token{Token::End, "", line_});
        return std::move(tokens_);
    }

private:
    size_t find_tag(size_t from) const {
        for (size_t i = s_.find('{', from); i != std::string::npos; i = s_.find('{', i + 1)) {
            if (i + 1 < s_.size() && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
        }
        return std::string::npos;
    }

    // Tokens count against the parse budget (kMaxParseBytes) as they are made.
    void push(Token t) {
        bytes_ += sizeof(Token) + t.text.size();
        if (bytes_ > kMaxParseBytes) parse_too_large(line_);
        tokens_.push_back(std::move(t));
    }

    void emit_text(const std::string & text) {
        if (!text.empty()) push(Token{Token::Text, text, line_});
        if (!text.empty()) line_starting_ = text.back() == '\n';
    }

    // Consumes a block end ("+%}", "-%}" and following whitespace, or "%}" and one newline).
    bool try_block_end(char close) {
        size_t p = pos_;
        char sign = '\0';
        if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) sign = s_[p++];
        if (p + 1 >= s_.size() + 0 || s_.compare(p, 2, std::string(1, close) + "}") != 0) return false;
        if (close == '}' && sign == '+') return false;  // "+}}" is not a variable end
        p += 2;
        line_starting_ = false;
        if (sign == '-') {
            while (p < s_.size() && is_space(s_[p])) {
                line_ += s_[p] == '\n';
                line_starting_ = s_[p] == '\n';
                ++p;
            }
        } else if (sign == '\0' && close != '}' && p < s_.size() && s_[p] == '\n') {
            ++p;  // trim_blocks
            ++line_;
            line_starting_ = true;
        }
        pos_ = p;
        return true;
    }

    bool is_raw_begin(size_t tag) const {
        size_t p = tag + 2;
        if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) ++p;
        while (p < s_.size() && is_space(s_[p])) ++p;
        if (s_.compare(p, 3, "raw") != 0) return false;
        p += 3;
        while (p < s_.size() && is_space(s_[p])) ++p;
        if (p < s_.size() && s_[p] == '-') ++p;
        return s_.compare(p, 2, "%}") == 0;
    }

    void lex_raw() {
        // Skip to the end of "{% raw %}" (its "-%}" strips the whitespace after it).
        const size_t close = s_.find("%}", pos_);
        const bool   strip = close > 0 && s_[close - 1] == '-';
        pos_ = close + 2;
        if (strip)
            while (pos_ < s_.size() && is_space(s_[pos_])) line_ += s_[pos_++] == '\n';
        // Find "{%[-+]? endraw [-+]?%}".
        for (size_t i = s_.find("{%", pos_); i != std::string::npos; i = s_.find("{%", i + 1)) {
            size_t p = i + 2;
            char sign = '\0';
            if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) sign = s_[p++];
            while (p < s_.size() && is_space(s_[p])) ++p;
            if (s_.compare(p, 6, "endraw") != 0) continue;
            p += 6;
            while (p < s_.size() && is_space(s_[p])) ++p;
            std::string text = s_.substr(pos_, i - pos_);
            if (sign == '-') text = rstrip_whitespace(text);
            push(Token{Token::Text, text, line_});
            line_ += int(count_newlines(s_, pos_, i));
            pos_ = p;
            if (!try_block_end('%')) template_error(line_, "expected '%}' after endraw");
            return;
        }
        template_error(line_, "missing end of raw directive");
    }

    void lex_comment() {
        const size_t close = s_.find("#}", pos_);
        if (close == std::string::npos) template_error(line_, "missing end of comment tag");
        size_t start_of_end = close;
        char sign = '\0';
        if (close > pos_ && (s_[close - 1] == '-' || s_[close - 1] == '+')) {
            sign = s_[close - 1];
            start_of_end = close - 1;
        }
        line_ += int(count_newlines(s_, pos_, start_of_end));
        pos_ = start_of_end;
        if (sign == '\0' || sign == '-' || sign == '+') {
            // Reuse the block-end rules with '#' as the closing character.
            size_t p = close + 2;
            line_starting_ = false;
            if (sign == '-') {
                while (p < s_.size() && is_space(s_[p])) {
                    line_ += s_[p] == '\n';
                    line_starting_ = s_[p] == '\n';
                    ++p;
                }
            } else if (sign == '\0' && p < s_.size() && s_[p] == '\n') {
                ++p;
                ++line_;
                line_starting_ = true;
            }
            pos_ = p;
        }
    }

    void lex_tag(bool variable) {
        push(Token{variable ? Token::VarBegin : Token::BlockBegin, "", line_});
        const char close = variable ? '}' : '%';
        while (true) {
            while (pos_ < s_.size() && is_space(s_[pos_])) line_ += s_[pos_++] == '\n';
            if (pos_ >= s_.size()) template_error(line_, variable ? "unexpected end of template, expected '}}'"
                                                                  : "unexpected end of template, expected '%}'");
            if (try_block_end(close)) {
                push(Token{variable ? Token::VarEnd : Token::BlockEnd, "", line_});
                return;
            }
            const char c = s_[pos_];
            if (c == '\'' || c == '"') {
                lex_string(c);
            } else if (c >= '0' && c <= '9') {
                lex_number();
            } else if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
                size_t e = pos_;
                while (e < s_.size() && (s_[e] == '_' || std::isalnum(uint8_t(s_[e])))) ++e;
                push(Token{Token::Name, s_.substr(pos_, e - pos_), line_});
                pos_ = e;
            } else {
                static const char * kOps[] = {"**", "//", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~",
                                              "[",  "]",  "(",  ")",  "{",  "}",  ">", "<", "=", ".", ":", "|",
                                              ",",  ";"};
                bool found = false;
                for (const char * op : kOps) {
                    const size_t n = std::strlen(op);
                    if (s_.compare(pos_, n, op) == 0) {
                        push(Token{Token::Op, op, line_});
                        pos_ += n;
                        found = true;
                        break;
                    }
                }
                if (!found) template_error(line_, std::string("unexpected character '") + c + "'");
            }
        }
    }

    void lex_string(char quote) {
        size_t p = pos_ + 1;
        while (p < s_.size() && s_[p] != quote) {
            if (s_[p] == '\\') ++p;
            ++p;
        }
        if (p >= s_.size()) template_error(line_, "unterminated string literal");
        Token t{Token::String, unescape(s_.substr(pos_ + 1, p - pos_ - 1), line_), line_};
        push(std::move(t));
        line_ += int(count_newlines(s_, pos_, p));
        pos_ = p + 1;
    }

    void lex_number() {
        auto digits = [&](size_t p) {
            while (p < s_.size() && (std::isdigit(uint8_t(s_[p])) || (s_[p] == '_' && p + 1 < s_.size() && std::isdigit(uint8_t(s_[p + 1])))))
                ++p;
            return p;
        };
        const bool after_dot = pos_ > 0 && s_[pos_ - 1] == '.';
        size_t e = digits(pos_);
        bool is_float = false;
        if (!after_dot && e + 1 < s_.size() && s_[e] == '.' && std::isdigit(uint8_t(s_[e + 1]))) {
            e = digits(e + 1);
            is_float = true;
        }
        if (!after_dot && e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
            size_t p = e + 1;
            if (p < s_.size() && (s_[p] == '+' || s_[p] == '-')) ++p;
            if (p < s_.size() && std::isdigit(uint8_t(s_[p]))) {
                e = digits(p);
                is_float = true;
            }
        }
        std::string text;
        for (size_t k = pos_; k < e; ++k)
            if (s_[k] != '_') text += s_[k];
        Token t{is_float ? Token::Float : Token::Int, text, line_};
        try {
            if (is_float) t.float_value = std::stod(text);
            else t.int_value = std::stoll(text);
        } catch (const std::exception &) {
            template_error(line_, "number literal out of range: " + text);
        }
        push(std::move(t));
        pos_ = e;
    }

    std::string        s_;
    size_t             pos_  = 0;
    int                line_ = 1;
    bool               line_starting_ = true;
    std::vector<Token> tokens_;
    size_t             bytes_ = 0;
};

}  // namespace

std::vector<Token> lex(const std::string & source) {
    // Newlines are normalized to "\n" and one trailing newline is dropped (keep_trailing_newline=False).
    std::string s;
    s.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
        if (source[i] == '\r') {
            s += '\n';
            if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
        } else {
            s += source[i];
        }
    }
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return Lexer(std::move(s)).run();
}

}  // namespace spark::jinja
