// Evaluator of the Jinja syntax tree with jinja2's semantics as transformers configures it
// (ImmutableSandboxedEnvironment, default Undefined, loopcontrols, its own tojson/raise_exception/
// strftime_now/namespace/dict). Python behaviour is reproduced where templates depend on it.
#include "text/jinja_ast.h"

#include "common/error.h"
#include "text/unicode.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <optional>

namespace spark::jinja {

// ------------------------------------------------------------------------------------------------
// Scopes and context

struct Scope {
    std::shared_ptr<Scope>                     parent;
    std::vector<std::pair<std::string, Value>> vars;

    // Scopes hold a few variables; the scans are counted (a step per kNamesPerStep names compared)
    // so that a template defining thousands of them runs out of steps rather than into quadratic time.
    static constexpr size_t kNamesPerStep = 4;

    const Value * find(const std::string & name) const {
        for (const Scope * s = this; s; s = s->parent.get()) {
            Budget::steps(s->vars.size() / kNamesPerStep);
            for (const auto & [k, v] : s->vars)
                if (k == name) return &v;
        }
        return nullptr;
    }
    void set(const std::string & name, Value v) {
        Budget::steps(vars.size() / kNamesPerStep);
        for (auto & [k, old] : vars) {
            if (k == name) {
                old = std::move(v);
                return;
            }
        }
        vars.emplace_back(name, std::move(v));
    }
};

std::shared_ptr<Scope> new_scope(std::shared_ptr<Scope> parent) {
    auto scope    = make_shared_value<Scope>(0);
    scope->parent = std::move(parent);
    return scope;
}

// What a render owns besides its values: its limits, its nesting depth, and the scopes and
// namespaces that can take part in reference cycles (a macro's closure holds the scope that holds
// the macro; namespaces can hold each other, or a macro). The render empties them when it ends,
// which frees the cycles: nothing a render creates outlives it.
struct RenderState {
    const RenderLimits &               limits;
    int                                depth = 0;
    std::vector<std::weak_ptr<Scope>>  closure_scopes;
    std::vector<std::weak_ptr<Dict>>   namespaces;

    explicit RenderState(const RenderLimits & l) : limits(l) {}
    RenderState(const RenderState &)             = delete;
    RenderState & operator=(const RenderState &) = delete;

    ~RenderState() {
        for (const auto & w : namespaces) {
            if (const auto d = w.lock()) {
                const auto items = std::move(d->items);
                d->items.clear();
            }
        }
        for (const auto & w : closure_scopes) {
            if (const auto scope = w.lock()) {
                const auto vars   = std::move(scope->vars);
                const auto parent = std::move(scope->parent);
                scope->vars.clear();
            }
        }
    }

    template <typename T> static void remember(std::vector<std::weak_ptr<T>> & list, const std::shared_ptr<T> & p) {
        if (!list.empty() && list.back().lock() == p) return;
        if (list.size() == list.capacity()) {
            // Forget the freed ones before growing; keep half the room free so this stays amortized.
            list.erase(std::remove_if(list.begin(), list.end(), [](const auto & w) { return w.expired(); }), list.end());
            if (list.size() > list.capacity() / 2) list.reserve(std::max<size_t>(64, list.capacity() * 2));
        }
        list.push_back(p);
    }
};

class Context {
public:
    std::shared_ptr<Scope> scope;
    const Dict *           globals     = nullptr;
    RenderState *          state       = nullptr;
    int                    macro_depth = 0;
};

namespace {

constexpr int     kMaxMacroDepth = 64;
constexpr int64_t kMaxRange      = 100000;  // jinja2's sandbox limit

// One level of nesting (a statement body, an expression operand, a macro call) while rendering.
class DepthGuard {
public:
    DepthGuard(RenderState & state, int line) : state_(state) {
        if (state.depth >= state.limits.max_depth || Budget::current()->stack().exhausted()) too_deep(state, line);
        ++state.depth;
    }
    ~DepthGuard() { --state_.depth; }
    DepthGuard(const DepthGuard &)             = delete;
    DepthGuard & operator=(const DepthGuard &) = delete;

private:
    // Out of line: the messages' strings would otherwise take room in every frame that nests.
    [[noreturn, gnu::noinline, gnu::cold]] static void too_deep(const RenderState & state, int line) {
        if (state.depth >= state.limits.max_depth)
            template_error(line, "the template nests deeper than " + std::to_string(state.limits.max_depth) +
                                     " levels while rendering (blocks, expressions and macro calls)");
        template_error(line, "the template nests too deeply: rendering it would use more than " +
                                 std::to_string(StackMeter::kMaxStackBytes >> 10) + " KiB of stack");
    }

    RenderState & state_;
};

enum class Flow { Normal, Break, Continue };

[[noreturn]] void undefined_error(int line, const Value & v) {
    template_error(line, v.s.empty() ? std::string("value is undefined") : v.s);
}

std::string object_name(const Value & v) { return std::string(type_name(v)) + " object"; }

// ---- argument binding (Python call semantics for builtins)

std::vector<const Value *> bind(const CallArgs & a, std::initializer_list<const char *> names, std::string_view fname,
                                int line) {
    std::vector<const char *> n(names);
    if (a.positional.size() > n.size())
        template_error(line, std::string(fname) + "() takes at most " + std::to_string(n.size()) + " arguments (" +
                                 std::to_string(a.positional.size()) + " given)");
    std::vector<const Value *> out(n.size(), nullptr);
    for (size_t k = 0; k < a.positional.size(); ++k) out[k] = &a.positional[k];
    for (const auto & [key, value] : a.keyword) {
        size_t k = 0;
        while (k < n.size() && key != n[k]) ++k;
        if (k == n.size()) template_error(line, std::string(fname) + "() got an unexpected keyword argument '" + key + "'");
        if (out[k]) template_error(line, std::string(fname) + "() got multiple values for argument '" + key + "'");
        out[k] = &value;
    }
    return out;
}

const Value & require(const Value * v, const char * what, std::string_view fname, int line) {
    if (!v) template_error(line, std::string(fname) + "() missing required argument '" + what + "'");
    return *v;
}

const std::string & require_string(const Value & v, const std::string & what, int line) {
    if (!v.is_string()) template_error(line, what + " must be a string, not " + type_name(v));
    return v.s;
}

int64_t require_int(const Value & v, const std::string & what, int line) {
    if (!v.is_integer()) template_error(line, what + " must be an integer, not " + type_name(v));
    return v.as_int();
}

// ---- sequences

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

// Items of an iterable, as Python's iter(): list items, dict keys, characters.
List iterate(const Value & v, int line) {
    switch (v.type) {
        case Value::Type::Undefined: return {};
        case Value::Type::List:
            Budget::steps(v.list->size());
            Budget::ensure_room(v.list->size(), sizeof(Value));
            return *v.list;
        case Value::Type::Dict: {
            Budget::steps(v.dict->items.size());
            Budget::ensure_room(v.dict->items.size(), sizeof(Value));
            List keys;
            for (const auto & kv : v.dict->items) keys.push_back(kv.first);
            return keys;
        }
        case Value::Type::String: {
            const size_t count = unicode::count_codepoints(v.s);
            Budget::steps(count);  // a value per character
            Budget::ensure_room(count, sizeof(Value));
            List chars;
            chars.reserve(count);
            for (size_t i = 0; i < v.s.size();) {
                const size_t start = i;
                unicode::next_codepoint(v.s, i);
                chars.push_back(Value::string(v.s.substr(start, i - start)));
            }
            return chars;
        }
        default: template_error(line, "'" + std::string(type_name(v)) + "' object is not iterable");
    }
}

// The items of an iterable for reading them once: a list is read in place (lists are immutable),
// other iterables are made into one (iterate).
class Items {
public:
    Items(const Value & v, int line) {
        if (v.is_list()) {
            list_ = v.list.get();
        } else {
            made_ = iterate(v, line);
            list_ = &made_;
        }
    }
    List::const_iterator begin() const { return list_->begin(); }
    List::const_iterator end() const { return list_->end(); }
    size_t               size() const { return list_->size(); }
    bool                 empty() const { return list_->empty(); }
    const Value &        operator[](size_t k) const { return (*list_)[k]; }
    const List &         list() const { return *list_; }

private:
    List         made_;
    const List * list_;
};

int64_t length_of(const Value & v, int line) {
    switch (v.type) {
        case Value::Type::Undefined: return 0;
        case Value::Type::String: Budget::bulk(v.s.size()); return int64_t(unicode::count_codepoints(v.s));
        case Value::Type::List: return int64_t(v.list->size());
        case Value::Type::Dict: return int64_t(v.dict->items.size());
        default: template_error(line, "object of type '" + std::string(type_name(v)) + "' has no len()");
    }
}

// Python's slice.indices(length): the positions start, start + step, ... (count of them).
struct SliceRange {
    int64_t start, step, count;
    int64_t at(int64_t k) const { return start + k * step; }
};

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

// Substring search in linear time: memmem is the two-way algorithm (glibc, musl, BSDs), where
// std::string::find takes |text| * |needle| steps on hostile inputs ("aaa...a" for "aa...ab").
// Hostile inputs still cost it ~5 ns per byte: the search counts as work on every byte it covers.
// It searches windows of the text (overlapping by |needle| - 1) rather than the whole rest of it:
// finding each of many matches then costs the distance to it, not the length of what follows,
// also where memmem checks its whole range first (sanitizer builds).
size_t find_text(std::string_view text, std::string_view needle, size_t from = 0) {
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

// The same for strings built piece by piece (join, replace, format, ...).
void append_checked(std::string & out, std::string_view piece) {
    Budget::bulk(piece.size());
    Budget::ensure_room(out.size() + piece.size());
    out.append(piece);
}

// ---- strings (Python str methods)

bool is_space_cp(uint32_t cp) { return unicode::is_python_space(cp); }

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

// ---- arithmetic (Python semantics on int64/double; overflow is an error rather than a bigint)

template <typename Op> int64_t checked(Op op, int64_t a, int64_t b, int line) {
    int64_t r;
    if (op(a, b, &r)) template_error(line, "integer overflow");
    return r;
}
constexpr auto kAdd = [](int64_t a, int64_t b, int64_t * r) { return __builtin_add_overflow(a, b, r); };
constexpr auto kSub = [](int64_t a, int64_t b, int64_t * r) { return __builtin_sub_overflow(a, b, r); };
constexpr auto kMul = [](int64_t a, int64_t b, int64_t * r) { return __builtin_mul_overflow(a, b, r); };

// n * size for a repetition, which must not overflow before the budget sees it.
uint64_t repeated_size(uint64_t n, uint64_t size, int line) {
    uint64_t total;
    if (__builtin_mul_overflow(n, size, &total) || total > uint64_t(PTRDIFF_MAX))
        template_error(line, "repetition result too large");
    return total;
}

Value arithmetic(std::string_view op, const Value & a, const Value & b, int line) {
    if (a.is_undefined()) undefined_error(line, a);
    if (b.is_undefined()) undefined_error(line, b);
    const bool nums = a.is_number() && b.is_number();
    const bool ints = nums && a.is_integer() && b.is_integer();
    auto unsupported = [&]() -> Value {
        if (op == "+" && a.is_string())
            template_error(line, std::string("can only concatenate str (not \"") + type_name(b) + "\") to str");
        template_error(line, "unsupported operand type(s) for " + std::string(op) + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
    };
    if (op == "+") {
        if (ints) return Value::integer(checked(kAdd, a.as_int(), b.as_int(), line));
        if (nums) return Value::number(a.as_double() + b.as_double());
        if (a.is_string() && b.is_string()) {
            Value r = a;
            r.append(b.s);
            return r;
        }
        if (a.is_list() && b.is_list() && a.is_tuple == b.is_tuple) {
            Budget::ensure_room(a.list->size() + b.list->size(), sizeof(Value));
            List r = *a.list;
            r.insert(r.end(), b.list->begin(), b.list->end());
            return Value::list_of(std::move(r), a.is_tuple);
        }
        return unsupported();
    }
    if (op == "-") {
        if (ints) return Value::integer(checked(kSub, a.as_int(), b.as_int(), line));
        if (nums) return Value::number(a.as_double() - b.as_double());
        return unsupported();
    }
    if (op == "*") {
        if (ints) return Value::integer(checked(kMul, a.as_int(), b.as_int(), line));
        if (nums) return Value::number(a.as_double() * b.as_double());
        const Value * seq = a.is_string() || a.is_list() ? &a : (b.is_string() || b.is_list() ? &b : nullptr);
        const Value * cnt = seq == &a ? &b : &a;
        if (seq && cnt->is_integer()) {
            const uint64_t n = uint64_t(std::max<int64_t>(0, cnt->as_int()));
            if (seq->is_string()) {
                if (seq->s.empty() || n == 0) return Value::string("");
                const uint64_t size = repeated_size(n, seq->s.size(), line);
                Budget::ensure_room(size);
                Budget::bulk(size);
                std::string r = seq->s;
                r.reserve(size);
                while (r.size() < size) r.append(r, 0, std::min(r.size(), size - r.size()));
                return Value::string(std::move(r));
            }
            if (seq->list->empty() || n == 0) return Value::list_of({}, seq->is_tuple);
            const uint64_t items = repeated_size(n, seq->list->size(), line);
            Budget::ensure_room(items, sizeof(Value));
            List r;
            r.reserve(size_t(items));
            for (uint64_t k = 0; k < n; ++k) r.insert(r.end(), seq->list->begin(), seq->list->end());
            return Value::list_of(std::move(r), seq->is_tuple);
        }
        return unsupported();
    }
    if (op == "/") {
        if (!nums) return unsupported();
        if (b.as_double() == 0) template_error(line, "division by zero");
        return Value::number(a.as_double() / b.as_double());
    }
    if (op == "//" || op == "%") {
        if (op == "%" && a.is_string()) return Value::string(percent_format(a.s, b, line));
        if (!nums) return unsupported();
        if (ints) {
            const int64_t x = a.as_int(), y = b.as_int();
            if (y == 0) template_error(line, op == "%" ? "integer modulo by zero" : "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) template_error(line, "integer overflow");
            int64_t q = x / y, r = x % y;
            if (r != 0 && ((r < 0) != (y < 0))) {
                --q;
                r += y;
            }
            return Value::integer(op == "//" ? q : r);
        }
        const double x = a.as_double(), y = b.as_double();
        if (y == 0) template_error(line, "float division by zero");
        if (op == "//") return Value::number(std::floor(x / y));
        double r = std::fmod(x, y);
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        return Value::number(r);
    }
    if (op == "**") {
        if (!nums) return unsupported();
        if (ints && b.as_int() >= 0) {
            // Square and multiply: 1 ** (2 ** 62) must not loop 2 ** 62 times.
            int64_t r = 1, base = a.as_int();
            for (int64_t e = b.as_int(); e > 0; e >>= 1) {
                if (e & 1) r = checked(kMul, r, base, line);
                if (e > 1) base = checked(kMul, base, base, line);
            }
            return Value::integer(r);
        }
        return Value::number(std::pow(a.as_double(), b.as_double()));
    }
    template_error(line, "unknown operator " + std::string(op));
}

bool contains(const Value & container, const Value & item, int line) {
    switch (container.type) {
        case Value::Type::Undefined: return false;
        case Value::Type::String:
            if (!item.is_string())
                template_error(line, std::string("'in <string>' requires string as left operand, not ") + type_name(item));
            return find_text(container.s, item.s) != std::string::npos;
        case Value::Type::List:
            for (const Value & v : *container.list)
                if (equals(v, item)) return true;
            return false;
        case Value::Type::Dict: return container.dict->find(item) != nullptr;
        case Value::Type::Namespace: return item.is_string() && container.dict->find(item.s) != nullptr;
        default:
            template_error(line, std::string("argument of type '") + type_name(container) + "' is not iterable");
    }
}

// ------------------------------------------------------------------------------------------------
// Evaluator

// Text that a body renders into: the output, a macro's result, a {% set %} or {% filter %} block.
// What it holds counts against the memory budget, and appending counts as work.
class Output {
public:
    Output() = default;
    Output(const Output &)             = delete;
    Output & operator=(const Output &) = delete;
    ~Output() { Budget::refund(charged_); }

    void append(std::string_view piece) {
        charged_ += Budget::charge(piece.size());
        text_.append(piece);
    }
    void append(const Value & v) {
        if (v.is_string()) append(std::string_view(v.s));  // no copy of the string
        else append(std::string_view(to_str(v)));
    }
    // The text, no longer counted here (a Value made of it counts it again).
    std::string release() {
        Budget::refund(charged_);
        charged_ = 0;
        return std::move(text_);
    }

private:
    std::string text_;
    uint64_t    charged_ = 0;
};

class Evaluator {
public:
    Value eval(const Expr & e, Context & ctx);
    Flow  render(const Body & body, Context & ctx, Output & out);

    Value call(const Value & callee, CallArgs & args, Context & ctx, int line) {
        if (callee.type == Value::Type::Callable) {
            args.line = line;
            return callee.callable->fn(args, ctx);
        }
        if (callee.is_undefined()) undefined_error(line, callee);
        template_error(line, "'" + std::string(type_name(callee)) + "' object is not callable");
    }

    Value get_attr(const Value & obj, const std::string & name, int line);
    Value get_item(const Value & obj, const Value & key, int line);
    Value apply_filter(const std::string & name, const Value & v, CallArgs & a, Context & ctx, int line);
    bool  apply_test(const std::string & name, const Value & v, CallArgs & a, Context & ctx, int line);

private:
    // Separate from eval(), which every nested expression goes through: its frame stays small.
    [[gnu::noinline]] Value eval_operand(const Expr & e, Context & ctx);
    [[gnu::noinline]] Value apply_link(const Expr & e, Value operand, Context & ctx);
    [[gnu::noinline]] Value call_method(Value (*fn)(const Value &, CallArgs &, std::string_view), std::string_view name,
                                        const Value & self, const Expr & call, Context & ctx) {
        Budget::steps(2);
        CallArgs args = eval_args(call, 1, ctx);
        return fn(self, args, name);
    }
    Value method(const Value & obj, const std::string & name, int line);
    CallArgs eval_args(const Expr & e, size_t first, Context & ctx) {
        CallArgs a;
        a.line = e.line;
        for (size_t k = first; k < e.args.size(); ++k) a.positional.push_back(eval(*e.args[k], ctx));
        for (const auto & [key, ex] : e.kwargs) a.keyword.emplace_back(key, eval(*ex, ctx));
        return a;
    }
    void  assign(Context & ctx, const std::vector<std::string> & targets, const Value & v, int line);
    Value make_macro(const Node & n, Context & ctx, const Body * body, const std::string & name);
    // Statements apart from render(), which recurses: its frame stays small (stack per nesting level).
    [[gnu::noinline]] Flow  render_for(const Node & n, Context & ctx, Output & out);
    [[gnu::noinline]] Value render_filtered(const Node & n, Context & ctx);
    [[gnu::noinline]] void  render_set(const Node & n, Context & ctx);
    [[gnu::noinline]] void  render_call_block(const Node & n, Context & ctx, Output & out);
    [[gnu::noinline]] Flow  render_with(const Node & n, Context & ctx, Output & out);
    [[gnu::noinline]] Value slice(const Expr & e, const Value & obj, Context & ctx);
};

// ---- methods of the Python objects that templates call: str, dict, list

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

Value dict_method(const Value & d, CallArgs & a, std::string_view m) {
    // string_view comparisons with literals check the length first: no strlen, rarely a memcmp.
    const int line = a.line;
    if (m == "get") {
        auto p = bind(a, {"key", "default"}, m, line);
        const Value * v = d.dict->find(require(p[0], "key", m, line));
        return v ? *v : (p[1] ? *p[1] : Value::none());
    }
    bind(a, {}, m, line);
    List out;
    for (const auto & [k, v] : d.dict->items) {
        if (m == "items") out.push_back(Value::list_of({k, v}, true));
        else out.push_back(m == "keys" ? k : v);
    }
    return Value::list_of(std::move(out));
}

Value list_method(const Value & l, CallArgs & a, std::string_view m) {
    // string_view comparisons with literals check the length first: no strlen, rarely a memcmp.
    auto p = bind(a, {"value"}, m, a.line);
    const Value & x = require(p[0], "value", m, a.line);
    int64_t count = 0;
    for (size_t k = 0; k < l.list->size(); ++k) {
        if (!equals((*l.list)[k], x)) continue;
        if (m == "index") return Value::integer(int64_t(k));
        ++count;
    }
    if (m == "index") template_error(a.line, "value is not in list");
    return Value::integer(count);
}

using Method = Value (*)(const Value & self, CallArgs & a, std::string_view name);

// The method `name` of `obj`, or nullptr where it has none.
Method find_method(const Value & obj, const std::string & name) {
    static const char * const kStrMethods[] = {
        "startswith", "endswith", "split",   "rsplit",  "strip",   "lstrip",       "rstrip",       "replace",    "upper",
        "lower",      "title",    "capitalize", "find", "rfind",   "count",        "join",         "format",     "isdigit",
        "isalpha",    "isalnum",  "isspace", "isupper", "islower", "removeprefix", "removesuffix", "splitlines", "index"};
    static const char * const kDictMethods[] = {"items", "keys", "values", "get"};
    static const char * const kListMethods[] = {"index", "count"};
    auto listed = [&](const auto & names) {
        return std::any_of(std::begin(names), std::end(names), [&](const char * n) { return name == n; });
    };
    if (obj.is_string()) return listed(kStrMethods) ? str_method : nullptr;
    if (obj.is_dict()) return listed(kDictMethods) ? dict_method : nullptr;
    if (obj.is_list()) return listed(kListMethods) ? list_method : nullptr;
    return nullptr;
}

// obj.name as a value: a bound method, or undefined.
Value Evaluator::method(const Value & obj, const std::string & name, int) {
    if (const Method fn = find_method(obj, name)) {
        Value self = obj;
        return Value::function(name, [self, fn, name](CallArgs & a, Context &) -> Value { return fn(self, a, name); });
    }
    if (obj.is_string()) return Value::undefined("'str object' has no attribute '" + name + "'");
    if (obj.is_dict()) return Value::undefined();
    return Value::undefined("'" + object_name(obj) + "' has no attribute '" + name + "'");
}

Value Evaluator::get_attr(const Value & obj, const std::string & name, int line) {
    switch (obj.type) {
        case Value::Type::Undefined: undefined_error(line, obj);
        case Value::Type::Dict: {
            // jinja2 tries Python attributes first (dict methods), then the item.
            Value m = method(obj, name, line);
            if (!m.is_undefined()) return m;
            if (const Value * v = obj.dict->find(name)) return *v;
            return Value::undefined("'dict object' has no attribute '" + name + "'");
        }
        case Value::Type::Namespace: {
            if (const Value * v = obj.dict->find(name)) return *v;
            return Value::undefined("'Namespace object' has no attribute '" + name + "'");
        }
        default: return method(obj, name, line);
    }
}

Value Evaluator::get_item(const Value & obj, const Value & key, int line) {
    switch (obj.type) {
        case Value::Type::Undefined: undefined_error(line, obj);
        case Value::Type::Dict:
            if (const Value * v = obj.dict->find(key)) return *v;
            if (key.is_string()) {
                Value m = method(obj, key.s, line);
                if (!m.is_undefined()) return m;
            }
            return Value::undefined("'dict object' has no attribute " + repr(key));
        case Value::Type::List:
        case Value::Type::String: {
            if (key.is_string()) return get_attr(obj, key.s, line);
            if (!key.is_integer()) return Value::undefined("'" + object_name(obj) + "' has no attribute " + repr(key));
            int64_t idx = key.as_int();
            if (obj.is_list()) {
                const int64_t n = int64_t(obj.list->size());
                if (idx < 0) idx += n;
                if (idx < 0 || idx >= n) return Value::undefined("'" + object_name(obj) + "' has no element " + to_str(key));
                return (*obj.list)[size_t(idx)];
            }
            const auto off = char_offsets(obj.s);
            const int64_t n = int64_t(off.size()) - 1;
            if (idx < 0) idx += n;
            if (idx < 0 || idx >= n) return Value::undefined("'str object' has no element " + to_str(key));
            return Value::string(obj.s.substr(off[size_t(idx)], off[size_t(idx) + 1] - off[size_t(idx)]));
        }
        case Value::Type::Namespace:
            if (key.is_string()) return get_attr(obj, key.s, line);
            return Value::undefined();
        default: return Value::undefined("'" + object_name(obj) + "' has no attribute " + repr(key));
    }
}

void Evaluator::assign(Context & ctx, const std::vector<std::string> & targets, const Value & v, int line) {
    if (targets.size() == 1) {
        ctx.scope->set(targets[0], v);
        return;
    }
    const Items items(v, line);
    if (items.size() != targets.size())
        template_error(line, "cannot unpack " + std::to_string(items.size()) + " values into " +
                                 std::to_string(targets.size()) + " names");
    for (size_t k = 0; k < targets.size(); ++k) ctx.scope->set(targets[k], items[k]);
}

// Expressions that evaluate their first operand, then combine it with the rest. Chains of them
// (a + b + c ..., x.a.b ..., x | f | g ..., not not x ...) are evaluated in a loop, from the inside
// out: their length costs no stack.
bool is_chain_link(const Expr & e) {
    switch (e.kind) {
        case Expr::GetAttr:
        case Expr::GetItem:
        case Expr::Slice:
        case Expr::Call:
        case Expr::Filter:
        case Expr::Test:
        case Expr::Not:
        case Expr::Neg:
        case Expr::Pos:
        case Expr::Binary:
        case Expr::And:
        case Expr::Or:
        case Expr::Compare: return !e.args.empty() && e.args[0];
        default: return false;
    }
}

Value Evaluator::eval(const Expr & e, Context & ctx) {
    DepthGuard depth(*ctx.state, e.line);
    if (!is_chain_link(e)) return eval_operand(e, ctx);
    constexpr size_t kInline = 8;  // most chains are short: no allocation for them
    const Expr *     inline_links[kInline];
    std::vector<const Expr *> more_links;
    size_t n = 0;
    const Expr * p = &e;
    for (; is_chain_link(*p); p = p->args[0].get(), ++n) {
        if (n < kInline) inline_links[n] = p;
        else more_links.push_back(p);
    }
    auto link_at = [&](size_t k) -> const Expr & { return k < kInline ? *inline_links[k] : *more_links[k - kInline]; };
    Value v = eval_operand(*p, ctx);
    while (n-- > 0) {
        const Expr & link = link_at(n);
        // obj.name(args) calls the method at once rather than making a bound method first.
        if (link.kind == Expr::GetAttr && n > 0 && link_at(n - 1).kind == Expr::Call) {
            if (const Method fn = find_method(v, link.name)) {
                v = call_method(fn, link.name, v, link_at(--n), ctx);
                continue;
            }
        }
        v = apply_link(link, std::move(v), ctx);
    }
    return v;
}

// Expressions that are not chain links.
Value Evaluator::eval_operand(const Expr & e, Context & ctx) {
    Budget::steps(1);
    switch (e.kind) {
        case Expr::Literal: return *e.value;
        case Expr::Name: {
            if (const Value * v = ctx.scope->find(e.name)) return *v;
            if (const Value * g = ctx.globals->find(e.name)) return *g;
            return Value::undefined("'" + e.name + "' is undefined");
        }
        case Expr::ListLit:
        case Expr::TupleLit: {
            List items;
            for (const auto & a : e.args) items.push_back(eval(*a, ctx));
            return Value::list_of(std::move(items), e.kind == Expr::TupleLit);
        }
        case Expr::DictLit: {
            Dict d;
            for (size_t k = 0; k + 1 < e.args.size(); k += 2) d.set(eval(*e.args[k], ctx), eval(*e.args[k + 1], ctx));
            return Value::dict_of(std::move(d));
        }
        case Expr::Cond: {
            if (truthy(eval(*e.args[1], ctx))) return eval(*e.args[0], ctx);
            if (e.args[2]) return eval(*e.args[2], ctx);
            return Value::undefined("the inline if expression on line " + std::to_string(e.line) +
                                    " evaluated to false and no else section was defined");
        }
        default: break;
    }
    template_error(e.line, "unknown expression");
}

// obj[start:stop:step]
Value Evaluator::slice(const Expr & e, const Value & obj, Context & ctx) {
    Value parts[3];
    for (int k = 0; k < 3; ++k) parts[k] = e.args[size_t(k) + 1] ? eval(*e.args[size_t(k) + 1], ctx) : Value::none();
    if (obj.is_undefined()) undefined_error(e.line, obj);
    if (obj.is_list()) {
        const SliceRange r = slice_range(int64_t(obj.list->size()), parts[0], parts[1], parts[2], e.line);
        Budget::ensure_room(uint64_t(r.count), sizeof(Value));
        List out;
        out.reserve(size_t(r.count));
        for (int64_t k = 0; k < r.count; ++k) out.push_back((*obj.list)[size_t(r.at(k))]);
        return Value::list_of(std::move(out), obj.is_tuple);
    }
    if (obj.is_string()) {
        const auto off = char_offsets(obj.s);
        const SliceRange r = slice_range(int64_t(off.size()) - 1, parts[0], parts[1], parts[2], e.line);
        Budget::ensure_room(obj.s.size());
        std::string out;
        for (int64_t k = 0; k < r.count; ++k) {
            const size_t p = size_t(r.at(k));
            out.append(obj.s, off[p], off[p + 1] - off[p]);
        }
        return Value::string(std::move(out));
    }
    return Value::undefined("'" + object_name(obj) + "' is not subscriptable");
}

// A chain link applied to the value of its first operand.
Value Evaluator::apply_link(const Expr & e, Value operand, Context & ctx) {
    Budget::steps(1);
    switch (e.kind) {
        case Expr::GetAttr: return get_attr(operand, e.name, e.line);
        case Expr::GetItem: return get_item(operand, eval(*e.args[1], ctx), e.line);
        case Expr::Slice: return slice(e, operand, ctx);
        case Expr::Call: {
            CallArgs args = eval_args(e, 1, ctx);
            return call(operand, args, ctx, e.line);
        }
        case Expr::Filter: {
            CallArgs args = eval_args(e, 1, ctx);
            return apply_filter(e.name, operand, args, ctx, e.line);
        }
        case Expr::Test: {
            CallArgs args = eval_args(e, 1, ctx);
            return Value::boolean(apply_test(e.name, operand, args, ctx, e.line) != e.negated);
        }
        case Expr::Not: return Value::boolean(!truthy(operand));
        case Expr::Neg:
        case Expr::Pos: {
            const Value & v = operand;
            if (v.is_undefined()) undefined_error(e.line, v);
            if (!v.is_number()) template_error(e.line, std::string("bad operand type for unary ") + (e.kind == Expr::Neg ? "-" : "+") + ": '" + type_name(v) + "'");
            if (e.kind == Expr::Pos) return v.type == Value::Type::Bool ? Value::integer(v.as_int()) : v;
            if (v.type == Value::Type::Float) return Value::number(-v.f);
            if (v.as_int() == INT64_MIN) template_error(e.line, "integer overflow");
            return Value::integer(-v.as_int());
        }
        case Expr::Binary: {
            const Value b = eval(*e.args[1], ctx);
            // The left operand is a temporary: appending to it in place makes chains such as
            // a ~ b ~ c ... (and a + b + c ... on strings) cost the length of their result.
            const bool concat = e.name == "~" || (e.name == "+" && operand.is_string() && b.is_string());
            if (!concat) return arithmetic(e.name, operand, b, e.line);
            Value r = operand.is_string() ? std::move(operand) : Value::string(to_str(operand));
            if (b.is_string()) r.append(b.s);
            else r.append(to_str(b));
            return r;
        }
        case Expr::And: return truthy(operand) ? eval(*e.args[1], ctx) : std::move(operand);
        case Expr::Or: return truthy(operand) ? std::move(operand) : eval(*e.args[1], ctx);
        case Expr::Compare: {
            Value left = std::move(operand);
            for (size_t k = 0; k < e.ops.size(); ++k) {
                Value right = eval(*e.args[k + 1], ctx);
                const std::string_view op = e.ops[k];
                bool r;
                if (op == "==") r = equals(left, right);
                else if (op == "!=") r = !equals(left, right);
                else if (op == "in") r = contains(right, left, e.line);
                else if (op == "notin") r = !contains(right, left, e.line);
                else {
                    if (left.is_undefined()) undefined_error(e.line, left);
                    if (right.is_undefined()) undefined_error(e.line, right);
                    const int c = compare(left, right, e.line);
                    r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
                }
                if (!r) return Value::boolean(false);
                left = std::move(right);
            }
            return Value::boolean(true);
        }
        default: break;
    }
    template_error(e.line, "unknown expression");
}

Value Evaluator::make_macro(const Node & n, Context & ctx, const Body * body, const std::string & name) {
    // The macro sees the scope it was defined in (a closure), its parameters and `caller`. The scope
    // holds the macro in turn: the render breaks that cycle when it ends.
    std::shared_ptr<Scope> defining = ctx.scope;
    RenderState::remember(ctx.state->closure_scopes, defining);
    const Node * node = &n;
    return Value::function(name, [this, node, body, defining, name](CallArgs & a, Context & c) -> Value {
        if (c.macro_depth >= kMaxMacroDepth)
            template_error(a.line, "macro calls nest deeper than " + std::to_string(kMaxMacroDepth) + " levels (runaway recursion)");
        DepthGuard depth(*c.state, a.line);
        auto scope = new_scope(defining);
        if (a.positional.size() > node->targets.size())
            template_error(a.line, "macro '" + name + "' takes " + std::to_string(node->targets.size()) + " arguments");
        std::vector<bool> bound(node->targets.size(), false);
        for (size_t k = 0; k < a.positional.size(); ++k) {
            scope->set(node->targets[k], a.positional[k]);
            bound[k] = true;
        }
        for (const auto & [key, v] : a.keyword) {
            auto it = std::find(node->targets.begin(), node->targets.end(), key);
            if (it != node->targets.end()) {
                scope->set(key, v);
                bound[size_t(it - node->targets.begin())] = true;
            } else if (key == "caller") {
                scope->set("caller", v);
            } else {
                template_error(a.line, "macro '" + name + "' takes no keyword argument '" + key + "'");
            }
        }
        Context inner = c;
        inner.scope   = scope;
        ++inner.macro_depth;
        for (size_t k = 0; k < node->targets.size(); ++k) {
            if (bound[k]) continue;
            scope->set(node->targets[k], node->defaults[k] ? eval(*node->defaults[k], inner)
                                                           : Value::undefined("parameter '" + node->targets[k] + "' was not provided"));
        }
        Output out;
        render(*body, inner, out);
        return Value::string(out.release());
    });
}

// jinja2's loop variable for iteration k over `items`.
Value loop_object(const List & items, int64_t k) {
    const int64_t length = int64_t(items.size());
    Dict loop;  // distinct keys: appended without Dict::set's lookups
    loop.items.reserve(12);
    auto add = [&](const char * key, Value v) { loop.items.emplace_back(Value::string(key), std::move(v)); };
    add("index", Value::integer(k + 1));
    add("index0", Value::integer(k));
    add("revindex", Value::integer(length - k));
    add("revindex0", Value::integer(length - k - 1));
    add("first", Value::boolean(k == 0));
    add("last", Value::boolean(k == length - 1));
    add("length", Value::integer(length));
    add("depth", Value::integer(1));
    add("depth0", Value::integer(0));
    if (k > 0) add("previtem", items[size_t(k - 1)]);
    if (k + 1 < length) add("nextitem", items[size_t(k + 1)]);
    add("cycle", Value::function("cycle", [k](CallArgs & a, Context &) -> Value {
            if (a.positional.empty()) template_error(a.line, "no items for cycling given");
            return a.positional[size_t(k) % a.positional.size()];
        }));
    return Value::dict_of(std::move(loop));
}

Flow Evaluator::render_for(const Node & n, Context & ctx, Output & out) {
    const Value iterable = eval(*n.expr, ctx);
    // Lists are immutable: a loop over one reads it in place; other iterables become a list.
    List made;
    if (!iterable.is_list() || n.cond) made = iterate(iterable, n.line);
    if (n.cond) {
        // The loop filter runs first, so loop.length counts only what passes.
        List kept;
        for (const Value & item : made) {
            Budget::steps(1);
            Context probe = ctx;
            probe.scope   = new_scope(ctx.scope);
            assign(probe, n.targets, item, n.line);
            if (truthy(eval(*n.cond, probe))) kept.push_back(item);
        }
        made = std::move(kept);
    }
    const List &  items  = iterable.is_list() && !n.cond ? *iterable.list : made;
    const int64_t length = int64_t(items.size());
    for (int64_t k = 0; k < length; ++k) {
        Budget::steps(1);
        Context inner = ctx;
        inner.scope   = new_scope(ctx.scope);
        assign(inner, n.targets, items[size_t(k)], n.line);
        if (n.uses_loop) inner.scope->set("loop", loop_object(items, k));
        const Flow f = render(n.body, inner, out);
        if (f == Flow::Break) break;
    }
    if (length == 0 && !n.else_body.empty()) return render(n.else_body, ctx, out);
    return Flow::Normal;
}

// The body of a {% set %} or {% filter %} block, rendered, then passed through the block's filters.
Value Evaluator::render_filtered(const Node & n, Context & ctx) {
    Output text;
    render(n.body, ctx, text);
    Value v = Value::string(text.release());
    for (const ExprPtr & f : n.filters) {
        CallArgs args = eval_args(*f, 1, ctx);
        v = apply_filter(f->name, v, args, ctx, f->line);
    }
    return v;
}

void Evaluator::render_set(const Node & n, Context & ctx) {
    const Value v = eval(*n.expr, ctx);
    if (n.text.empty()) {
        assign(ctx, n.targets, v, n.line);
        return;
    }
    const Value * ns = ctx.scope->find(n.targets[0]);
    if (!ns) ns = ctx.globals->find(n.targets[0]);
    if (!ns || ns->type != Value::Type::Namespace) template_error(n.line, "cannot assign attribute on non-namespace object");
    if (n.text[0] == '_')
        template_error(n.line, "chat templates cannot store underscore-prefixed attributes on a namespace");
    ns->dict->set(Value::string(n.text), v);
}

void Evaluator::render_call_block(const Node & n, Context & ctx, Output & out) {
    const Expr & call_expr = *n.expr;
    const Value  callee    = eval(*call_expr.args[0], ctx);
    CallArgs     args      = eval_args(call_expr, 1, ctx);
    args.keyword.emplace_back("caller", make_macro(n, ctx, &n.body, "caller"));
    out.append(call(callee, args, ctx, n.line));
}

Flow Evaluator::render_with(const Node & n, Context & ctx, Output & out) {
    Context inner = ctx;
    inner.scope   = new_scope(ctx.scope);
    for (size_t k = 0; k < n.targets.size(); ++k) inner.scope->set(n.targets[k], eval(*n.defaults[k], ctx));
    return render(n.body, inner, out);
}

Flow Evaluator::render(const Body & body, Context & ctx, Output & out) {
    DepthGuard depth(*ctx.state, body.empty() ? 0 : body.front()->line);
    for (const NodePtr & np : body) {
        const Node & n = *np;
        Budget::steps(1);
        switch (n.kind) {
            case Node::Text: out.append(n.text); break;
            case Node::Output: out.append(eval(*n.expr, ctx)); break;
            case Node::If: {
                size_t k = 0;
                for (; k < n.conds.size(); ++k)
                    if (truthy(eval(*n.conds[k], ctx))) break;
                if (k < n.bodies.size()) {
                    const Flow f = render(n.bodies[k], ctx, out);
                    if (f != Flow::Normal) return f;
                }
                break;
            }
            case Node::For: render_for(n, ctx, out); break;
            case Node::Set: render_set(n, ctx); break;
            case Node::SetBlock: ctx.scope->set(n.targets[0], render_filtered(n, ctx)); break;
            case Node::FilterBlock: out.append(render_filtered(n, ctx)); break;
            case Node::Macro: ctx.scope->set(n.text, make_macro(n, ctx, &n.body, n.text)); break;
            case Node::CallBlock: render_call_block(n, ctx, out); break;
            case Node::With: {
                const Flow f = render_with(n, ctx, out);
                if (f != Flow::Normal) return f;
                break;
            }
            case Node::Generation: {
                const Flow f = render(n.body, ctx, out);
                if (f != Flow::Normal) return f;
                break;
            }
            case Node::Break: return Flow::Break;
            case Node::Continue: return Flow::Continue;
        }
    }
    return Flow::Normal;
}

// ------------------------------------------------------------------------------------------------
// Filters

// Python's round(x, digits): ties go to the even neighbour.
double py_round(double x, int64_t digits) {
    const double scale = std::pow(10.0, double(digits));
    return std::nearbyint(x * scale) / scale;
}

List sorted(List items, bool reverse, bool case_sensitive, const std::function<Value(const Value &)> & key, int line) {
    // Each item's key is computed once, then the keys are sorted with the items' positions.
    std::vector<std::pair<Value, size_t>> keyed;
    keyed.reserve(items.size());
    for (size_t k = 0; k < items.size(); ++k) {
        Value kv = key(items[k]);
        if (!case_sensitive && kv.is_string()) kv = Value::string(map_case(kv.s, false));
        keyed.emplace_back(std::move(kv), k);
    }
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto & a, const auto & b) {
        const int c = compare(a.first, b.first, line);
        return reverse ? c > 0 : c < 0;
    });
    List out;
    out.reserve(items.size());
    for (auto & [kv, k] : keyed) out.push_back(std::move(items[k]));
    return out;
}

}  // namespace

static const char * const kFilters[] = {
    "abs", "attr", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float", "format",
    "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min", "reject", "rejectattr",
    "replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum", "title", "tojson", "trim",
    "unique", "upper", "wordcount"};
static const char * const kTests[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even", "false", "filter",
    "float", "ge", ">=", "gt", "greaterthan", ">", "in", "integer", "iterable", "le", "<=", "lower", "lt", "lessthan",
    "<", "mapping", "ne", "!=", "none", "number", "odd", "sameas", "sequence", "string", "test", "true", "undefined",
    "upper"};

bool is_known_filter(const std::string & name) {
    return std::any_of(std::begin(kFilters), std::end(kFilters), [&](const char * f) { return name == f; });
}
bool is_known_test(const std::string & name) {
    return std::any_of(std::begin(kTests), std::end(kTests), [&](const char * t) { return name == t; });
}

namespace {

// Attribute lookup used by map/selectattr/sort/...: "a.b" walks nested attributes, digits index.
Value attribute_path(Evaluator & ev, const Value & v, const std::string & path, int line) {
    Value cur = v;
    size_t pos = 0;
    while (pos <= path.size()) {
        const size_t dot = path.find('.', pos);
        const std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
        if (cur.is_undefined()) return cur;
        if (small_number(part) >= 0)
            cur = ev.get_item(cur, Value::integer(small_number(part)), line);
        else
            cur = ev.get_item(cur, Value::string(part), line);
        if (dot == std::string::npos) break;
        pos = dot + 1;
    }
    return cur;
}

}  // namespace

Value Evaluator::apply_filter(const std::string & name, const Value & v, CallArgs & a, Context & ctx, int line) {
    const std::string_view f = name;  // compared with literals: lengths first
    auto str_of = [&](const Value & x) { return to_str(x); };
    if (f == "default" || f == "d") {
        auto p = bind(a, {"default_value", "boolean"}, f, line);
        const bool boolean = p[1] && truthy(*p[1]);
        if (v.is_undefined() || (boolean && !truthy(v))) return p[0] ? *p[0] : Value::string("");
        return v;
    }
    if (f == "length" || f == "count") return Value::integer(length_of(v, line));
    if (f == "tojson") {
        // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
        auto p = bind(a, {"ensure_ascii", "indent", "separators", "sort_keys"}, f, line);
        JsonOptions o;
        o.ensure_ascii = p[0] && truthy(*p[0]);
        if (p[1] && !p[1]->is_none()) {
            if (p[1]->is_string()) {
                o.use_indent_str = true;
                o.indent_str     = p[1]->s;
            } else {
                o.indent = std::max<int64_t>(0, require_int(*p[1], "indent", line));
            }
            o.item_sep = ",";
        }
        if (p[2] && !p[2]->is_none()) {
            if (!p[2]->is_list() || p[2]->list->size() != 2 || !(*p[2]->list)[0].is_string() || !(*p[2]->list)[1].is_string())
                template_error(line, "tojson separators must be a pair of strings");
            o.item_sep = (*p[2]->list)[0].s;
            o.key_sep  = (*p[2]->list)[1].s;
        }
        o.sort_keys = p[3] && truthy(*p[3]);
        return Value::string(to_json(v, o, line));
    }
    if (f == "trim") {
        auto p = bind(a, {"chars"}, f, line);
        return Value::string(strip_chars(str_of(v), p[0], true, true, line));
    }
    if (f == "upper" || f == "lower") return Value::string(map_case(str_of(v), f == "upper"));
    if (f == "capitalize") return Value::string(py_capitalize(str_of(v)));
    if (f == "title") {
        // jinja2: words start after '-', whitespace, or an opening bracket.
        const std::string s = str_of(v);
        Budget::scan(s.size());
        Budget::ensure_room(s.size());
        std::string out;
        bool start = true;
        for (size_t i = 0; i < s.size();) {
            const uint32_t cp = unicode::next_codepoint(s, i);
            const bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || unicode::is_python_space(cp);
            unicode::append_utf8(out, sep ? cp : (start ? unicode::to_upper(cp) : unicode::to_lower(cp)));
            start = sep;
        }
        return Value::string(std::move(out));
    }
    if (f == "string") return Value::string(str_of(v));
    if (f == "safe") return v;
    if (f == "e" || f == "escape") {
        if (!v.is_string() && v.is_undefined()) return Value::string("");
        const std::string s = str_of(v);
        Budget::scan(s.size());
        size_t size = s.size();
        for (char c : s) size += c == '&' || c == '<' || c == '>' ? 3 : (c == '"' || c == '\'' ? 4 : 0);
        Budget::ensure_room(size);
        std::string out;
        out.reserve(size);
        for (char c : s) {
            switch (c) {
                case '&': out += "&amp;"; break;
                case '<': out += "&lt;"; break;
                case '>': out += "&gt;"; break;
                case '"': out += "&#34;"; break;
                case '\'': out += "&#39;"; break;
                default: out += c;
            }
        }
        return Value::string(std::move(out));
    }
    if (f == "first" || f == "last") {
        if (v.is_undefined()) undefined_error(line, v);
        const Items items(v, line);
        if (items.empty()) return Value::undefined("No " + std::string(f) + " item, sequence was empty.");
        return items[f == "first" ? 0 : items.size() - 1];
    }
    if (f == "join") {
        auto p = bind(a, {"d", "attribute"}, f, line);
        const std::string sep = p[0] ? str_of(*p[0]) : "";
        std::string out;
        bool first = true;
        for (const Value & item : Items(v, line)) {
            Budget::steps(1);
            if (!first) append_checked(out, sep);
            first = false;
            append_checked(out, str_of(p[1] ? attribute_path(*this, item, str_of(*p[1]), line) : item));
        }
        return Value::string(std::move(out));
    }
    if (f == "replace") {
        auto p = bind(a, {"old", "new", "count"}, f, line);
        const int64_t count = p[2] && !p[2]->is_none() ? require_int(*p[2], "count", line) : -1;
        return Value::string(replace_all(str_of(v), str_of(require(p[0], "old", f, line)),
                                         str_of(require(p[1], "new", f, line)), count));
    }
    if (f == "items") {
        if (v.is_undefined()) return Value::list_of({});
        if (!v.is_dict()) template_error(line, "items filter: can only get item pairs from a mapping");
        List out;
        for (const auto & [k, x] : v.dict->items) out.push_back(Value::list_of({k, x}, true));
        return Value::list_of(std::move(out));
    }
    if (f == "list") return Value::list_of(iterate(v, line));
    if (f == "reverse") {
        if (v.is_string()) {
            const auto off = char_offsets(v.s);
            std::string out;
            for (size_t k = off.size() - 1; k-- > 0;) out.append(v.s, off[k], off[k + 1] - off[k]);
            return Value::string(std::move(out));
        }
        List items = iterate(v, line);
        std::reverse(items.begin(), items.end());
        return Value::list_of(std::move(items));
    }
    if (f == "int") {
        auto p = bind(a, {"default", "base"}, f, line);
        const Value dflt = p[0] ? *p[0] : Value::integer(0);
        if (v.is_integer()) return Value::integer(v.as_int());
        if (v.type == Value::Type::Float) return std::isfinite(v.f) ? Value::integer(float_to_int(v.f, line)) : dflt;
        if (v.is_string()) {
            const std::string s = strip_chars(v.s, nullptr, true, true, line);
            const int base = p[1] ? int(require_int(*p[1], "base", line)) : 10;
            try {
                size_t used = 0;
                const long long x = std::stoll(s, &used, base);
                if (used == s.size()) return Value::integer(x);
            } catch (const std::exception &) {
            }
            try {
                size_t used = 0;
                const double d = std::stod(s, &used);
                if (used == s.size() && std::isfinite(d)) return Value::integer(float_to_int(d, line));
            } catch (const std::exception &) {
            }
        }
        return dflt;
    }
    if (f == "float") {
        auto p = bind(a, {"default"}, f, line);
        const Value dflt = p[0] ? *p[0] : Value::number(0.0);
        if (v.is_number()) return Value::number(v.as_double());
        if (v.is_string()) {
            try {
                const std::string s = strip_chars(v.s, nullptr, true, true, line);
                size_t used = 0;
                const double d = std::stod(s, &used);
                if (used == s.size()) return Value::number(d);
            } catch (const std::exception &) {
            }
        }
        return dflt;
    }
    if (f == "abs") {
        if (!v.is_number()) template_error(line, std::string("bad operand type for abs(): '") + type_name(v) + "'");
        if (v.type == Value::Type::Float) return Value::number(std::fabs(v.f));
        if (v.as_int() == INT64_MIN) template_error(line, "integer overflow");
        return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
    }
    if (f == "round") {
        auto p = bind(a, {"precision", "method"}, f, line);
        const int64_t precision = p[0] ? require_int(*p[0], "precision", line) : 0;
        const std::string method = p[1] ? str_of(*p[1]) : "common";
        if (!v.is_number()) template_error(line, "round filter needs a number");
        const double scale = std::pow(10.0, double(precision));
        double x = v.as_double();
        if (method == "common") x = py_round(x, precision);
        else if (method == "ceil") x = std::ceil(x * scale) / scale;
        else if (method == "floor") x = std::floor(x * scale) / scale;
        else template_error(line, "method must be common, ceil or floor");
        return Value::number(x);
    }
    if (f == "indent") {
        auto p = bind(a, {"width", "first", "blank"}, f, line);
        std::string indention = "    ";
        if (p[0] && p[0]->is_string()) {
            indention = p[0]->s;
        } else if (p[0]) {
            const int64_t width = std::max<int64_t>(0, require_int(*p[0], "width", line));
            Budget::ensure_room(uint64_t(width));
            indention.assign(size_t(width), ' ');
        }
        const bool first = p[1] && truthy(*p[1]), blank = p[2] && truthy(*p[2]);
        // Every line but the first gets the indention (empty ones only with blank=true).
        const std::string s = str_of(v);
        Budget::scan(s.size());
        std::string rv;
        if (first) append_checked(rv, indention);
        for (size_t pos = 0;;) {
            const size_t end = std::min(s.find('\n', pos), s.size());
            const std::string_view text = std::string_view(s).substr(pos, end - pos);
            if (pos > 0) {
                append_checked(rv, "\n");
                if (blank || !text.empty()) append_checked(rv, indention);
            }
            append_checked(rv, text);
            if (end == s.size()) break;
            pos = end + 1;
        }
        return Value::string(std::move(rv));
    }
    if (f == "format") {
        Value args = Value::list_of(a.positional, true);
        if (!a.keyword.empty()) {
            Dict d;
            for (const auto & [k, x] : a.keyword) d.set(Value::string(k), x);
            args = Value::dict_of(std::move(d));
        }
        return Value::string(percent_format(str_of(v), args, line));
    }
    if (f == "wordcount") return Value::integer(int64_t(split_string(str_of(v), nullptr, nullptr, line).size()));
    if (f == "attr") {
        auto p = bind(a, {"name"}, f, line);
        return get_attr(v, str_of(require(p[0], "name", f, line)), line);
    }
    if (f == "map") {
        List out;
        const Items items(v, line);
        const Value * attribute = nullptr;
        const Value * dflt      = nullptr;
        for (const auto & [k, x] : a.keyword) {
            if (k == "attribute") attribute = &x;
            else if (k == "default") dflt = &x;
        }
        if (attribute) {
            for (const Value & item : items) {
                Budget::steps(1);
                Value r = attribute_path(*this, item, str_of(*attribute), line);
                out.push_back(r.is_undefined() && dflt ? *dflt : r);
            }
            return Value::list_of(std::move(out));
        }
        if (a.positional.empty()) template_error(line, "map requires a filter name or attribute=");
        const std::string filter = str_of(a.positional[0]);
        if (!is_known_filter(filter)) template_error(line, "unknown filter '" + filter + "'");
        CallArgs rest;
        rest.positional.assign(a.positional.begin() + 1, a.positional.end());
        rest.keyword = a.keyword;
        for (const Value & item : items) {
            Budget::steps(1);
            CallArgs copy = rest;
            out.push_back(apply_filter(filter, item, copy, ctx, line));
        }
        return Value::list_of(std::move(out));
    }
    if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
        const bool by_attr = f == "selectattr" || f == "rejectattr";
        const bool keep_if = f == "select" || f == "selectattr";
        size_t k = 0;
        std::string attribute;
        if (by_attr) {
            if (a.positional.empty()) template_error(line, std::string(f) + " requires an attribute name");
            attribute = str_of(a.positional[k++]);
        }
        std::string test;
        if (k < a.positional.size()) test = str_of(a.positional[k++]);
        if (!test.empty() && !is_known_test(test)) template_error(line, "unknown test '" + test + "'");
        CallArgs rest;
        rest.positional.assign(a.positional.begin() + std::ptrdiff_t(k), a.positional.end());
        List out;
        for (const Value & item : Items(v, line)) {
            Budget::steps(1);
            const Value subject = by_attr ? attribute_path(*this, item, attribute, line) : item;
            CallArgs copy = rest;
            const bool ok = test.empty() ? truthy(subject) : apply_test(test, subject, copy, ctx, line);
            if (ok == keep_if) out.push_back(item);
        }
        return Value::list_of(std::move(out));
    }
    if (f == "sort") {
        auto p = bind(a, {"reverse", "case_sensitive", "attribute"}, f, line);
        const std::string attribute = p[2] ? str_of(*p[2]) : "";
        return Value::list_of(sorted(iterate(v, line), p[0] && truthy(*p[0]), p[1] && truthy(*p[1]),
                                     [&](const Value & x) { return attribute.empty() ? x : attribute_path(*this, x, attribute, line); },
                                     line));
    }
    if (f == "dictsort") {
        auto p = bind(a, {"case_sensitive", "by", "reverse"}, f, line);
        if (!v.is_dict()) template_error(line, "dictsort filter needs a mapping");
        const bool by_value = p[1] && str_of(*p[1]) == "value";
        List pairs;
        for (const auto & [k, x] : v.dict->items) pairs.push_back(Value::list_of({k, x}, true));
        return Value::list_of(sorted(std::move(pairs), p[2] && truthy(*p[2]), p[0] && truthy(*p[0]),
                                     [&](const Value & pr) { return (*pr.list)[by_value ? 1 : 0]; }, line));
    }
    if (f == "unique") {
        auto p = bind(a, {"case_sensitive", "attribute"}, f, line);
        const bool cs = p[0] && truthy(*p[0]);
        List out, seen;
        for (const Value & item : Items(v, line)) {
            Value key = p[1] ? attribute_path(*this, item, str_of(*p[1]), line) : item;
            if (!cs && key.is_string()) key.s = map_case(key.s, false);
            if (std::any_of(seen.begin(), seen.end(), [&](const Value & s) { return equals(s, key); })) continue;
            seen.push_back(key);
            out.push_back(item);
        }
        return Value::list_of(std::move(out));
    }
    if (f == "min" || f == "max") {
        auto p = bind(a, {"case_sensitive", "attribute"}, f, line);
        const Items items(v, line);
        if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
        const std::string attribute = p[1] ? str_of(*p[1]) : "";
        const bool case_sensitive = p[0] && truthy(*p[0]);
        auto key = [&](const Value & x) {
            Value k = attribute.empty() ? x : attribute_path(*this, x, attribute, line);
            if (!case_sensitive && k.is_string()) k = Value::string(map_case(k.s, false));
            return k;
        };
        // Python's min() and max(): the first of the smallest or largest items, in one pass.
        size_t best     = 0;
        Value  best_key = key(items[0]);
        for (size_t k = 1; k < items.size(); ++k) {
            Value candidate = key(items[k]);
            const int c     = compare(candidate, best_key, line);
            if (f == "min" ? c < 0 : c > 0) {
                best     = k;
                best_key = std::move(candidate);
            }
        }
        return items[best];
    }
    if (f == "sum") {
        auto p = bind(a, {"attribute", "start"}, f, line);
        Value total = p[1] ? *p[1] : Value::integer(0);
        for (const Value & item : Items(v, line))
            total = arithmetic("+", total, p[0] ? attribute_path(*this, item, str_of(*p[0]), line) : item, line);
        return total;
    }
    template_error(line, "unknown filter '" + name + "'");
}

bool Evaluator::apply_test(const std::string & name, const Value & v, CallArgs & a, Context & ctx, int line) {
    const std::string_view t = name;  // compared with literals: lengths first
    auto arg = [&](const char * what) -> const Value & {
        auto p = bind(a, {what}, t, line);
        return require(p[0], what, t, line);
    };
    using T = Value::Type;
    if (t == "defined") return !v.is_undefined();
    if (t == "undefined") return v.is_undefined();
    if (t == "none") return v.is_none();
    if (t == "boolean") return v.type == T::Bool;
    if (t == "true") return v.type == T::Bool && v.b;
    if (t == "false") return v.type == T::Bool && !v.b;
    if (t == "integer") return v.type == T::Int;
    if (t == "float") return v.type == T::Float;
    if (t == "number") return v.is_number();
    if (t == "string") return v.is_string();
    if (t == "mapping") return v.is_dict();
    if (t == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
    if (t == "sequence") return v.is_string() || v.is_list() || v.is_dict();
    if (t == "callable") return v.type == T::Callable;
    if (t == "escaped") return false;
    if (t == "lower" || t == "upper") {
        if (!v.is_string()) return false;
        CallArgs none;
        none.line = line;
        return truthy(method(v, t == "lower" ? "islower" : "isupper", line).callable->fn(none, ctx));
    }
    if (t == "odd" || t == "even") {
        const int64_t x = require_int(v, "value", line);
        return (((x % 2) + 2) % 2 == 1) == (t == "odd");
    }
    if (t == "divisibleby") {
        const int64_t d = require_int(arg("num"), "num", line);
        if (d == 0) template_error(line, "integer division or modulo by zero");
        return require_int(v, "value", line) % d == 0;
    }
    if (t == "eq" || t == "equalto" || t == "==") return equals(v, arg("other"));
    if (t == "ne" || t == "!=") return !equals(v, arg("other"));
    if (t == "sameas") {
        const Value & o = arg("other");
        if (v.type != o.type) return false;
        if (v.is_none() || v.is_undefined()) return true;
        if (v.type == T::Bool) return v.b == o.b;
        if (v.is_list()) return v.list == o.list;
        if (v.is_dict() || v.type == T::Namespace) return v.dict == o.dict;
        return equals(v, o);
    }
    if (t == "lt" || t == "lessthan" || t == "<") return compare(v, arg("other"), line) < 0;
    if (t == "le" || t == "<=") return compare(v, arg("other"), line) <= 0;
    if (t == "gt" || t == "greaterthan" || t == ">") return compare(v, arg("other"), line) > 0;
    if (t == "ge" || t == ">=") return compare(v, arg("other"), line) >= 0;
    if (t == "in") return contains(arg("seq"), v, line);
    if (t == "filter") return v.is_string() && is_known_filter(v.s);
    if (t == "test") return v.is_string() && is_known_test(v.s);
    template_error(line, "unknown test '" + name + "'");
}

// ------------------------------------------------------------------------------------------------
// Globals and entry point

namespace {

Dict make_globals() {
    Dict g;
    g.set(Value::string("range"), Value::function("range", [](CallArgs & a, Context &) -> Value {
              if (a.positional.empty() || a.positional.size() > 3 || !a.keyword.empty())
                  template_error(a.line, "range expected 1 to 3 integer arguments");
              int64_t start = 0, stop, step = 1;
              if (a.positional.size() == 1) {
                  stop = require_int(a.positional[0], "range argument", a.line);
              } else {
                  start = require_int(a.positional[0], "range argument", a.line);
                  stop  = require_int(a.positional[1], "range argument", a.line);
                  if (a.positional.size() == 3) step = require_int(a.positional[2], "range argument", a.line);
              }
              if (step == 0) template_error(a.line, "range() arg 3 must not be zero");
              // The length first (in unsigned arithmetic: stop - start can exceed int64), then the items.
              const bool     up   = step > 0;
              const uint64_t span = up ? (stop > start ? uint64_t(stop) - uint64_t(start) : 0)
                                       : (start > stop ? uint64_t(start) - uint64_t(stop) : 0);
              const uint64_t magnitude = up ? uint64_t(step) : uint64_t(-(step + 1)) + 1;
              const uint64_t length    = span == 0 ? 0 : (span - 1) / magnitude + 1;
              if (length > uint64_t(kMaxRange))
                  template_error(a.line, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
              List out;
              out.reserve(size_t(length));
              for (uint64_t k = 0; k < length; ++k) out.push_back(Value::integer(int64_t(uint64_t(start) + k * uint64_t(step))));
              return Value::list_of(std::move(out));
          }));
    g.set(Value::string("namespace"), Value::function("namespace", [](CallArgs & a, Context & c) -> Value {
              Dict attrs;
              for (const Value & p : a.positional) {
                  if (!p.is_dict()) template_error(a.line, "namespace() positional arguments must be mappings");
                  for (const auto & [k, v] : p.dict->items) attrs.set(k, v);
              }
              for (const auto & [k, v] : a.keyword) attrs.set(Value::string(k), v);
              for (const auto & [k, v] : attrs.items)
                  if (k.is_string() && !k.s.empty() && k.s[0] == '_')
                      template_error(a.line, "chat templates cannot store underscore-prefixed attributes on a namespace");
              Value ns = Value::namespace_of(std::move(attrs));
              RenderState::remember(c.state->namespaces, ns.dict);  // namespaces can hold each other
              return ns;
          }));
    g.set(Value::string("dict"), Value::function("dict", [](CallArgs & a, Context &) -> Value {
              Dict d;
              for (const Value & p : a.positional) {
                  if (p.is_dict()) {
                      for (const auto & [k, v] : p.dict->items) d.set(k, v);
                  } else {
                      for (const Value & pair : Items(p, a.line)) {
                          if (!pair.is_list() || pair.list->size() != 2) template_error(a.line, "dict() needs key/value pairs");
                          d.set((*pair.list)[0], (*pair.list)[1]);
                      }
                  }
              }
              for (const auto & [k, v] : a.keyword) d.set(Value::string(k), v);
              return Value::dict_of(std::move(d));
          }));
    g.set(Value::string("raise_exception"), Value::function("raise_exception", [](CallArgs & a, Context &) -> Value {
              const std::string msg = a.positional.empty() ? std::string() : to_str(a.positional[0]);
              template_error(a.line, "raise_exception: " + msg);
          }));
    g.set(Value::string("strftime_now"), Value::function("strftime_now", [](CallArgs & a, Context &) -> Value {
              if (a.positional.size() != 1 || !a.positional[0].is_string())
                  template_error(a.line, "strftime_now(format) needs a format string");
              const std::time_t now = std::time(nullptr);
              std::tm tm{};
              localtime_r(&now, &tm);
              char buf[512];
              const size_t n = std::strftime(buf, sizeof buf, a.positional[0].s.c_str(), &tm);
              return Value::string(std::string(buf, n));
          }));
    return g;
}

}  // namespace

std::string render(const Template & tmpl, const Dict & variables, const RenderLimits & limits) {
    static const Dict globals = make_globals();
    // Destroyed in reverse order: the context's values first, then the cycles that the render state
    // breaks, and the budget last, so that everything is refunded to it.
    Budget      budget(limits);
    RenderState state(limits);
    Context     ctx;
    ctx.globals = &globals;
    ctx.state   = &state;
    ctx.scope   = new_scope(nullptr);
    for (const auto & [k, v] : variables.items)
        if (k.is_string()) ctx.scope->set(k.s, v);
    Evaluator ev;
    Output    out;
    ev.render(tmpl.body, ctx, out);
    return out.release();
}

}  // namespace spark::jinja
