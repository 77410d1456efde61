// Values of the Jinja interpreter, with Python semantics (what jinja2 does on top of Python):
// str()/repr() formatting, ==, ordering, truthiness, json.dumps, iter(), len(), and how builtins
// bind their arguments.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace spark::jinja {

struct Value;
struct CallArgs;
class Context;

using List = std::vector<Value>;

// ------------------------------------------------------------------------------------------------
// Limits of one render. Chat templates come with downloaded models and run inside host processes:
// whatever a template does, a render must end quickly with SPARK_ERR_TEMPLATE rather than hang,
// exhaust memory or overflow the stack. docs/RELIABILITY.md ("Chat templates") gives the figures
// behind the defaults.
struct RenderLimits {
    // Units of work (see Budget): at most ~30 ns each, so a runaway render stops within ~0.3 s.
    // Real templates use about one step per byte of their inputs (Qwen3's: ~830 per message of
    // ~700 bytes): this alone renders ~12,000 such messages, and render_chat_template adds room
    // in proportion to the inputs.
    uint64_t max_steps = 10'000'000;
    // Bytes of strings and of list/dict slots alive at once, copies included, and of the output.
    // 16 times the text of a 1M-token conversation (~4 MB), and small enough that filling it takes a
    // fraction of a second. render_chat_template adds room in proportion to the inputs.
    uint64_t max_bytes = uint64_t(64) << 20;
    // Nesting of blocks, expressions and macro calls while rendering (the parser allows 256 levels
    // of nesting in the template text; real templates nest fewer than 20).
    int max_depth = 256;
};

// Stack used by the parser or the evaluator since construction. Whatever the build (-O0 and
// sanitizers make frames several times larger), they stop before using kMaxStackBytes: hosts often
// run them on threads with small stacks (512 KiB on macOS).
class StackMeter {
public:
    static constexpr size_t kMaxStackBytes = size_t(256) << 10;

    StackMeter() : base_(static_cast<const char *>(__builtin_frame_address(0))) {}
    size_t used() const {
        const char * here = static_cast<const char *>(__builtin_frame_address(0));
        return size_t(here < base_ ? base_ - here : here - base_);
    }
    bool exhausted() const { return used() > kMaxStackBytes; }

private:
    const char * base_;
};

// The budget of the render running on this thread (none outside renders: nothing is counted then).
// Every operation counts its work where it happens, in proportion to the data it touches, so that
// a step costs at most a few tens of nanoseconds whatever the template does: one step per
// expression or statement evaluated and per value copied, compared or allocated; one per
// kScanBytesPerStep bytes of text processed character by character, one per kCopyBytesPerStep
// bytes copied in bulk. Values charge the memory budget where they copy strings or allocate list
// and dict slots, and refund it when they are destroyed.
class Budget {
public:
    explicit Budget(const RenderLimits & limits);  // becomes the thread's budget until destroyed
    ~Budget();
    Budget(const Budget &)             = delete;
    Budget & operator=(const Budget &) = delete;

    // A step is meant to cost at most ~30 ns. Character by character work (decoding, escaping,
    // substring search on hostile text: 1-6 ns per byte) counts a step per kScanBytesPerStep
    // bytes; memcpy, memcmp and writing fresh memory (page faults included: 2-20 bytes per ns) a
    // step per kCopyBytesPerStep bytes.
    static constexpr uint64_t kScanBytesPerStep = 4;
    static constexpr uint64_t kCopyBytesPerStep = 64;

    static Budget * current() { return current_; }

    // Counts `n` units of work.
    static void steps(uint64_t n) {
        if (current_ && (current_->steps_ += n) > current_->limits_.max_steps) current_->out_of_steps();
    }
    // Counts work on `n` bytes of text, character by character.
    static void scan(uint64_t n) { steps(n / kScanBytesPerStep); }
    // Counts `n` bytes of text copied or searched in bulk.
    static void bulk(uint64_t n) { steps(n / kCopyBytesPerStep); }
    // Counts `n` bytes that stay allocated until refund(), as memory, and as work (they are
    // written, and fresh memory costs page faults); returns what was counted (0 outside a render).
    static uint64_t charge(uint64_t n) {
        if (!current_ || n == 0) return 0;
        current_->ensure(n);
        bulk(n);
        current_->bytes_ += n;
        return n;
    }
    static void refund(uint64_t n) {
        if (current_) current_->bytes_ -= std::min(n, current_->bytes_);
    }
    // Throws unless `n` more bytes fit (checked before building a large string or list).
    static void ensure_room(uint64_t n) {
        if (current_) current_->ensure(n);
    }
    // ensure_room for `count` items of `size` bytes, without overflowing.
    static void ensure_room(uint64_t count, uint64_t size);

    const StackMeter & stack() const { return stack_; }  // from the start of the render

private:
    void ensure(uint64_t n) {
        if (n > limits_.max_bytes || bytes_ > limits_.max_bytes - n) out_of_memory();
    }
    [[noreturn]] void out_of_steps() const;
    [[noreturn]] void out_of_memory() const;

    RenderLimits    limits_;
    StackMeter      stack_;
    uint64_t        steps_ = 0, bytes_ = 0;
    Budget *        previous_;
    static inline thread_local Budget * current_ = nullptr;
};

// Lists, dicts, namespaces, closures and scopes are shared and can form long chains (a namespace
// holding a namespace holding ...). Their deleter queues the deletions it triggers instead of
// recursing, so freeing a chain of any length takes constant stack. Live ones are counted (tests
// check that renders free everything). `charged` bytes are refunded to the budget on deletion.
namespace detail {
void count_live(int64_t delta);
void deferred_delete(void * object, void (*destroy)(void *)) noexcept;
}  // namespace detail

template <typename T, typename... Args> std::shared_ptr<T> make_shared_value(uint64_t charged, Args &&... args) {
    Budget::steps(1);
    T * raw = new T(std::forward<Args>(args)...);
    detail::count_live(1);
    return std::shared_ptr<T>(raw, [charged](T * p) {
        Budget::refund(charged);
        detail::deferred_delete(p, [](void * q) { delete static_cast<T *>(q); });
    });
}

// Objects made by make_shared_value and not yet freed (all threads).
int64_t live_shared_values();

// Dicts keep insertion order (Python 3.7+), which tojson must reproduce.
struct Dict {
    std::vector<std::pair<Value, Value>> items;
    const Value * find(const Value & key) const;
    const Value * find(std::string_view key) const;
    void          set(Value key, Value value);
};

// Builtins, macros and bound methods.
struct Callable {
    std::string                                   name;
    std::function<Value(CallArgs &, Context &)> fn;
};

struct Value {
    enum class Type : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

    Type    type     = Type::Undefined;
    bool    is_tuple = false;  // a List written as a tuple (repr "(a, b)"; not equal to a list)
    uint16_t depth   = 0;      // nesting depth of lists/dicts, bounded so that recursion stays shallow
    bool    b        = false;
    int64_t i        = 0;
    double  f        = 0;
    std::string s;  // String; for Undefined: what was undefined (for error messages)
    std::shared_ptr<List>     list;
    std::shared_ptr<Dict>     dict;  // Dict and Namespace (a namespace is mutable and shared)
    std::shared_ptr<Callable> callable;

    // Strings are copied with their Value: a copy made during a render counts as work, and against
    // its memory budget until the Value is destroyed.
    Value() = default;
    Value(const Value & other);
    Value(Value && other) noexcept;
    Value & operator=(const Value & other);
    Value & operator=(Value && other) noexcept;
    ~Value() { Budget::refund(charged_); }

    static Value undefined(std::string hint = {});
    static Value none();
    static Value boolean(bool v);
    static Value integer(int64_t v);
    static Value number(double v);
    static Value string(std::string v);
    static Value list_of(List items, bool tuple = false);
    static Value dict_of(Dict d);
    static Value namespace_of(Dict d);
    static Value function(std::string name, std::function<Value(CallArgs &, Context &)> fn);

    // Appends to a string (an operand being built: a ~ b ~ c ... costs the length of the result).
    void append(std::string_view piece) {
        charged_ += Budget::charge(piece.size());
        s.append(piece);
    }

    bool is_undefined() const { return type == Type::Undefined; }
    bool is_none() const { return type == Type::None; }
    bool is_string() const { return type == Type::String; }
    bool is_list() const { return type == Type::List; }
    bool is_dict() const { return type == Type::Dict; }
    bool is_number() const { return type == Type::Int || type == Type::Float || type == Type::Bool; }
    bool is_integer() const { return type == Type::Int || type == Type::Bool; }
    int64_t as_int() const { return type == Type::Bool ? int64_t(b) : i; }
    double  as_double() const { return type == Type::Float ? f : double(as_int()); }

private:
    uint64_t charged_ = 0;  // bytes of `s` counted by the render budget
};

struct CallArgs {
    std::vector<Value>                         positional;
    std::vector<std::pair<std::string, Value>> keyword;
    int                                        line = 0;
};

// Python's type name of a value ("str", "int", "dict", "NoneType", ...), for error messages.
const char * type_name(const Value & v);
bool         truthy(const Value & v);
// str(v) as jinja2 renders it ({{ v }}): Undefined -> "", None -> "None", lists as Python repr.
std::string to_str(const Value & v);
std::string repr(const Value & v);
std::string py_float_repr(double v);
bool        equals(const Value & a, const Value & b);
// -1/0/1 for Python ordering; throws a TemplateError-style spark::Error for unorderable types.
int compare(const Value & a, const Value & b, int line);

Value from_json(const nlohmann::ordered_json & j);

struct JsonOptions {
    int64_t     indent = -1;  // -1: None
    std::string indent_str;   // used when indent was given as a string
    bool        use_indent_str = false;
    bool        ensure_ascii   = false;
    bool        sort_keys      = false;
    std::string item_sep = ", ", key_sep = ": ";
};
// json.dumps(v, ...) exactly as Python formats it. Throws for values JSON cannot hold.
std::string to_json(const Value & v, const JsonOptions & options, int line);

// Throws spark::Error(SPARK_ERR_TEMPLATE) with the line number.
[[noreturn]] void template_error(int line, const std::string & message);
// The error for using an undefined value: what was undefined, as Value::undefined recorded it.
[[noreturn]] void undefined_error(int line, const Value & v);

// ------------------------------------------------------------------------------------------------
// Python call and iteration semantics, for the builtins (str methods, filters, tests, globals).

// A call's arguments bound to the parameters `names` (positional, then by keyword); nullptr for
// those not given. Too many, unknown or repeated arguments are errors, worded as Python's.
std::vector<const Value *> bind(const CallArgs & a, std::initializer_list<const char *> names, std::string_view fname,
                                int line);
const Value &       require(const Value * v, const char * what, std::string_view fname, int line);
const std::string & require_string(const Value & v, const std::string & what, int line);
int64_t             require_int(const Value & v, const std::string & what, int line);

// Items of an iterable, as Python's iter(): list items, dict keys, characters.
List iterate(const Value & v, int line);
// Python's len().
int64_t length_of(const Value & v, int line);

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

}  // namespace spark::jinja
