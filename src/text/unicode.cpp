#include "text/unicode.h"

#include "common/error.h"

#include <utf8proc.h>

#include <cstdlib>
#include <cstring>
#include <memory>

namespace spark::unicode {

Utf8Step utf8_step(std::string_view s, size_t i) {
    const auto b0 = uint8_t(s[i]);
    if (b0 < 0x80) return {Utf8Step::Valid, 1};
    size_t need;  // continuation bytes after the lead byte
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 1;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 2;
        if (b0 == 0xE0) lo = 0xA0;       // no overlongs
        else if (b0 == 0xED) hi = 0x9F;  // no surrogates
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 3;
        if (b0 == 0xF0) lo = 0x90;       // no overlongs
        else if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
        return {Utf8Step::Invalid, 1};
    }
    size_t k = 1;
    for (; k <= need; ++k) {
        if (i + k >= s.size()) return {Utf8Step::Incomplete, k};
        const auto b = uint8_t(s[i + k]);
        const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) return {Utf8Step::Invalid, k};
    }
    return {Utf8Step::Valid, need + 1};
}

size_t find_invalid_utf8(std::string_view s) {
    size_t i = 0;
    const size_t n = s.size();
    while (i < n) {
        // ASCII fast path, 8 bytes at a time.
        while (i + 8 <= n) {
            uint64_t w;
            std::memcpy(&w, s.data() + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (uint8_t(s[i]) < 0x80) {
            ++i;
            continue;
        }
        const Utf8Step st = utf8_step(s, i);
        if (st.kind != Utf8Step::Valid) return i;
        i += st.length;
    }
    return std::string_view::npos;
}

uint32_t next_codepoint(std::string_view s, size_t & i) {
    const auto b0 = uint8_t(s[i]);
    if (b0 < 0x80) {
        ++i;
        return b0;
    }
    auto cont = [&](size_t k) { return uint32_t(uint8_t(s[i + k]) & 0x3F); };
    uint32_t cp;
    if (b0 < 0xE0) {
        cp = (uint32_t(b0 & 0x1F) << 6) | cont(1);
        i += 2;
    } else if (b0 < 0xF0) {
        cp = (uint32_t(b0 & 0x0F) << 12) | (cont(1) << 6) | cont(2);
        i += 3;
    } else {
        cp = (uint32_t(b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
        i += 4;
    }
    return cp;
}

void append_utf8(std::string & out, uint32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3F));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

size_t count_codepoints(std::string_view s) {
    size_t n = 0;
    for (char c : s) n += (uint8_t(c) & 0xC0) != 0x80;
    return n;
}

void append_utf8_lossy(std::string & out, std::string_view bytes) {
    size_t i = 0, run = 0;  // [run, i) is valid text not yet copied
    while (i < bytes.size()) {
        if (uint8_t(bytes[i]) < 0x80) {
            ++i;
            continue;
        }
        const Utf8Step st = utf8_step(bytes, i);
        if (st.kind == Utf8Step::Valid) {
            i += st.length;
            continue;
        }
        out.append(bytes.substr(run, i - run));
        append_utf8(out, kReplacementChar);
        i += st.length;
        run = i;
    }
    out.append(bytes.substr(run));
}

std::string normalize(std::string_view s, NormalForm form) {
    // ASCII is invariant under every normalization form.
    bool ascii = true;
    for (char c : s) {
        if (uint8_t(c) >= 0x80) {
            ascii = false;
            break;
        }
    }
    if (ascii) return std::string(s);
    int options = UTF8PROC_STABLE;
    switch (form) {
        case NormalForm::NFC: options |= UTF8PROC_COMPOSE; break;
        case NormalForm::NFD: options |= UTF8PROC_DECOMPOSE; break;
        case NormalForm::NFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
        case NormalForm::NFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t * out = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t *>(s.data()),
                                            utf8proc_ssize_t(s.size()), &out, utf8proc_option_t(options));
    std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(out, &std::free);
    if (n < 0) fail(SPARK_ERR_INVALID_TEXT, "unicode normalization failed: %s", utf8proc_errmsg(n));
    return std::string(reinterpret_cast<const char *>(out), size_t(n));
}

bool is_rust_whitespace(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

bool is_python_space(uint32_t cp) { return is_rust_whitespace(cp) || (cp >= 0x1C && cp <= 0x1F); }

bool is_rust_alphanumeric(uint32_t cp) {
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
    switch (utf8proc_category(utf8proc_int32_t(cp))) {
        case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
        case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND:
        case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO: case UTF8PROC_CATEGORY_MC:
            return true;
        default: return false;
    }
}

bool is_alpha(uint32_t cp) {
    switch (utf8proc_category(utf8proc_int32_t(cp))) {
        case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
        case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
            return true;
        default: return false;
    }
}

bool is_digit(uint32_t cp) { return utf8proc_category(utf8proc_int32_t(cp)) == UTF8PROC_CATEGORY_ND; }

uint32_t to_upper(uint32_t cp) { return uint32_t(utf8proc_toupper(utf8proc_int32_t(cp))); }
uint32_t to_lower(uint32_t cp) { return uint32_t(utf8proc_tolower(utf8proc_int32_t(cp))); }

namespace {
struct ByteAlphabet {
    std::array<uint32_t, 256> to_cp{};
    std::array<int16_t, 512>  to_byte{};  // every alphabet code point is below 512
    ByteAlphabet() {
        to_byte.fill(-1);
        // Printable Latin-1 bytes map to themselves; the rest get 256, 257, ... in byte order.
        uint32_t next = 256;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            to_cp[size_t(b)] = printable ? uint32_t(b) : next++;
            to_byte[to_cp[size_t(b)]] = int16_t(b);
        }
    }
};
const ByteAlphabet & alphabet() {
    static const ByteAlphabet a;
    return a;
}
}  // namespace

const std::array<uint32_t, 256> & byte_to_codepoint() { return alphabet().to_cp; }

int codepoint_to_byte(uint32_t cp) { return cp < 512 ? alphabet().to_byte[cp] : -1; }

}  // namespace spark::unicode
