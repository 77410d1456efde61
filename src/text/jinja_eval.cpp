// Evaluator of the Jinja syntax tree with jinja2's semantics as transformers configures it
// (ImmutableSandboxedEnvironment, default Undefined, loopcontrols, its own tojson/raise_exception/
// strftime_now/namespace/dict): statements, expressions, scopes, loops, macros, globals. Python
// behaviour is reproduced where templates depend on it: the values' in jinja_value.cpp, str's in
// jinja_str.cpp; the filters and tests are jinja_filters.cpp.
#include "text/jinja_eval.h"

#include "text/jinja_ast.h"
#include "text/jinja_filters.h"
#include "text/jinja_str.h"

#include <algorithm>
#include <cmath>
#include <ctime>

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

std::string object_name(const Value & v) { return std::string(type_name(v)) + " object"; }

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

}  // namespace

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
// Attributes, items and methods

namespace {

// ---- methods of the Python objects that templates call: str (jinja_str.cpp), dict, list

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
    static const char * const kDictMethods[] = {"items", "keys", "values", "get"};
    static const char * const kListMethods[] = {"index", "count"};
    auto listed = [&](const auto & names) {
        return std::any_of(std::begin(names), std::end(names), [&](const char * n) { return name == n; });
    };
    if (obj.is_string()) return is_str_method(name) ? str_method : nullptr;
    if (obj.is_dict()) return listed(kDictMethods) ? dict_method : nullptr;
    if (obj.is_list()) return listed(kListMethods) ? list_method : nullptr;
    return nullptr;
}

}  // namespace

// obj.name as a value: a bound method, or undefined.
Value bound_method(const Value & obj, const std::string & name, int) {
    if (const Method fn = find_method(obj, name)) {
        Value self = obj;
        return Value::function(name, [self, fn, name](CallArgs & a, Context &) -> Value { return fn(self, a, name); });
    }
    if (obj.is_string()) return Value::undefined("'str object' has no attribute '" + name + "'");
    if (obj.is_dict()) return Value::undefined();
    return Value::undefined("'" + object_name(obj) + "' has no attribute '" + name + "'");
}

Value get_attr(const Value & obj, const std::string & name, int line) {
    switch (obj.type) {
        case Value::Type::Undefined: undefined_error(line, obj);
        case Value::Type::Dict: {
            // jinja2 tries Python attributes first (dict methods), then the item.
            Value m = bound_method(obj, name, line);
            if (!m.is_undefined()) return m;
            if (const Value * v = obj.dict->find(name)) return *v;
            return Value::undefined("'dict object' has no attribute '" + name + "'");
        }
        case Value::Type::Namespace: {
            if (const Value * v = obj.dict->find(name)) return *v;
            return Value::undefined("'Namespace object' has no attribute '" + name + "'");
        }
        default: return bound_method(obj, name, line);
    }
}

Value get_item(const Value & obj, const Value & key, int line) {
    switch (obj.type) {
        case Value::Type::Undefined: undefined_error(line, obj);
        case Value::Type::Dict:
            if (const Value * v = obj.dict->find(key)) return *v;
            if (key.is_string()) {
                Value m = bound_method(obj, key.s, line);
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

// ------------------------------------------------------------------------------------------------
// Evaluator

namespace {

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
    if (obj.is_string()) return Value::string(slice_string(obj.s, parts[0], parts[1], parts[2], e.line));
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

}  // namespace

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
