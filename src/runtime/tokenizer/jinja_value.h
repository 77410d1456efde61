// Values of the Jinja interpreter, with Python semantics (what jinja2 does on top of Python):
// str()/repr() formatting, ==, ordering, truthiness, json.dumps.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
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

    bool is_undefined() const { return type == Type::Undefined; }
    bool is_none() const { return type == Type::None; }
    bool is_string() const { return type == Type::String; }
    bool is_list() const { return type == Type::List; }
    bool is_dict() const { return type == Type::Dict; }
    bool is_number() const { return type == Type::Int || type == Type::Float || type == Type::Bool; }
    bool is_integer() const { return type == Type::Int || type == Type::Bool; }
    int64_t as_int() const { return type == Type::Bool ? int64_t(b) : i; }
    double  as_double() const { return type == Type::Float ? f : double(as_int()); }
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
    int         indent = -1;  // -1: None
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

}  // namespace spark::jinja
