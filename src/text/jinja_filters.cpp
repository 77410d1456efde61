// The filters and tests: jinja2's builtins that chat templates use, with jinja2's semantics (and
// transformers' tojson), each in a table of name -> function. A family of names can share a function
// (aliases such as d/default, pairs such as upper/lower), which tells them apart by the name.
#include "text/jinja_filters.h"

#include "text/jinja_eval.h"
#include "text/jinja_str.h"
#include "text/unicode.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace spark::jinja {

namespace {

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

// Attribute lookup used by map/selectattr/sort/...: "a.b" walks nested attributes, digits index.
Value attribute_path(const Value & v, const std::string & path, int line) {
    Value cur = v;
    size_t pos = 0;
    while (pos <= path.size()) {
        const size_t dot = path.find('.', pos);
        const std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
        if (cur.is_undefined()) return cur;
        if (small_number(part) >= 0)
            cur = get_item(cur, Value::integer(small_number(part)), line);
        else
            cur = get_item(cur, Value::string(part), line);
        if (dot == std::string::npos) break;
        pos = dot + 1;
    }
    return cur;
}

// The entry of `name` in a table of {name, fn}; nullptr when there is none.
template <typename Entry, size_t N> const Entry * find_named(const Entry (&table)[N], std::string_view name) {
    for (const Entry & e : table)
        if (e.name == name) return &e;
    return nullptr;
}

// ---- filters: v | f(a)

Value filter_default_value(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    auto p = bind(a, {"default_value", "boolean"}, f, line);
    const bool boolean = p[1] && truthy(*p[1]);
    if (v.is_undefined() || (boolean && !truthy(v))) return p[0] ? *p[0] : Value::string("");
    return v;
}

Value filter_length(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    return Value::integer(length_of(v, line));
}

Value filter_tojson(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
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

Value filter_trim(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    auto p = bind(a, {"chars"}, f, line);
    return Value::string(strip_chars(to_str(v), p[0], true, true, line));
}

Value filter_change_case(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    return Value::string(map_case(to_str(v), f == "upper"));
}

Value filter_capitalize(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    return Value::string(py_capitalize(to_str(v)));
}

Value filter_title(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    // jinja2: words start after '-', whitespace, or an opening bracket.
    const std::string s = to_str(v);
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

Value filter_string(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    return Value::string(to_str(v));
}

Value filter_safe(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    return v;
}

Value filter_escape(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    if (!v.is_string() && v.is_undefined()) return Value::string("");
    const std::string s = to_str(v);
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

Value filter_first_or_last(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    if (v.is_undefined()) undefined_error(line, v);
    const Items items(v, line);
    if (items.empty()) return Value::undefined("No " + std::string(f) + " item, sequence was empty.");
    return items[f == "first" ? 0 : items.size() - 1];
}

Value filter_join(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    auto p = bind(a, {"d", "attribute"}, f, line);
    const std::string sep = p[0] ? to_str(*p[0]) : "";
    std::string out;
    bool first = true;
    for (const Value & item : Items(v, line)) {
        Budget::steps(1);
        if (!first) append_checked(out, sep);
        first = false;
        append_checked(out, to_str(p[1] ? attribute_path(item, to_str(*p[1]), line) : item));
    }
    return Value::string(std::move(out));
}

Value filter_replace(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    auto p = bind(a, {"old", "new", "count"}, f, line);
    const int64_t count = p[2] && !p[2]->is_none() ? require_int(*p[2], "count", line) : -1;
    return Value::string(replace_all(to_str(v), to_str(require(p[0], "old", f, line)),
                                     to_str(require(p[1], "new", f, line)), count));
}

Value filter_items(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    if (v.is_undefined()) return Value::list_of({});
    if (!v.is_dict()) template_error(line, "items filter: can only get item pairs from a mapping");
    List out;
    for (const auto & [k, x] : v.dict->items) out.push_back(Value::list_of({k, x}, true));
    return Value::list_of(std::move(out));
}

Value filter_list(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    return Value::list_of(iterate(v, line));
}

Value filter_reverse(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
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

Value filter_to_int(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
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

Value filter_to_float(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
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

Value filter_abs(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    if (!v.is_number()) template_error(line, std::string("bad operand type for abs(): '") + type_name(v) + "'");
    if (v.type == Value::Type::Float) return Value::number(std::fabs(v.f));
    if (v.as_int() == INT64_MIN) template_error(line, "integer overflow");
    return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
}

Value filter_round(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    auto p = bind(a, {"precision", "method"}, f, line);
    const int64_t precision = p[0] ? require_int(*p[0], "precision", line) : 0;
    const std::string method = p[1] ? to_str(*p[1]) : "common";
    if (!v.is_number()) template_error(line, "round filter needs a number");
    const double scale = std::pow(10.0, double(precision));
    double x = v.as_double();
    if (method == "common") x = py_round(x, precision);
    else if (method == "ceil") x = std::ceil(x * scale) / scale;
    else if (method == "floor") x = std::floor(x * scale) / scale;
    else template_error(line, "method must be common, ceil or floor");
    return Value::number(x);
}

Value filter_indent(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
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
    const std::string s = to_str(v);
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

Value filter_format(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    Value args = Value::list_of(a.positional, true);
    if (!a.keyword.empty()) {
        Dict d;
        for (const auto & [k, x] : a.keyword) d.set(Value::string(k), x);
        args = Value::dict_of(std::move(d));
    }
    return Value::string(percent_format(to_str(v), args, line));
}

Value filter_wordcount(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    return Value::integer(int64_t(split_string(to_str(v), nullptr, nullptr, line).size()));
}

Value filter_attr(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    auto p = bind(a, {"name"}, f, line);
    return get_attr(v, to_str(require(p[0], "name", f, line)), line);
}

Value filter_map(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
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
            Value r = attribute_path(item, to_str(*attribute), line);
            out.push_back(r.is_undefined() && dflt ? *dflt : r);
        }
        return Value::list_of(std::move(out));
    }
    if (a.positional.empty()) template_error(line, "map requires a filter name or attribute=");
    const std::string filter = to_str(a.positional[0]);
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

Value filter_select(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    const bool by_attr = f == "selectattr" || f == "rejectattr";
    const bool keep_if = f == "select" || f == "selectattr";
    size_t k = 0;
    std::string attribute;
    if (by_attr) {
        if (a.positional.empty()) template_error(line, std::string(f) + " requires an attribute name");
        attribute = to_str(a.positional[k++]);
    }
    std::string test;
    if (k < a.positional.size()) test = to_str(a.positional[k++]);
    if (!test.empty() && !is_known_test(test)) template_error(line, "unknown test '" + test + "'");
    CallArgs rest;
    rest.positional.assign(a.positional.begin() + std::ptrdiff_t(k), a.positional.end());
    List out;
    for (const Value & item : Items(v, line)) {
        Budget::steps(1);
        const Value subject = by_attr ? attribute_path(item, attribute, line) : item;
        CallArgs copy = rest;
        const bool ok = test.empty() ? truthy(subject) : apply_test(test, subject, copy, ctx, line);
        if (ok == keep_if) out.push_back(item);
    }
    return Value::list_of(std::move(out));
}

Value filter_sort(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    auto p = bind(a, {"reverse", "case_sensitive", "attribute"}, f, line);
    const std::string attribute = p[2] ? to_str(*p[2]) : "";
    return Value::list_of(sorted(iterate(v, line), p[0] && truthy(*p[0]), p[1] && truthy(*p[1]),
                                 [&](const Value & x) { return attribute.empty() ? x : attribute_path(x, attribute, line); },
                                 line));
}

Value filter_dictsort(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    auto p = bind(a, {"case_sensitive", "by", "reverse"}, f, line);
    if (!v.is_dict()) template_error(line, "dictsort filter needs a mapping");
    const bool by_value = p[1] && to_str(*p[1]) == "value";
    List pairs;
    for (const auto & [k, x] : v.dict->items) pairs.push_back(Value::list_of({k, x}, true));
    return Value::list_of(sorted(std::move(pairs), p[2] && truthy(*p[2]), p[0] && truthy(*p[0]),
                                 [&](const Value & pr) { return (*pr.list)[by_value ? 1 : 0]; }, line));
}

Value filter_unique(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    auto p = bind(a, {"case_sensitive", "attribute"}, f, line);
    const bool cs = p[0] && truthy(*p[0]);
    List out, seen;
    for (const Value & item : Items(v, line)) {
        Value key = p[1] ? attribute_path(item, to_str(*p[1]), line) : item;
        if (!cs && key.is_string()) key.s = map_case(key.s, false);
        if (std::any_of(seen.begin(), seen.end(), [&](const Value & s) { return equals(s, key); })) continue;
        seen.push_back(key);
        out.push_back(item);
    }
    return Value::list_of(std::move(out));
}

Value filter_min_or_max(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    auto p = bind(a, {"case_sensitive", "attribute"}, f, line);
    const Items items(v, line);
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    const std::string attribute = p[1] ? to_str(*p[1]) : "";
    const bool case_sensitive = p[0] && truthy(*p[0]);
    auto key = [&](const Value & x) {
        Value k = attribute.empty() ? x : attribute_path(x, attribute, line);
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

Value filter_sum(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line) {
    auto p = bind(a, {"attribute", "start"}, f, line);
    Value total = p[1] ? *p[1] : Value::integer(0);
    for (const Value & item : Items(v, line))
        total = arithmetic("+", total, p[0] ? attribute_path(item, to_str(*p[0]), line) : item, line);
    return total;
}

using Filter = Value (*)(const Value & v, CallArgs & a, Context & ctx, std::string_view f, int line);
struct NamedFilter {
    std::string_view name;
    Filter           fn;
};

// Every filter there is: the parser rejects the names not here.
constexpr NamedFilter kFilters[] = {
    {"abs",         filter_abs},
    {"attr",        filter_attr},
    {"capitalize",  filter_capitalize},
    {"count",       filter_length},
    {"d",           filter_default_value},
    {"default",     filter_default_value},
    {"dictsort",    filter_dictsort},
    {"e",           filter_escape},
    {"escape",      filter_escape},
    {"first",       filter_first_or_last},
    {"float",       filter_to_float},
    {"format",      filter_format},
    {"indent",      filter_indent},
    {"int",         filter_to_int},
    {"items",       filter_items},
    {"join",        filter_join},
    {"last",        filter_first_or_last},
    {"length",      filter_length},
    {"list",        filter_list},
    {"lower",       filter_change_case},
    {"map",         filter_map},
    {"max",         filter_min_or_max},
    {"min",         filter_min_or_max},
    {"reject",      filter_select},
    {"rejectattr",  filter_select},
    {"replace",     filter_replace},
    {"reverse",     filter_reverse},
    {"round",       filter_round},
    {"safe",        filter_safe},
    {"select",      filter_select},
    {"selectattr",  filter_select},
    {"sort",        filter_sort},
    {"string",      filter_string},
    {"sum",         filter_sum},
    {"title",       filter_title},
    {"tojson",      filter_tojson},
    {"trim",        filter_trim},
    {"unique",      filter_unique},
    {"upper",       filter_change_case},
    {"wordcount",   filter_wordcount},
};

// ---- tests: v is t(a)

using T = Value::Type;

// `v is name(a)` being evaluated.
struct TestCall {
    const Value &    v;
    CallArgs &       a;
    Context &        ctx;
    std::string_view name;
    int              line;

    // The test's one argument (`v is divisibleby(3)`, `v is in(seq)`).
    const Value & arg(const char * what) const {
        auto p = bind(a, {what}, name, line);
        return require(p[0], what, name, line);
    }
};

bool test_case(const TestCall & x) {
    if (!x.v.is_string()) return false;
    CallArgs none;
    none.line = x.line;
    return truthy(bound_method(x.v, x.name == "lower" ? "islower" : "isupper", x.line).callable->fn(none, x.ctx));
}

int64_t parity(const TestCall & x) {
    const int64_t n = require_int(x.v, "value", x.line);
    return ((n % 2) + 2) % 2;
}

bool test_divisibleby(const TestCall & x) {
    const int64_t d = require_int(x.arg("num"), "num", x.line);
    if (d == 0) template_error(x.line, "integer division or modulo by zero");
    return require_int(x.v, "value", x.line) % d == 0;
}

bool test_sameas(const TestCall & x) {
    const Value & v = x.v;
    const Value & o = x.arg("other");
    if (v.type != o.type) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.type == T::Bool) return v.b == o.b;
    if (v.is_list()) return v.list == o.list;
    if (v.is_dict() || v.type == T::Namespace) return v.dict == o.dict;
    return equals(v, o);
}

bool test_eq(const TestCall & x) { return equals(x.v, x.arg("other")); }
bool test_ne(const TestCall & x) { return !equals(x.v, x.arg("other")); }
bool test_lt(const TestCall & x) { return compare(x.v, x.arg("other"), x.line) < 0; }
bool test_le(const TestCall & x) { return compare(x.v, x.arg("other"), x.line) <= 0; }
bool test_gt(const TestCall & x) { return compare(x.v, x.arg("other"), x.line) > 0; }
bool test_ge(const TestCall & x) { return compare(x.v, x.arg("other"), x.line) >= 0; }

using Test = bool (*)(const TestCall & x);
struct NamedTest {
    std::string_view name;
    Test             fn;
};

// Every test there is: the parser rejects the names not here.
constexpr NamedTest kTests[] = {
    {"!=",          test_ne},
    {"<",           test_lt},
    {"<=",          test_le},
    {"==",          test_eq},
    {">",           test_gt},
    {">=",          test_ge},
    {"boolean",     [](const TestCall & x) { return x.v.type == T::Bool; }},
    {"callable",    [](const TestCall & x) { return x.v.type == T::Callable; }},
    {"defined",     [](const TestCall & x) { return !x.v.is_undefined(); }},
    {"divisibleby", test_divisibleby},
    {"eq",          test_eq},
    {"equalto",     test_eq},
    {"escaped",     [](const TestCall &) { return false; }},
    {"even",        [](const TestCall & x) { return parity(x) == 0; }},
    {"false",       [](const TestCall & x) { return x.v.type == T::Bool && !x.v.b; }},
    {"filter",      [](const TestCall & x) { return x.v.is_string() && is_known_filter(x.v.s); }},
    {"float",       [](const TestCall & x) { return x.v.type == T::Float; }},
    {"ge",          test_ge},
    {"greaterthan", test_gt},
    {"gt",          test_gt},
    {"in",          [](const TestCall & x) { return contains(x.arg("seq"), x.v, x.line); }},
    {"integer",     [](const TestCall & x) { return x.v.type == T::Int; }},
    {"iterable",    [](const TestCall & x) { return x.v.is_string() || x.v.is_list() || x.v.is_dict() || x.v.is_undefined(); }},
    {"le",          test_le},
    {"lessthan",    test_lt},
    {"lower",       test_case},
    {"lt",          test_lt},
    {"mapping",     [](const TestCall & x) { return x.v.is_dict(); }},
    {"ne",          test_ne},
    {"none",        [](const TestCall & x) { return x.v.is_none(); }},
    {"number",      [](const TestCall & x) { return x.v.is_number(); }},
    {"odd",         [](const TestCall & x) { return parity(x) == 1; }},
    {"sameas",      test_sameas},
    {"sequence",    [](const TestCall & x) { return x.v.is_string() || x.v.is_list() || x.v.is_dict(); }},
    {"string",      [](const TestCall & x) { return x.v.is_string(); }},
    {"test",        [](const TestCall & x) { return x.v.is_string() && is_known_test(x.v.s); }},
    {"true",        [](const TestCall & x) { return x.v.type == T::Bool && x.v.b; }},
    {"undefined",   [](const TestCall & x) { return x.v.is_undefined(); }},
    {"upper",       test_case},
};

}  // namespace

bool is_known_filter(const std::string & name) { return find_named(kFilters, name) != nullptr; }
bool is_known_test(const std::string & name) { return find_named(kTests, name) != nullptr; }

Value apply_filter(const std::string & name, const Value & v, CallArgs & a, Context & ctx, int line) {
    const NamedFilter * filter = find_named(kFilters, name);
    if (!filter) template_error(line, "unknown filter '" + name + "'");
    return filter->fn(v, a, ctx, name, line);
}

bool apply_test(const std::string & name, const Value & v, CallArgs & a, Context & ctx, int line) {
    const NamedTest * test = find_named(kTests, name);
    if (!test) template_error(line, "unknown test '" + name + "'");
    return test->fn({v, a, ctx, name, line});
}

}  // namespace spark::jinja
