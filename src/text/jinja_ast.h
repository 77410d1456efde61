// Syntax tree of the Jinja subset chat templates use, the parser that builds it (jinja_parser.cpp,
// following jinja2's parser.py precedence) and the evaluator that renders it (jinja_eval.cpp, with
// Python's str in jinja_str.cpp and the filters and tests in jinja_filters.cpp).
#pragma once

#include "text/jinja_value.h"

#include <memory>
#include <string>
#include <vector>

namespace spark::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
    enum Kind {
        Literal,   // value
        Name,      // name
        ListLit,   // args = items
        TupleLit,  // args = items
        DictLit,   // args = key0, value0, key1, value1, ...
        GetAttr,   // args[0] . name
        GetItem,   // args[0] [ args[1] ]
        Slice,     // args[0] [ args[1] : args[2] : args[3] ]  (null parts allowed)
        Call,      // args[0] ( args[1..], kwargs )
        Filter,    // args[0] | name ( args[1..], kwargs ); args[0] is null inside {% filter %} / {% set %} blocks
        Test,      // args[0] is [not] name ( args[1..], kwargs )
        Not,       // not args[0]
        Neg,       // -args[0]
        Pos,       // +args[0]
        Binary,    // args[0] name args[1]: + - * / // % ** ~
        And,       // args[0] and args[1]
        Or,        // args[0] or args[1]
        Compare,   // args[0] ops[0] args[1] ops[1] args[2] ...  (==, !=, <, <=, >, >=, in, notin)
        Cond,      // args[0] if args[1] else args[2]  (args[2] may be null)
    };
    Kind                                         kind;
    int                                          line = 0;
    std::unique_ptr<const Value>                 value;  // Literal (a pointer: most nodes have none)
    std::string                                  name;
    std::vector<ExprPtr>                         args;
    std::vector<std::pair<std::string, ExprPtr>> kwargs;
    std::vector<std::string>                     ops;
    bool                                         negated = false;

    Expr() = default;
    Expr(const Expr &)             = delete;
    Expr & operator=(const Expr &) = delete;
    ~Expr();  // iterative: expression trees can be as deep as a template is long
};

// The parser's nesting limit (statements, brackets, arguments, else branches).
constexpr int kMaxParseDepth = 256;
// Memory of the tokens and syntax tree of one template: a template takes up to ~150 times its
// size (a token and a node of ~200 bytes for every two characters of "1+1+1..."); real chat
// templates (a few KB) take well under 1 MiB.
constexpr size_t kMaxParseBytes = size_t(64) << 20;
[[noreturn]] void parse_too_large(int line);

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body    = std::vector<NodePtr>;

struct Node {
    enum Kind {
        Text,         // text
        Output,       // {{ expr }}
        If,           // conds[i] -> bodies[i]; bodies.size() == conds.size() + 1 when there is an else
        For,          // for targets in expr [if cond] ... [else ...]
        Set,          // set targets = expr; or set targets[0].attr = expr (namespace attribute)
        SetBlock,     // set targets[0] | filters ... endset
        Macro,        // macro name(targets with defaults) body
        CallBlock,    // call(targets) expr ... endcall
        FilterBlock,  // filter filters ... endfilter
        With,         // with targets = defaults ... endwith
        Break,
        Continue,
        Generation,   // {% generation %} (transformers' assistant tracker): renders its body
    };
    Kind                     kind;
    int                      line = 0;
    std::string              text;  // Text; Macro: name; Set: namespace attribute ("" otherwise)
    ExprPtr                  expr;
    ExprPtr                  cond;  // For: the "if" filter
    std::vector<ExprPtr>     conds;
    std::vector<Body>        bodies;
    std::vector<std::string> targets;
    std::vector<ExprPtr>     defaults;  // Macro/CallBlock parameter defaults (null: none); With values
    std::vector<ExprPtr>     filters;   // SetBlock/FilterBlock
    Body                     body, else_body;
    // For: the body mentions the name `loop` (most loops do not: they skip building it).
    bool uses_loop = false;
};

// A parsed template. Parsing checks filter and test names (as jinja2 does at compile time).
struct Template {
    Body body;
};

// Throws spark::Error(SPARK_ERR_TEMPLATE) with the line for syntax errors and unknown constructs.
std::shared_ptr<const Template> parse_template(const std::string & source);

// Renders with the given top-level variables. Throws SPARK_ERR_TEMPLATE on evaluation errors and
// when the template exceeds one of the limits.
std::string render(const Template & tmpl, const Dict & variables, const RenderLimits & limits = {});

}  // namespace spark::jinja
