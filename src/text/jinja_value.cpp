#include "text/jinja_value.h"

#include "common/error.h"
#include "text/unicode.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>

namespace spark::jinja {

void template_error(int line, const std::string & message) {
    if (line > 0) fail(SPARK_ERR_TEMPLATE, "chat template line %d: %s", line, message.c_str());
    fail(SPARK_ERR_TEMPLATE, "chat template: %s", message.c_str());
}

void undefined_error(int line, const Value & v) {
    template_error(line, v.s.empty() ? std::string("value is undefined") : v.s);
}

// ------------------------------------------------------------------------------------------------
// Budget and shared objects

Budget::Budget(const RenderLimits & limits) : limits_(limits), previous_(current_) { current_ = this; }
Budget::~Budget() { current_ = previous_; }

void Budget::ensure_room(uint64_t count, uint64_t size) {
    if (!current_) return;
    uint64_t total;
    if (__builtin_mul_overflow(count, size, &total)) current_->out_of_memory();
    current_->ensure(total);
}

void Budget::out_of_steps() const {
    template_error(0, "the render exceeded its work budget of " + std::to_string(limits_.max_steps) +
                          " steps (loops, macro calls, or repeated work on large values)");
}

void Budget::out_of_memory() const {
    const uint64_t mib = uint64_t(1) << 20, n = limits_.max_bytes;
    const std::string size = n >= mib ? std::to_string((n + mib / 2) / mib) + " MiB" : std::to_string(n) + " bytes";
    template_error(0, "the render exceeded its memory budget of " + size +
                          " (strings, lists and dicts alive at once, and the output)");
}

namespace {
std::atomic<int64_t> g_live_shared_values{0};

struct PendingDeletes {
    bool                                           draining = false;
    std::vector<std::pair<void *, void (*)(void *)>> queue;
};
thread_local PendingDeletes t_pending;
}  // namespace

namespace detail {
void count_live(int64_t delta) { g_live_shared_values.fetch_add(delta, std::memory_order_relaxed); }

void deferred_delete(void * object, void (*destroy)(void *)) noexcept {
    count_live(-1);
    PendingDeletes & p = t_pending;
    if (p.draining) {
        p.queue.emplace_back(object, destroy);  // freed by the loop below, one frame up
        return;
    }
    p.draining = true;
    destroy(object);
    while (!p.queue.empty()) {
        const auto [next, fn] = p.queue.back();
        p.queue.pop_back();
        fn(next);
    }
    p.draining = false;
}
}  // namespace detail

int64_t live_shared_values() { return g_live_shared_values.load(std::memory_order_relaxed); }

// ------------------------------------------------------------------------------------------------
// Construction

Value::Value(const Value & o)
    : type(o.type), is_tuple(o.is_tuple), depth(o.depth), b(o.b), i(o.i), f(o.f), list(o.list), dict(o.dict),
      callable(o.callable) {
    charged_ = Budget::charge(o.s.size());
    s        = o.s;
}

Value::Value(Value && o) noexcept
    : type(o.type), is_tuple(o.is_tuple), depth(o.depth), b(o.b), i(o.i), f(o.f), s(std::move(o.s)),
      list(std::move(o.list)), dict(std::move(o.dict)), callable(std::move(o.callable)), charged_(o.charged_) {
    o.charged_ = 0;
}

Value & Value::operator=(const Value & o) {
    if (this != &o) *this = Value(o);
    return *this;
}

Value & Value::operator=(Value && o) noexcept {
    if (this == &o) return *this;
    Budget::refund(charged_);
    type       = o.type;
    is_tuple   = o.is_tuple;
    depth      = o.depth;
    b          = o.b;
    i          = o.i;
    f          = o.f;
    s          = std::move(o.s);
    list       = std::move(o.list);
    dict       = std::move(o.dict);
    callable   = std::move(o.callable);
    charged_   = o.charged_;
    o.charged_ = 0;
    return *this;
}

Value Value::undefined(std::string hint) {
    Value v;
    v.s = std::move(hint);
    return v;
}
Value Value::none() {
    Value v;
    v.type = Type::None;
    return v;
}
Value Value::boolean(bool x) {
    Value v;
    v.type = Type::Bool;
    v.b    = x;
    return v;
}
Value Value::integer(int64_t x) {
    Value v;
    v.type = Type::Int;
    v.i    = x;
    return v;
}
Value Value::number(double x) {
    Value v;
    v.type = Type::Float;
    v.f    = x;
    return v;
}
Value Value::string(std::string x) {
    Value v;
    v.type     = Type::String;
    v.charged_ = Budget::charge(x.size());
    v.s        = std::move(x);
    return v;
}
namespace {
constexpr uint16_t kMaxValueDepth = 200;

uint16_t nested_depth(const Value & child, uint16_t current) {
    const uint16_t d = std::max<uint16_t>(current, uint16_t(child.depth + 1));
    if (d > kMaxValueDepth) template_error(0, "value nested too deeply");
    return d;
}
}  // namespace

Value Value::list_of(List items, bool tuple) {
    Value v;
    v.depth = 1;
    for (const Value & item : items) v.depth = nested_depth(item, v.depth);
    Budget::steps(items.size());
    v.type     = Type::List;
    v.is_tuple = tuple;
    v.list     = make_shared_value<List>(Budget::charge(items.size() * sizeof(Value)), std::move(items));
    return v;
}
Value Value::dict_of(Dict d) {
    Value v;
    v.depth = 1;
    for (const auto & kv : d.items) v.depth = nested_depth(kv.second, nested_depth(kv.first, v.depth));
    Budget::steps(d.items.size());
    v.type = Type::Dict;
    v.dict = make_shared_value<Dict>(Budget::charge(d.items.size() * 2 * sizeof(Value)), std::move(d));
    return v;
}
Value Value::namespace_of(Dict d) {
    Value v = dict_of(std::move(d));
    v.type  = Type::Namespace;
    return v;
}
Value Value::function(std::string name, std::function<Value(CallArgs &, Context &)> fn) {
    Value v;
    v.type     = Type::Callable;
    v.callable = make_shared_value<Callable>(0, Callable{std::move(name), std::move(fn)});
    return v;
}

// Dicts are small in chat templates; lookups scan, and the scan is counted (a template building a
// huge dict key by key runs out of steps rather than into quadratic time): a step per equals() of
// two values, or per kKeysPerStep string keys compared with a name.
constexpr size_t kKeysPerStep = 4;

const Value * Dict::find(const Value & key) const {
    for (const auto & [k, v] : items)
        if (equals(k, key)) return &v;
    return nullptr;
}

const Value * Dict::find(std::string_view key) const {
    Budget::steps(items.size() / kKeysPerStep);
    for (const auto & [k, v] : items)
        if (k.type == Value::Type::String && k.s == key) return &v;
    return nullptr;
}

void Dict::set(Value key, Value value) {
    for (auto & [k, v] : items) {
        if (equals(k, key)) {
            v = std::move(value);
            return;
        }
    }
    items.emplace_back(std::move(key), std::move(value));
}

// ------------------------------------------------------------------------------------------------
// Python semantics

const char * type_name(const Value & v) {
    switch (v.type) {
        case Value::Type::Undefined: return "Undefined";
        case Value::Type::None: return "NoneType";
        case Value::Type::Bool: return "bool";
        case Value::Type::Int: return "int";
        case Value::Type::Float: return "float";
        case Value::Type::String: return "str";
        case Value::Type::List: return v.is_tuple ? "tuple" : "list";
        case Value::Type::Dict: return "dict";
        case Value::Type::Namespace: return "Namespace";
        case Value::Type::Callable: return "function";
    }
    return "object";
}

bool truthy(const Value & v) {
    switch (v.type) {
        case Value::Type::Undefined:
        case Value::Type::None: return false;
        case Value::Type::Bool: return v.b;
        case Value::Type::Int: return v.i != 0;
        case Value::Type::Float: return v.f != 0.0;
        case Value::Type::String: return !v.s.empty();
        case Value::Type::List: return !v.list->empty();
        case Value::Type::Dict: return !v.dict->items.empty();
        case Value::Type::Namespace:
        case Value::Type::Callable: return true;
    }
    return false;
}

std::string py_float_repr(double v) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
    if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
    char buf[64];
    const auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
    std::string sci(buf, res.ptr);  // shortest round-trip digits: "-1.2345e+02"
    std::string sign;
    if (sci[0] == '-') {
        sign = "-";
        sci.erase(0, 1);
    }
    const size_t e = sci.find('e');
    std::string digits = sci.substr(0, e);
    digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
    const int exp   = std::stoi(sci.substr(e + 1));
    const int decpt = exp + 1;  // value = 0.DIGITS * 10^decpt
    std::string out;
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            out = "0." + std::string(size_t(-decpt), '0') + digits;
        } else if (size_t(decpt) >= digits.size()) {
            out = digits + std::string(size_t(decpt) - digits.size(), '0') + ".0";
        } else {
            out = digits.substr(0, size_t(decpt)) + "." + digits.substr(size_t(decpt));
        }
    } else {
        out = digits.substr(0, 1);
        if (digits.size() > 1) out += "." + digits.substr(1);
        const int x = decpt - 1;
        char eb[16];
        std::snprintf(eb, sizeof eb, "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
        out += eb;
    }
    return sign + out;
}

namespace {
constexpr int kMaxNesting = 256;  // values nested deeper than this are not printed (stack safety)

struct NestingGuard {
    static thread_local int depth;
    NestingGuard() {
        if (depth >= kMaxNesting) template_error(0, "value nested too deeply");
        if (const Budget * b = Budget::current(); b && b->stack().exhausted())
            template_error(0, "value nested too deeply: printing it would use more than " +
                                  std::to_string(StackMeter::kMaxStackBytes >> 10) + " KiB of stack");
        ++depth;
    }
    ~NestingGuard() { --depth; }
};
thread_local int NestingGuard::depth = 0;

// Text built piece by piece (repr, tojson). Shared values make it grow faster than the values'
// memory ([x, x] where x = [y, y] ...): its growth is counted as work and checked against the
// memory budget as it happens.
void append_counted(std::string & out, std::string_view piece) {
    Budget::bulk(piece.size());
    Budget::ensure_room(out.size() + piece.size());
    out.append(piece);
}

// Escaping makes a string up to six times as long: the loops that escape check the output's size
// every kEscapeCheckBytes.
constexpr size_t kEscapeCheckBytes = 4096;

void repr_string(std::string & out, const std::string & s) {
    Budget::scan(s.size());
    Budget::ensure_room(out.size() + s.size() + 2);
    const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
    const char quote = has_single && !has_double ? '"' : '\'';
    out += quote;
    for (size_t i = 0; i < s.size(); ++i) {
        if (i % kEscapeCheckBytes == 0) Budget::ensure_room(out.size() + kEscapeCheckBytes * 4);
        const auto c = uint8_t(s[i]);
        if (c == uint8_t(quote) || c == '\\') {
            out += '\\';
            out += char(c);
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c < 0x20 || c == 0x7F) {
            char b[8];
            std::snprintf(b, sizeof b, "\\x%02x", unsigned(c));
            out += b;
        } else {
            out += char(c);
        }
    }
    out += quote;
}

void repr_into(std::string & out, const Value & v) {
    NestingGuard guard;
    Budget::steps(1);
    switch (v.type) {
        case Value::Type::String: repr_string(out, v.s); return;
        case Value::Type::List:
            append_counted(out, v.is_tuple ? "(" : "[");
            for (size_t k = 0; k < v.list->size(); ++k) {
                if (k) append_counted(out, ", ");
                repr_into(out, (*v.list)[k]);
            }
            if (v.is_tuple && v.list->size() == 1) append_counted(out, ",");
            append_counted(out, v.is_tuple ? ")" : "]");
            return;
        case Value::Type::Dict:
        case Value::Type::Namespace: {
            const bool ns = v.type == Value::Type::Namespace;
            append_counted(out, ns ? "<Namespace {" : "{");
            bool first = true;
            for (const auto & [k, val] : v.dict->items) {
                if (!first) append_counted(out, ", ");
                first = false;
                repr_into(out, k);
                append_counted(out, ": ");
                repr_into(out, val);
            }
            append_counted(out, ns ? "}>" : "}");
            return;
        }
        default: append_counted(out, to_str(v)); return;
    }
}

}  // namespace

std::string repr(const Value & v) {
    std::string out;
    repr_into(out, v);
    return out;
}

std::string to_str(const Value & v) {
    switch (v.type) {
        case Value::Type::Undefined: return "";
        case Value::Type::None: return "None";
        case Value::Type::Bool: return v.b ? "True" : "False";
        case Value::Type::Int: return std::to_string(v.i);
        case Value::Type::Float: return py_float_repr(v.f);
        case Value::Type::String: return v.s;
        case Value::Type::Callable: return "<function " + v.callable->name + ">";
        default: return repr(v);
    }
}

bool equals(const Value & a, const Value & b) {
    using T = Value::Type;
    Budget::steps(1);
    if (a.is_number() && b.is_number()) {
        if (a.type == T::Float || b.type == T::Float) return a.as_double() == b.as_double();
        return a.as_int() == b.as_int();
    }
    if (a.type != b.type) return false;
    switch (a.type) {
        case T::Undefined:
        case T::None: return true;
        case T::String:
            Budget::bulk(std::min(a.s.size(), b.s.size()));
            return a.s == b.s;
        case T::List:
            if (a.is_tuple != b.is_tuple || a.list->size() != b.list->size()) return false;
            for (size_t k = 0; k < a.list->size(); ++k)
                if (!equals((*a.list)[k], (*b.list)[k])) return false;
            return true;
        case T::Dict:
            if (a.dict->items.size() != b.dict->items.size()) return false;
            for (const auto & [k, v] : a.dict->items) {
                const Value * other = b.dict->find(k);
                if (!other || !equals(v, *other)) return false;
            }
            return true;
        case T::Namespace: return a.dict == b.dict;
        case T::Callable: return a.callable == b.callable;
        default: return false;
    }
}

int compare(const Value & a, const Value & b, int line) {
    using T = Value::Type;
    Budget::steps(1);
    if (a.is_number() && b.is_number()) {
        if (a.type == T::Float || b.type == T::Float) {
            const double x = a.as_double(), y = b.as_double();
            return x < y ? -1 : (x > y ? 1 : 0);
        }
        const int64_t x = a.as_int(), y = b.as_int();
        return x < y ? -1 : (x > y ? 1 : 0);
    }
    if (a.type == T::String && b.type == T::String) {
        Budget::bulk(std::min(a.s.size(), b.s.size()));
        const int c = a.s.compare(b.s);  // UTF-8 byte order is code point order
        return c < 0 ? -1 : (c > 0 ? 1 : 0);
    }
    if (a.type == T::List && b.type == T::List && a.is_tuple == b.is_tuple) {
        const size_t n = std::min(a.list->size(), b.list->size());
        for (size_t k = 0; k < n; ++k) {
            if (equals((*a.list)[k], (*b.list)[k])) continue;
            return compare((*a.list)[k], (*b.list)[k], line);
        }
        return a.list->size() < b.list->size() ? -1 : (a.list->size() > b.list->size() ? 1 : 0);
    }
    template_error(line, std::string("'<' not supported between instances of '") + type_name(a) + "' and '" +
                             type_name(b) + "'");
}

Value from_json(const nlohmann::ordered_json & j) {
    NestingGuard guard;
    using J = nlohmann::ordered_json::value_t;
    switch (j.type()) {
        case J::null: return Value::none();
        case J::boolean: return Value::boolean(j.get<bool>());
        case J::number_integer: return Value::integer(j.get<int64_t>());
        case J::number_unsigned: {
            const uint64_t u = j.get<uint64_t>();
            return u <= uint64_t(INT64_MAX) ? Value::integer(int64_t(u)) : Value::number(double(u));
        }
        case J::number_float: return Value::number(j.get<double>());
        case J::string: return Value::string(j.get<std::string>());
        case J::array: {
            List items;
            items.reserve(j.size());
            for (const auto & e : j) items.push_back(from_json(e));
            return Value::list_of(std::move(items));
        }
        case J::object: {
            Dict d;
            for (auto it = j.begin(); it != j.end(); ++it) d.set(Value::string(it.key()), from_json(it.value()));
            return Value::dict_of(std::move(d));
        }
        default: return Value::none();
    }
}

// ------------------------------------------------------------------------------------------------
// json.dumps

namespace {

void json_string(std::string & out, const std::string & s, bool ensure_ascii) {
    Budget::scan(s.size());
    Budget::ensure_room(out.size() + s.size());
    out += '"';
    for (size_t i = 0, next_check = 0; i < s.size();) {
        if (i >= next_check) {
            Budget::ensure_room(out.size() + kEscapeCheckBytes * 6);
            next_check = i + kEscapeCheckBytes;
        }
        const auto c = uint8_t(s[i]);
        switch (c) {
            case '"': out += "\\\""; ++i; continue;
            case '\\': out += "\\\\"; ++i; continue;
            case '\n': out += "\\n"; ++i; continue;
            case '\r': out += "\\r"; ++i; continue;
            case '\t': out += "\\t"; ++i; continue;
            case '\b': out += "\\b"; ++i; continue;
            case '\f': out += "\\f"; ++i; continue;
            default: break;
        }
        char b[16];
        if (c < 0x20 || (ensure_ascii && c == 0x7F)) {
            std::snprintf(b, sizeof b, "\\u%04x", unsigned(c));
            out += b;
            ++i;
        } else if (c < 0x80 || !ensure_ascii) {
            out += char(c);
            ++i;
        } else {
            const uint32_t cp = unicode::next_codepoint(s, i);
            if (cp >= 0x10000) {
                const uint32_t v = cp - 0x10000;
                std::snprintf(b, sizeof b, "\\u%04x\\u%04x", unsigned(0xD800 + (v >> 10)), unsigned(0xDC00 + (v & 0x3FF)));
            } else {
                std::snprintf(b, sizeof b, "\\u%04x", unsigned(cp));
            }
            out += b;
        }
    }
    out += '"';
}

std::string json_float(double v) {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v < 0 ? "-Infinity" : "Infinity";
    return py_float_repr(v);
}

void json_value(std::string & out, const Value & v, const JsonOptions & o, int level, int line) {
    if (level > 256) template_error(line, "value nested too deeply for tojson");
    Budget::steps(1);
    // The output is checked against the memory budget as it grows: indents multiply with the depth,
    // and shared values make it grow faster than the values' memory.
    auto newline_indent = [&](int lvl) {
        const uint64_t unit_size = o.use_indent_str ? o.indent_str.size() : uint64_t(o.indent);
        Budget::ensure_room(uint64_t(lvl), unit_size);  // lvl * unit_size cannot overflow below
        append_counted(out, "\n");
        Budget::bulk(uint64_t(lvl) * unit_size);
        Budget::ensure_room(out.size() + uint64_t(lvl) * unit_size);
        if (o.use_indent_str)
            for (int k = 0; k < lvl; ++k) out += o.indent_str;
        else
            out.append(size_t(lvl) * size_t(o.indent), ' ');
    };
    auto append_sep = [&](const std::string & sep) { append_counted(out, sep); };
    const bool indented = o.use_indent_str || o.indent >= 0;
    switch (v.type) {
        case Value::Type::None: out += "null"; return;
        case Value::Type::Bool: out += v.b ? "true" : "false"; return;
        case Value::Type::Int: out += std::to_string(v.i); return;
        case Value::Type::Float: out += json_float(v.f); return;
        case Value::Type::String: json_string(out, v.s, o.ensure_ascii); return;
        case Value::Type::List: {
            if (v.list->empty()) {
                out += "[]";
                return;
            }
            out += '[';
            if (indented) newline_indent(level + 1);
            for (size_t k = 0; k < v.list->size(); ++k) {
                if (k) {
                    append_sep(o.item_sep);
                    if (indented) newline_indent(level + 1);
                }
                json_value(out, (*v.list)[k], o, level + 1, line);
            }
            if (indented) newline_indent(level);
            out += ']';
            return;
        }
        case Value::Type::Dict: {
            if (v.dict->items.empty()) {
                out += "{}";
                return;
            }
            std::vector<const std::pair<Value, Value> *> items;
            for (const auto & kv : v.dict->items) items.push_back(&kv);
            if (o.sort_keys)
                std::stable_sort(items.begin(), items.end(),
                                 [&](auto * a, auto * b) { return compare(a->first, b->first, line) < 0; });
            out += '{';
            if (indented) newline_indent(level + 1);
            bool first = true;
            for (const auto * kv : items) {
                if (!first) {
                    append_sep(o.item_sep);
                    if (indented) newline_indent(level + 1);
                }
                first = false;
                const Value & k = kv->first;
                switch (k.type) {
                    case Value::Type::String: json_string(out, k.s, o.ensure_ascii); break;
                    case Value::Type::Int: out += '"' + std::to_string(k.i) + '"'; break;
                    case Value::Type::Float: out += '"' + json_float(k.f) + '"'; break;
                    case Value::Type::Bool: out += k.b ? "\"true\"" : "\"false\""; break;
                    case Value::Type::None: out += "\"null\""; break;
                    default:
                        template_error(line, std::string("keys must be str, int, float, bool or None, not ") + type_name(k));
                }
                append_sep(o.key_sep);
                json_value(out, kv->second, o, level + 1, line);
            }
            if (indented) newline_indent(level);
            out += '}';
            return;
        }
        default:
            template_error(line, std::string("Object of type ") + type_name(v) + " is not JSON serializable");
    }
}

}  // namespace

std::string to_json(const Value & v, const JsonOptions & options, int line) {
    std::string out;
    json_value(out, v, options, 0, line);
    return out;
}

// ------------------------------------------------------------------------------------------------
// Argument binding and iteration

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

int64_t length_of(const Value & v, int line) {
    switch (v.type) {
        case Value::Type::Undefined: return 0;
        case Value::Type::String: Budget::bulk(v.s.size()); return int64_t(unicode::count_codepoints(v.s));
        case Value::Type::List: return int64_t(v.list->size());
        case Value::Type::Dict: return int64_t(v.dict->items.size());
        default: template_error(line, "object of type '" + std::string(type_name(v)) + "' has no len()");
    }
}

}  // namespace spark::jinja
