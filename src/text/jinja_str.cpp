#include "text/jinja_str.h"

#include "text/unicode.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

namespace spark::jinja {

namespace {

// The last occurrence starting at or before `from`, in linear time too: Knuth-Morris-Pratt on the
// reversed needle, scanning the text backwards.
size_t rfind_text(std::string_view text, std::string_view needle, size_t from = std::string::npos) {
    const size_t m = needle.size();
    if (m > text.size()) return std::string::npos;
    const size_t last_start = std::min(from, text.size() - m);
    if (m == 0) return last_start;
    auto rev = [&](size_t k) { return needle[m - 1 - k]; };
    std::vector<size_t> fail(m, 0);  // KMP failure function of the reversed needle
    for (size_t k = 1, q = 0; k < m; ++k) {
        while (q > 0 && rev(k) != rev(q)) q = fail[q - 1];
        if (rev(k) == rev(q)) ++q;
        fail[k] = q;
    }
    const size_t end = last_start + m;
    size_t q = 0;
    for (size_t i = end; i-- > 0;) {
        while (q > 0 && text[i] != rev(q)) q = fail[q - 1];
        if (text[i] == rev(q)) ++q;
        if (q == m) {
            Budget::scan(end - i + m);
            return i;
        }
    }
    Budget::scan(end + m);
    return std::string::npos;
}

// Lists built item by item from a string (split, splitlines) take many times its size: their growth
// is checked against the memory budget as they grow, and each item counts as work.
void push_checked(List & list, Value v) {
    Budget::steps(1);
    if ((list.size() & 255) == 255) Budget::ensure_room(list.size() + 1, sizeof(Value));
    list.push_back(std::move(v));
}

bool is_space_cp(uint32_t cp) { return unicode::is_python_space(cp); }

// Python str.title(): a cased letter after an uncased character starts a word.
std::string py_title(const std::string & s) {
    Budget::scan(s.size());
    Budget::ensure_room(s.size());
    std::string out;
    bool prev_cased = false;
    for (size_t i = 0; i < s.size();) {
        const uint32_t cp = unicode::next_codepoint(s, i);
        const bool cased = unicode::is_alpha(cp);
        unicode::append_utf8(out, cased ? (prev_cased ? unicode::to_lower(cp) : unicode::to_upper(cp)) : cp);
        prev_cased = cased;
    }
    return out;
}

bool starts_or_ends(const std::string & s, const Value & arg, bool ends, int line) {
    auto check = [&](const Value & p) {
        const std::string & x = require_string(p, ends ? "endswith argument" : "startswith argument", line);
        if (x.size() > s.size()) return false;
        return ends ? s.compare(s.size() - x.size(), x.size(), x) == 0 : s.compare(0, x.size(), x) == 0;
    };
    if (arg.is_list() && arg.is_tuple) {
        for (const Value & p : *arg.list)
            if (check(p)) return true;
        return false;
    }
    return check(arg);
}

// str.format with automatic/numbered/named fields (no format specs).
std::string py_format(const std::string & fmt, const CallArgs & a, int line) {
    Budget::scan(fmt.size());
    std::string out;
    size_t auto_index = 0;
    for (size_t i = 0; i < fmt.size(); ++i) {
        const char c = fmt[i];
        if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
            out += '{';
            ++i;
        } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
            out += '}';
            ++i;
        } else if (c == '{') {
            const size_t close = fmt.find('}', i);
            if (close == std::string::npos) template_error(line, "single '{' encountered in format string");
            const std::string field = fmt.substr(i + 1, close - i - 1);
            if (field.find_first_of(":!") != std::string::npos) template_error(line, "format specs are not supported");
            const Value * v = nullptr;
            if (field.empty()) {
                if (auto_index < a.positional.size()) v = &a.positional[auto_index++];
            } else if (std::isdigit(uint8_t(field[0]))) {
                const int64_t k = small_number(field);
                if (k >= 0 && size_t(k) < a.positional.size()) v = &a.positional[size_t(k)];
            } else {
                for (const auto & [key, val] : a.keyword)
                    if (key == field) v = &val;
            }
            if (!v) template_error(line, "format field '" + field + "' has no argument");
            append_checked(out, to_str(*v));
            i = close;
        } else {
            out += c;
        }
    }
    return out;
}

}  // namespace

// ---- code points and slicing

// Code point boundaries of a UTF-8 string: offsets[i] is where character i starts.
std::vector<size_t> char_offsets(const std::string & s) {
    Budget::scan(s.size());
    Budget::ensure_room(s.size() + 1, sizeof(size_t));
    std::vector<size_t> offsets;
    for (size_t i = 0; i < s.size(); ++i)
        if ((uint8_t(s[i]) & 0xC0) != 0x80) offsets.push_back(i);
    offsets.push_back(s.size());
    return offsets;
}

SliceRange slice_range(int64_t n, const Value & start_v, const Value & stop_v, const Value & step_v, int line) {
    auto opt = [&](const Value & v) -> std::optional<int64_t> {
        if (v.is_none() || v.is_undefined()) return std::nullopt;
        return require_int(v, "slice index", line);
    };
    const int64_t step = opt(step_v).value_or(1);
    if (step == 0) template_error(line, "slice step cannot be zero");
    auto adjust = [&](std::optional<int64_t> x, int64_t dflt) {
        if (!x) return dflt;
        int64_t v = *x;
        if (v < 0) {
            v += n;
            if (v < 0) v = step < 0 ? -1 : 0;
        } else if (v >= n) {
            v = step < 0 ? n - 1 : n;
        }
        return v;
    };
    const int64_t start = adjust(opt(start_v), step < 0 ? n - 1 : 0);
    const int64_t stop  = adjust(opt(stop_v), step < 0 ? -1 : n);
    // start and stop are within [-1, n]: the span cannot overflow; the step can be anything.
    const uint64_t span  = step > 0 ? uint64_t(std::max<int64_t>(0, stop - start)) : uint64_t(std::max<int64_t>(0, start - stop));
    const uint64_t magnitude = step > 0 ? uint64_t(step) : uint64_t(-(step + 1)) + 1;
    const int64_t  count     = int64_t(span == 0 ? 0 : (span - 1) / magnitude + 1);
    return {start, step, count};
}

// s[start:stop:step], by code points.
std::string slice_string(const std::string & s, const Value & start, const Value & stop, const Value & step, int line) {
    const auto off = char_offsets(s);
    const SliceRange r = slice_range(int64_t(off.size()) - 1, start, stop, step, line);
    Budget::ensure_room(s.size());
    std::string out;
    for (int64_t k = 0; k < r.count; ++k) {
        const size_t p = size_t(r.at(k));
        out.append(s, off[p], off[p + 1] - off[p]);
    }
    return out;
}

// ---- search and building

// Substring search in linear time: memmem is the two-way algorithm (glibc, musl, BSDs), where
// std::string::find takes |text| * |needle| steps on hostile inputs ("aaa...a" for "aa...ab").
// Hostile inputs still cost it ~5 ns per byte: the search counts as work on every byte it covers.
// It searches windows of the text (overlapping by |needle| - 1) rather than the whole rest of it:
// finding each of many matches then costs the distance to it, not the length of what follows,
// also where memmem checks its whole range first (sanitizer builds).
size_t find_text(std::string_view text, std::string_view needle, size_t from) {
    if (from > text.size()) return std::string::npos;
    if (needle.empty()) return from;
    Budget::steps(1);  // a call costs some tens of ns, however close the match
    const size_t window = std::max<size_t>(needle.size() * 4, 4096);
    for (size_t start = from; start + needle.size() <= text.size(); start += window - needle.size() + 1) {
        const size_t length = std::min(window, text.size() - start);
        const void * hit = memmem(text.data() + start, length, needle.data(), needle.size());
        const size_t end = hit ? size_t(static_cast<const char *>(hit) - text.data()) + needle.size() : start + length;
        Budget::scan(end - start);
        if (hit) return end - needle.size();
        if (start + length == text.size()) break;
    }
    return std::string::npos;
}

void append_checked(std::string & out, std::string_view piece) {
    Budget::bulk(piece.size());
    Budget::ensure_room(out.size() + piece.size());
    out.append(piece);
}

// ---- transformations

std::string strip_chars(const std::string & s, const Value * chars, bool left, bool right, int line) {
    std::vector<uint32_t> set;
    const bool whitespace = !chars || chars->is_none();
    if (!whitespace) {
        const std::string & c = require_string(*chars, "strip argument", line);
        Budget::scan(c.size());
        for (size_t i = 0; i < c.size();) set.push_back(unicode::next_codepoint(c, i));
        std::sort(set.begin(), set.end());  // a long set must not make each character cost its length
    }
    auto strip_it = [&](uint32_t cp) {
        return whitespace ? is_space_cp(cp) : std::binary_search(set.begin(), set.end(), cp);
    };
    // Only the stripped characters are decoded: b and e move inwards over whole code points.
    size_t b = 0, e = s.size();
    if (left) {
        for (size_t next = b; b < e; b = next)
            if (!strip_it(unicode::next_codepoint(s, next))) break;
    }
    if (right) {
        while (e > b) {
            size_t start = e - 1;
            while (start > b && (uint8_t(s[start]) & 0xC0) == 0x80) --start;
            size_t next = start;
            if (!strip_it(unicode::next_codepoint(s, next))) break;
            e = start;
        }
    }
    Budget::scan(b + (s.size() - e));
    return s.substr(b, e - b);
}

List split_string(const std::string & s, const Value * sep_v, const Value * maxsplit_v, int line) {
    int64_t maxsplit = maxsplit_v && !maxsplit_v->is_none() ? require_int(*maxsplit_v, "maxsplit", line) : -1;
    List parts;
    if (!sep_v || sep_v->is_none()) {
        Budget::scan(s.size());
        // Runs of whitespace separate; leading/trailing whitespace yields nothing.
        size_t i = 0;
        while (true) {
            while (i < s.size()) {
                size_t k = i;
                if (!is_space_cp(unicode::next_codepoint(s, k))) break;
                i = k;
            }
            if (i >= s.size()) break;
            if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
                std::string rest = s.substr(i);
                // Python keeps the remainder as is, minus trailing whitespace.
                push_checked(parts, Value::string(strip_chars(rest, nullptr, false, true, line)));
                break;
            }
            size_t j = i;
            while (j < s.size()) {
                size_t k = j;
                if (is_space_cp(unicode::next_codepoint(s, k))) break;
                j = k;
            }
            push_checked(parts, Value::string(s.substr(i, j - i)));
            i = j;
        }
        return parts;
    }
    const std::string & sep = require_string(*sep_v, "separator", line);
    if (sep.empty()) template_error(line, "empty separator");
    size_t pos = 0, hit;
    while ((maxsplit < 0 || int64_t(parts.size()) < maxsplit) && (hit = find_text(s, sep, pos)) != std::string::npos) {
        push_checked(parts, Value::string(s.substr(pos, hit - pos)));
        pos = hit + sep.size();
    }
    push_checked(parts, Value::string(s.substr(pos)));
    return parts;
}

std::string replace_all(const std::string & s, const std::string & from, const std::string & to, int64_t count) {
    const std::string_view text(s);
    std::string out;
    if (from.empty()) {
        Budget::scan(s.size());
        // Python inserts `to` between characters (and at both ends).
        int64_t n = 0;
        for (size_t i = 0; i < s.size();) {
            if (count < 0 || n < count) {
                append_checked(out, to);
                ++n;
            }
            const size_t start = i;
            unicode::next_codepoint(s, i);
            append_checked(out, text.substr(start, i - start));
        }
        if (count < 0 || n < count) append_checked(out, to);
        return out;
    }
    size_t pos = 0, hit;
    int64_t n = 0;
    while ((count < 0 || n < count) && (hit = find_text(s, from, pos)) != std::string::npos) {
        append_checked(out, text.substr(pos, hit - pos));
        append_checked(out, to);
        pos = hit + from.size();
        ++n;
    }
    append_checked(out, text.substr(pos));
    return out;
}

std::string map_case(const std::string & s, bool upper) {
    Budget::scan(s.size());
    Budget::ensure_room(s.size());
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        const uint32_t cp = unicode::next_codepoint(s, i);
        unicode::append_utf8(out, upper ? unicode::to_upper(cp) : unicode::to_lower(cp));
    }
    return out;
}

std::string py_capitalize(const std::string & s) {
    Budget::scan(s.size());
    Budget::ensure_room(s.size());
    std::string out;
    bool first = true;
    for (size_t i = 0; i < s.size();) {
        const uint32_t cp = unicode::next_codepoint(s, i);
        unicode::append_utf8(out, first ? unicode::to_upper(cp) : unicode::to_lower(cp));
        first = false;
    }
    return out;
}

// ---- numbers and formatting

// Decimal digits as a small non-negative number; -1 when they are not (all digits, below 10^9).
int64_t small_number(std::string_view digits) {
    if (digits.empty() || digits.size() > 9) return -1;
    int64_t n = 0;
    for (char c : digits) {
        if (c < '0' || c > '9') return -1;
        n = n * 10 + (c - '0');
    }
    return n;
}

// A float as an int64 (Python's int(x)); overflow is an error rather than a bigint.
int64_t float_to_int(double x, int line) {
    if (std::isnan(x)) template_error(line, "cannot convert float NaN to integer");
    if (std::isinf(x)) template_error(line, "cannot convert float infinity to integer");
    if (!(x > -9223372036854775808.0 - 1024 && x < 9223372036854775808.0)) template_error(line, "integer overflow");
    return int64_t(x);
}

// printf-style "%s" % args (string % operator and the format filter). Widths and precisions are
// capped: Python would build the string, but C's printf allocates for large precisions, and no
// chat template needs more.
constexpr int64_t kMaxFormatWidth = 4096;

std::string percent_format(const std::string & fmt, const Value & args, int line) {
    Budget::scan(fmt.size());
    List values = args.is_list() && args.is_tuple ? *args.list : List{args};
    const Dict * mapping = args.is_dict() ? args.dict.get() : nullptr;
    std::string out;
    size_t next = 0;
    for (size_t i = 0; i < fmt.size(); ++i) {
        if (fmt[i] != '%') {
            out += fmt[i];
            continue;
        }
        if (++i >= fmt.size()) template_error(line, "incomplete format");
        const Value * v = nullptr;
        if (fmt[i] == '(' && mapping) {
            const size_t close = fmt.find(')', i);
            if (close == std::string::npos) template_error(line, "incomplete format key");
            v = mapping->find(std::string_view(fmt).substr(i + 1, close - i - 1));
            if (!v) template_error(line, "format key not found");
            i = close + 1;
        }
        std::string flags;
        while (i < fmt.size() && std::strchr("-+ #0", fmt[i]) && fmt[i] != '\0') flags += fmt[i++];
        auto number = [&]() -> int64_t {
            const size_t from = i;
            while (i < fmt.size() && std::isdigit(uint8_t(fmt[i]))) ++i;
            if (i == from) return -1;
            const int64_t n = small_number(std::string_view(fmt).substr(from, i - from));
            if (n < 0 || n > kMaxFormatWidth)
                template_error(line, "format width or precision above " + std::to_string(kMaxFormatWidth));
            return n;
        };
        const int64_t width = number();
        int64_t precision   = -1;
        if (i < fmt.size() && fmt[i] == '.') {
            ++i;
            precision = std::max<int64_t>(0, number());
        }
        if (i >= fmt.size()) template_error(line, "incomplete format");
        const char conv = fmt[i];
        if (conv == '%') {
            out += '%';
            continue;
        }
        if (!v) {
            if (mapping && values.size() == 1 && !args.is_tuple) v = &args;
            else {
                if (next >= values.size()) template_error(line, "not enough arguments for format string");
                v = &values[next++];
            }
        }
        std::string spec = "%" + flags;
        if (width >= 0) spec += std::to_string(width);
        if (precision >= 0) {
            spec += '.';
            spec += std::to_string(precision);
        }
        auto printf_value = [&](const std::string & f, auto x) {
            const int n = std::snprintf(nullptr, 0, f.c_str(), x);
            if (n < 0) template_error(line, "bad format");
            std::string buf(size_t(n) + 1, '\0');
            std::snprintf(buf.data(), buf.size(), f.c_str(), x);
            buf.resize(size_t(n));
            return buf;
        };
        switch (conv) {
            case 's':
            case 'r': {
                // Python pads and truncates by characters, which printf cannot do on UTF-8.
                std::string text = conv == 's' ? to_str(*v) : repr(*v);
                if (precision >= 0) {
                    size_t end = 0;
                    for (int64_t k = 0; k < precision && end < text.size(); ++k) unicode::next_codepoint(text, end);
                    text.resize(end);
                }
                const int64_t chars = int64_t(unicode::count_codepoints(text));
                const std::string pad(size_t(std::max<int64_t>(0, width - chars)), ' ');
                append_checked(out, flags.find('-') != std::string::npos ? text + pad : pad + text);
                break;
            }
            case 'd':
            case 'i':
                if (!v->is_number()) template_error(line, "%d format: a number is required");
                out += printf_value(spec + "lld", (long long) (v->type == Value::Type::Float ? float_to_int(v->f, line) : v->as_int()));
                break;
            case 'f':
            case 'F':
            case 'e':
            case 'g':
                if (!v->is_number()) template_error(line, "float format: a number is required");
                out += printf_value(spec + conv, v->as_double());
                break;
            case 'x':
            case 'X':
            case 'o':
                if (!v->is_integer()) template_error(line, "integer format: an integer is required");
                out += printf_value(spec + "ll" + conv, (long long) v->as_int());
                break;
            default: template_error(line, std::string("unsupported format character '") + conv + "'");
        }
        Budget::ensure_room(out.size());
    }
    if (next < values.size() && !mapping) template_error(line, "not all arguments converted during string formatting");
    return out;
}

// ---- methods

bool is_str_method(std::string_view name) {
    static const char * const kStrMethods[] = {
        "startswith", "endswith", "split",   "rsplit",  "strip",   "lstrip",       "rstrip",       "replace",    "upper",
        "lower",      "title",    "capitalize", "find", "rfind",   "count",        "join",         "format",     "isdigit",
        "isalpha",    "isalnum",  "isspace", "isupper", "islower", "removeprefix", "removesuffix", "splitlines", "index"};
    return std::any_of(std::begin(kStrMethods), std::end(kStrMethods), [&](const char * n) { return name == n; });
}

Value str_method(const Value & s, CallArgs & a, std::string_view m) {
    // string_view comparisons with literals check the length first: no strlen, rarely a memcmp.
    const int line = a.line;
    const std::string & str = s.s;
    if (m == "startswith" || m == "endswith") {
        auto p = bind(a, {"prefix"}, m, line);
        return Value::boolean(starts_or_ends(str, require(p[0], "prefix", m, line), m == "endswith", line));
    }
    if (m == "split") {
        auto p = bind(a, {"sep", "maxsplit"}, m, line);
        return Value::list_of(split_string(str, p[0], p[1], line));
    }
    if (m == "rsplit") {
        auto p = bind(a, {"sep", "maxsplit"}, m, line);
        const int64_t maxsplit = p[1] && !p[1]->is_none() ? require_int(*p[1], "maxsplit", line) : -1;
        if (maxsplit < 0 || !p[0] || p[0]->is_none()) {
            if (maxsplit >= 0) template_error(line, "rsplit with maxsplit and no separator is not supported");
            return Value::list_of(split_string(str, p[0], nullptr, line));
        }
        const std::string & sep = require_string(*p[0], "separator", line);
        if (sep.empty()) template_error(line, "empty separator");
        List parts;  // from the right, reversed at the end (rfind_text counts its work)
        size_t end = str.size();
        while (int64_t(parts.size()) < maxsplit) {
            const size_t hit = end >= sep.size() ? rfind_text(str, sep, end - sep.size()) : std::string::npos;
            if (hit == std::string::npos) break;
            push_checked(parts, Value::string(str.substr(hit + sep.size(), end - hit - sep.size())));
            end = hit;
        }
        push_checked(parts, Value::string(str.substr(0, end)));
        std::reverse(parts.begin(), parts.end());
        return Value::list_of(std::move(parts));
    }
    if (m == "strip" || m == "lstrip" || m == "rstrip") {
        auto p = bind(a, {"chars"}, m, line);
        return Value::string(strip_chars(str, p[0], m != "rstrip", m != "lstrip", line));
    }
    if (m == "replace") {
        auto p = bind(a, {"old", "new", "count"}, m, line);
        const int64_t count = p[2] ? require_int(*p[2], "count", line) : -1;
        return Value::string(replace_all(str, require_string(require(p[0], "old", m, line), "old", line),
                                         require_string(require(p[1], "new", m, line), "new", line), count));
    }
    if (m == "upper" || m == "lower") {
        bind(a, {}, m, line);
        return Value::string(map_case(str, m == "upper"));
    }
    if (m == "title") return Value::string(py_title(str));
    if (m == "capitalize") return Value::string(py_capitalize(str));
    if (m == "find" || m == "rfind" || m == "index") {
        auto p = bind(a, {"sub"}, m, line);
        const std::string & sub = require_string(require(p[0], "sub", m, line), "sub", line);
        const size_t hit = m == "rfind" ? rfind_text(str, sub) : find_text(str, sub);
        if (hit == std::string::npos && m == "index") template_error(line, "substring not found");
        if (hit == std::string::npos) return Value::integer(-1);
        Budget::bulk(hit);
        return Value::integer(int64_t(unicode::count_codepoints(std::string_view(str).substr(0, hit))));
    }
    if (m == "count") {
        auto p = bind(a, {"sub"}, m, line);
        const std::string & sub = require_string(require(p[0], "sub", m, line), "sub", line);
        if (sub.empty()) {
            Budget::bulk(str.size());
            return Value::integer(int64_t(unicode::count_codepoints(str)) + 1);
        }
        int64_t n = 0;
        for (size_t pos = find_text(str, sub); pos != std::string::npos; pos = find_text(str, sub, pos + sub.size())) ++n;
        return Value::integer(n);
    }
    if (m == "join") {
        auto p = bind(a, {"iterable"}, m, line);
        std::string out;
        bool first = true;
        for (const Value & v : Items(require(p[0], "iterable", m, line), line)) {
            if (!v.is_string()) template_error(line, std::string("sequence item: expected str instance, ") + type_name(v) + " found");
            if (!first) append_checked(out, str);
            append_checked(out, v.s);
            first = false;
        }
        return Value::string(std::move(out));
    }
    if (m == "format") return Value::string(py_format(str, a, line));
    if (m == "removeprefix" || m == "removesuffix") {
        auto p = bind(a, {"affix"}, m, line);
        const std::string & x = require_string(require(p[0], "affix", m, line), "affix", line);
        if (m == "removeprefix") return Value::string(str.compare(0, x.size(), x) == 0 ? str.substr(x.size()) : str);
        const bool ends = x.size() <= str.size() && str.compare(str.size() - x.size(), x.size(), x) == 0;
        return Value::string(ends ? str.substr(0, str.size() - x.size()) : str);
    }
    if (m == "splitlines") {
        Budget::bulk(str.size());
        List lines;
        size_t pos = 0;
        while (pos < str.size()) {
            size_t e = str.find_first_of("\r\n", pos);
            if (e == std::string::npos) {
                push_checked(lines, Value::string(str.substr(pos)));
                break;
            }
            push_checked(lines, Value::string(str.substr(pos, e - pos)));
            pos = e + ((str[e] == '\r' && e + 1 < str.size() && str[e + 1] == '\n') ? 2 : 1);
        }
        return Value::list_of(std::move(lines));
    }
    // Character class predicates.
    if (str.empty()) return Value::boolean(false);
    Budget::scan(str.size());
    bool all = true, any_cased = false;
    for (size_t i = 0; i < str.size();) {
        const uint32_t cp = unicode::next_codepoint(str, i);
        if (m == "isdigit") all = all && unicode::is_digit(cp);
        else if (m == "isalpha") all = all && unicode::is_alpha(cp);
        else if (m == "isalnum") all = all && (unicode::is_alpha(cp) || unicode::is_digit(cp));
        else if (m == "isspace") all = all && unicode::is_python_space(cp);
        else if (m == "isupper" || m == "islower") {
            const bool upper = unicode::to_lower(cp) != cp, lower = unicode::to_upper(cp) != cp;
            any_cased = any_cased || upper || lower;
            if (m == "isupper" && lower) all = false;
            if (m == "islower" && upper) all = false;
        }
    }
    if (m == "isupper" || m == "islower") return Value::boolean(all && any_cased);
    return Value::boolean(all);
}

}  // namespace spark::jinja
