// Recursive-descent parser for the Jinja subset, with jinja2's operator precedence (parser.py):
// condexpr < or < and < not < compare < +,- < ~ < *,/,//,% < ** < unary < primary/postfix/filters.
#include "text/jinja_ast.h"
#include "text/jinja_filters.h"
#include "text/jinja_lexer.h"

#include <set>
#include <string>

namespace spark::jinja {

namespace {

class Parser {
public:
    explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {
        for (const Token & t : t_) bytes_ += sizeof(Token) + t.text.size();
    }

    Body parse_all() {
        std::string end;
        Body body = parse_body({}, end);
        return body;
    }

private:
    // ---- token helpers
    const Token & cur() const { return t_[p_]; }
    const Token & peek(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
    bool is_op(const char * op) const { return cur().kind == Token::Op && cur().text == op; }
    bool is_name(const char * n) const { return cur().kind == Token::Name && cur().text == n; }
    Token next() { return t_[p_ < t_.size() - 1 ? p_++ : p_]; }

    [[noreturn]] void error(const std::string & msg) const { template_error(cur().line, msg); }

    std::string describe(const Token & t) const {
        switch (t.kind) {
            case Token::End: return "end of template";
            case Token::BlockEnd: return "end of statement block";
            case Token::VarEnd: return "end of print statement";
            case Token::String: return "string";
            case Token::Int:
            case Token::Float: return "number";
            default: return "'" + t.text + "'";
        }
    }

    void expect_op(const char * op) {
        if (!is_op(op)) error(std::string("expected '") + op + "', got " + describe(cur()));
        next();
    }
    std::string expect_name() {
        if (cur().kind != Token::Name) error("expected a name, got " + describe(cur()));
        return next().text;
    }
    void expect_block_end() {
        if (cur().kind != Token::BlockEnd) error("expected end of statement block, got " + describe(cur()));
        next();
    }

    // Nodes count against the parse budget (kMaxParseBytes), with the tokens.
    void count(size_t bytes) {
        bytes_ += bytes;
        if (bytes_ > kMaxParseBytes) parse_too_large(cur().line);
    }
    NodePtr make_node(int line) {
        count(sizeof(Node));
        auto n  = std::make_unique<Node>();
        n->line = line;
        return n;
    }

    ExprPtr make(Expr::Kind kind, int line) {
        count(sizeof(Expr));
        auto e  = std::make_unique<Expr>();
        e->kind = kind;
        e->line = line;
        return e;
    }
    ExprPtr literal(Value v, int line) {
        count(sizeof(Value) + v.s.size());
        auto e   = make(Expr::Literal, line);
        e->value = std::make_unique<const Value>(std::move(v));
        return e;
    }

    // ---- statements

    // Parses nodes until one of `ends` ({% name %}), which is consumed up to its name; `found` is
    // set to the end tag that stopped it. At top level (ends empty) it runs to the end.
    Body parse_body(const std::set<std::string> & ends, std::string & found) {
        Body body;
        while (true) {
            const Token & tok = cur();
            if (tok.kind == Token::End) {
                if (!ends.empty()) {
                    std::string names;
                    for (const auto & e : ends) names += (names.empty() ? "'" : " or '") + e + "'";
                    error("unexpected end of template, expected " + names);
                }
                return body;
            }
            if (tok.kind == Token::Text) {
                auto n  = make_node(tok.line);
                n->kind = Node::Text;
                n->text = tok.text;
                body.push_back(std::move(n));
                next();
            } else if (tok.kind == Token::VarBegin) {
                next();
                auto n  = make_node(tok.line);
                n->kind = Node::Output;
                n->expr = parse_tuple(true);
                if (cur().kind != Token::VarEnd) error("expected end of print statement, got " + describe(cur()));
                next();
                body.push_back(std::move(n));
            } else if (tok.kind == Token::BlockBegin) {
                next();
                if (cur().kind != Token::Name) error("expected a statement name, got " + describe(cur()));
                const std::string name = cur().text;
                if (ends.count(name)) {
                    next();
                    found = name;
                    return body;
                }
                body.push_back(parse_statement());
            } else {
                error("unexpected " + describe(tok));
            }
        }
    }

    NodePtr parse_statement() {
        DepthGuard guard(*this);
        const Token tok  = next();
        const std::string & name = tok.text;
        auto n = make_node(tok.line);
        std::string end;
        if (name == "if") {
            n->kind = Node::If;
            n->conds.push_back(parse_tuple(false));
            expect_block_end();
            while (true) {
                n->bodies.push_back(parse_body({"elif", "else", "endif"}, end));
                if (end == "elif") {
                    n->conds.push_back(parse_tuple(false));
                    expect_block_end();
                } else if (end == "else") {
                    expect_block_end();
                    n->bodies.push_back(parse_body({"endif"}, end));
                    break;
                } else {
                    break;
                }
            }
            expect_block_end();
        } else if (name == "for") {
            n->kind    = Node::For;
            n->targets = parse_targets();
            if (!is_name("in")) error("expected 'in' in for loop, got " + describe(cur()));
            next();
            n->expr = parse_tuple(false);
            if (is_name("if")) {
                next();
                n->cond = parse_expression(true);
            }
            if (is_name("recursive")) error("recursive for loops are not supported");
            expect_block_end();
            ++loop_depth_;
            const bool outer_saw_loop = saw_loop_name_;
            saw_loop_name_            = false;
            n->body                   = parse_body({"endfor", "else"}, end);
            n->uses_loop              = saw_loop_name_;
            saw_loop_name_            = outer_saw_loop || saw_loop_name_;
            --loop_depth_;
            if (end == "else") {
                expect_block_end();
                n->else_body = parse_body({"endfor"}, end);
            }
            expect_block_end();
        } else if (name == "set") {
            // set a = ..., set a, b = ..., set ns.attr = ..., or a block: set a | filter ... endset
            const std::string first = expect_name();
            if (is_op(".")) {
                next();
                n->kind    = Node::Set;
                n->targets = {first};
                n->text    = expect_name();
                expect_op("=");
                n->expr = parse_tuple(true);
                expect_block_end();
            } else {
                n->targets = {first};
                while (is_op(",")) {
                    next();
                    n->targets.push_back(expect_name());
                }
                if (is_op("=")) {
                    next();
                    n->kind = Node::Set;
                    n->expr = parse_tuple(true);
                    expect_block_end();
                } else {
                    if (n->targets.size() != 1) error("a block set needs a single target");
                    n->kind = Node::SetBlock;
                    while (is_op("|")) n->filters.push_back(parse_filter(nullptr));
                    expect_block_end();
                    n->body = parse_body({"endset"}, end);
                    expect_block_end();
                }
            }
        } else if (name == "macro") {
            n->kind = Node::Macro;
            n->text = expect_name();
            parse_signature(*n);
            expect_block_end();
            const int saved = loop_depth_;
            loop_depth_     = 0;
            n->body         = parse_body({"endmacro"}, end);
            loop_depth_     = saved;
            expect_block_end();
        } else if (name == "call") {
            n->kind = Node::CallBlock;
            if (is_op("(")) parse_signature(*n);
            n->expr = parse_expression(true);
            if (n->expr->kind != Expr::Call) error("expected a call after 'call'");
            expect_block_end();
            n->body = parse_body({"endcall"}, end);
            expect_block_end();
        } else if (name == "filter") {
            n->kind = Node::FilterBlock;
            n->filters.push_back(parse_filter(nullptr, /*leading_pipe=*/false));
            while (is_op("|")) n->filters.push_back(parse_filter(nullptr));
            expect_block_end();
            n->body = parse_body({"endfilter"}, end);
            expect_block_end();
        } else if (name == "with") {
            n->kind = Node::With;
            while (cur().kind != Token::BlockEnd) {
                if (!n->targets.empty()) expect_op(",");
                n->targets.push_back(expect_name());
                expect_op("=");
                n->defaults.push_back(parse_expression(true));
            }
            expect_block_end();
            n->body = parse_body({"endwith"}, end);
            expect_block_end();
        } else if (name == "generation") {
            n->kind = Node::Generation;
            expect_block_end();
            n->body = parse_body({"endgeneration"}, end);
            expect_block_end();
        } else if (name == "break" || name == "continue") {
            if (loop_depth_ == 0) template_error(tok.line, "'" + name + "' outside of a loop");
            n->kind = name == "break" ? Node::Break : Node::Continue;
            expect_block_end();
        } else {
            static const std::set<std::string> kEndTags = {"endif", "endfor", "else", "elif", "endset", "endmacro",
                                                           "endcall", "endfilter", "endwith", "endgeneration"};
            if (kEndTags.count(name)) template_error(tok.line, "unexpected '" + name + "' tag");
            template_error(tok.line, "unsupported tag '" + name + "'");
        }
        return n;
    }

    // Parameters of a macro or call block: (a, b=default, ...)
    void parse_signature(Node & n) {
        expect_op("(");
        while (!is_op(")")) {
            if (!n.targets.empty()) expect_op(",");
            if (is_op(")")) break;
            n.targets.push_back(expect_name());
            if (is_op("=")) {
                next();
                n.defaults.push_back(parse_expression(true));
            } else {
                n.defaults.push_back(nullptr);
            }
        }
        next();
    }

    std::vector<std::string> parse_targets() {
        std::vector<std::string> names;
        const bool paren = is_op("(");
        if (paren) next();
        names.push_back(expect_name());
        while (is_op(",")) {
            next();
            if (cur().kind != Token::Name || cur().text == "in") break;
            names.push_back(expect_name());
        }
        if (paren) expect_op(")");
        return names;
    }

    // ---- expressions

    // Comma-separated expressions become a tuple (as in {{ a, b }} or {% for x in a, b %}).
    ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens = false) {
        const int line = cur().line;
        std::vector<ExprPtr> items;
        bool saw_comma = false;
        while (true) {
            if (!items.empty()) {
                if (!is_op(",")) break;
                next();
                saw_comma = true;
            }
            if (is_tuple_end(explicit_parens)) break;
            items.push_back(parse_expression(with_condexpr));
        }
        if (!saw_comma) {
            if (items.empty()) {
                if (explicit_parens) return tuple_of({}, line);
                error("expected an expression, got " + describe(cur()));
            }
            return std::move(items[0]);
        }
        return tuple_of(std::move(items), line);
    }

    bool is_tuple_end(bool explicit_parens) const {
        if (cur().kind == Token::VarEnd || cur().kind == Token::BlockEnd || cur().kind == Token::End) return true;
        if (explicit_parens && is_op(")")) return true;
        return false;
    }

    ExprPtr tuple_of(std::vector<ExprPtr> items, int line) {
        auto e  = make(Expr::TupleLit, line);
        e->args = std::move(items);
        return e;
    }

    ExprPtr parse_expression(bool with_condexpr) {
        DepthGuard guard(*this);
        return with_condexpr ? parse_condexpr() : parse_or();
    }

    // Hostile templates must not exhaust the stack of this recursive-descent parser: one level per
    // nested statement, bracketed or argument expression, or else branch. Operator chains
    // (a + b + ..., not not ..., - - x, a.b.c ..., a | f | g ...) are parsed in loops and cost no
    // level.
    struct DepthGuard {
        Parser & p;
        explicit DepthGuard(Parser & parser) : p(parser) {
            if (p.depth_ >= kMaxParseDepth || p.stack_.exhausted()) too_deep(p);
            ++p.depth_;
        }
        ~DepthGuard() { --p.depth_; }
        // Out of line: the messages' strings would otherwise take room in every frame that nests.
        [[noreturn, gnu::noinline, gnu::cold]] static void too_deep(const Parser & p) {
            if (p.depth_ >= kMaxParseDepth)
                p.error("the template nests deeper than " + std::to_string(kMaxParseDepth) +
                        " levels (blocks, brackets, arguments or else branches)");
            p.error("the template nests too deeply: parsing it would use more than " +
                    std::to_string(StackMeter::kMaxStackBytes >> 10) + " KiB of stack");
        }
    };

    ExprPtr parse_condexpr() {
        ExprPtr e = parse_or();
        while (is_name("if")) {
            const int line = next().line;
            ExprPtr test   = parse_or();
            ExprPtr other;
            if (is_name("else")) {
                next();
                DepthGuard guard(*this);
                other = parse_condexpr();
            }
            auto c = make(Expr::Cond, line);
            c->args.push_back(std::move(e));
            c->args.push_back(std::move(test));
            c->args.push_back(std::move(other));
            e = std::move(c);
        }
        return e;
    }

    ExprPtr binary(Expr::Kind kind, std::string op, ExprPtr l, ExprPtr r, int line) {
        auto e  = make(kind, line);
        e->name = std::move(op);
        e->args.push_back(std::move(l));
        e->args.push_back(std::move(r));
        return e;
    }

    ExprPtr parse_or() {
        ExprPtr e = parse_and();
        while (is_name("or")) {
            const int line = next().line;
            e = binary(Expr::Or, "or", std::move(e), parse_and(), line);
        }
        return e;
    }

    ExprPtr parse_and() {
        ExprPtr e = parse_not();
        while (is_name("and")) {
            const int line = next().line;
            e = binary(Expr::And, "and", std::move(e), parse_not(), line);
        }
        return e;
    }

    ExprPtr parse_not() {
        std::vector<int> nots;  // lines of the leading "not"s, applied innermost last
        while (is_name("not")) nots.push_back(next().line);
        ExprPtr e = parse_compare();
        while (!nots.empty()) {
            auto n = make(Expr::Not, nots.back());
            nots.pop_back();
            n->args.push_back(std::move(e));
            e = std::move(n);
        }
        return e;
    }

    ExprPtr parse_compare() {
        const int line = cur().line;
        ExprPtr first  = parse_math1();
        std::vector<ExprPtr>     operands;
        std::vector<std::string> ops;
        while (true) {
            std::string op;
            if (cur().kind == Token::Op &&
                (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
                 cur().text == ">" || cur().text == ">=")) {
                op = next().text;
            } else if (is_name("in")) {
                next();
                op = "in";
            } else if (is_name("not") && peek().kind == Token::Name && peek().text == "in") {
                next();
                next();
                op = "notin";
            } else {
                break;
            }
            ops.push_back(op);
            operands.push_back(parse_math1());
        }
        if (ops.empty()) return first;
        auto e = make(Expr::Compare, line);
        e->args.push_back(std::move(first));
        for (auto & o : operands) e->args.push_back(std::move(o));
        e->ops = std::move(ops);
        return e;
    }

    ExprPtr parse_math1() {
        ExprPtr e = parse_concat();
        while (is_op("+") || is_op("-")) {
            const Token op = next();
            e = binary(Expr::Binary, op.text, std::move(e), parse_concat(), op.line);
        }
        return e;
    }

    ExprPtr parse_concat() {
        ExprPtr e = parse_math2();
        while (is_op("~")) {
            const Token op = next();
            e = binary(Expr::Binary, "~", std::move(e), parse_math2(), op.line);
        }
        return e;
    }

    ExprPtr parse_math2() {
        ExprPtr e = parse_pow();
        while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
            const Token op = next();
            e = binary(Expr::Binary, op.text, std::move(e), parse_pow(), op.line);
        }
        return e;
    }

    ExprPtr parse_pow() {
        ExprPtr e = parse_unary(true);
        while (is_op("**")) {
            const Token op = next();
            e = binary(Expr::Binary, "**", std::move(e), parse_unary(true), op.line);
        }
        return e;
    }

    // jinja2: unary := ('-' | '+') unary | primary postfix; then filters and tests.
    ExprPtr parse_unary(bool with_filter) {
        std::vector<Token> signs;  // applied innermost last
        while (is_op("-") || is_op("+")) signs.push_back(next());
        ExprPtr e = parse_postfix(parse_primary());
        while (!signs.empty()) {
            auto u = make(signs.back().text == "-" ? Expr::Neg : Expr::Pos, signs.back().line);
            signs.pop_back();
            u->args.push_back(std::move(e));
            e = std::move(u);
        }
        if (with_filter) e = parse_filter_expr(std::move(e));
        return e;
    }

    ExprPtr parse_primary() {
        const Token tok = cur();
        switch (tok.kind) {
            case Token::Name: {
                next();
                if (tok.text == "true" || tok.text == "True") return literal(Value::boolean(true), tok.line);
                if (tok.text == "false" || tok.text == "False") return literal(Value::boolean(false), tok.line);
                if (tok.text == "none" || tok.text == "None") return literal(Value::none(), tok.line);
                auto e  = make(Expr::Name, tok.line);
                e->name = tok.text;
                saw_loop_name_ = saw_loop_name_ || tok.text == "loop";
                return e;
            }
            case Token::String: {
                // Adjacent string literals are concatenated.
                std::string s;
                while (cur().kind == Token::String) s += next().text;
                return literal(Value::string(std::move(s)), tok.line);
            }
            case Token::Int: next(); return literal(Value::integer(tok.int_value), tok.line);
            case Token::Float: next(); return literal(Value::number(tok.float_value), tok.line);
            case Token::Op:
                if (tok.text == "(") {
                    next();
                    ExprPtr e = parse_tuple(true, true);
                    expect_op(")");
                    return e;
                }
                if (tok.text == "[") {
                    next();
                    auto e = make(Expr::ListLit, tok.line);
                    while (!is_op("]")) {
                        if (!e->args.empty()) expect_op(",");
                        if (is_op("]")) break;
                        e->args.push_back(parse_expression(true));
                    }
                    next();
                    return e;
                }
                if (tok.text == "{") {
                    next();
                    auto e = make(Expr::DictLit, tok.line);
                    while (!is_op("}")) {
                        if (!e->args.empty()) expect_op(",");
                        if (is_op("}")) break;
                        e->args.push_back(parse_expression(true));
                        expect_op(":");
                        e->args.push_back(parse_expression(true));
                    }
                    next();
                    return e;
                }
                break;
            default: break;
        }
        error("unexpected " + describe(tok));
    }

    ExprPtr parse_postfix(ExprPtr e) {
        while (true) {
            if (is_op(".")) {
                const int line = next().line;
                if (cur().kind == Token::Name) {
                    auto a  = make(Expr::GetAttr, line);
                    a->name = next().text;
                    a->args.push_back(std::move(e));
                    e = std::move(a);
                } else if (cur().kind == Token::Int) {
                    auto a = make(Expr::GetItem, line);
                    a->args.push_back(std::move(e));
                    a->args.push_back(literal(Value::integer(next().int_value), line));
                    e = std::move(a);
                } else {
                    error("expected an attribute name after '.', got " + describe(cur()));
                }
            } else if (is_op("[")) {
                e = parse_subscript(std::move(e));
            } else if (is_op("(")) {
                e = parse_call(std::move(e));
            } else {
                return e;
            }
        }
    }

    ExprPtr parse_subscript(ExprPtr obj) {
        const int line = next().line;  // '['
        // a[x], a[x:y], a[x:y:z], a[::-1]
        ExprPtr parts[3];
        bool is_slice = false;
        int  part     = 0;
        while (!is_op("]")) {
            if (is_op(":")) {
                next();
                is_slice = true;
                if (++part > 2) error("too many ':' in a slice");
                continue;
            }
            if (parts[part]) error("expected ':' or ']' in a subscript, got " + describe(cur()));
            parts[part] = parse_expression(true);
        }
        next();
        if (!is_slice) {
            if (!parts[0]) error("empty subscript");
            auto e = make(Expr::GetItem, line);
            e->args.push_back(std::move(obj));
            e->args.push_back(std::move(parts[0]));
            return e;
        }
        auto e = make(Expr::Slice, line);
        e->args.push_back(std::move(obj));
        for (auto & p : parts) e->args.push_back(std::move(p));
        return e;
    }

    void parse_call_args(Expr & e) {
        expect_op("(");
        bool first = true;
        while (!is_op(")")) {
            if (!first) {
                expect_op(",");
                if (is_op(")")) break;
            }
            first = false;
            if (is_op("*") || is_op("**")) error("*args and **kwargs in calls are not supported");
            if (cur().kind == Token::Name && peek().kind == Token::Op && peek().text == "=") {
                std::string key = next().text;
                next();
                e.kwargs.emplace_back(std::move(key), parse_expression(true));
            } else {
                if (!e.kwargs.empty()) error("positional argument after a keyword argument");
                e.args.push_back(parse_expression(true));
            }
        }
        next();
    }

    ExprPtr parse_call(ExprPtr callee) {
        auto e = make(Expr::Call, cur().line);
        e->args.push_back(std::move(callee));
        parse_call_args(*e);
        return e;
    }

    ExprPtr parse_filter_expr(ExprPtr e) {
        while (true) {
            if (is_op("|")) e = parse_filter(std::move(e));
            else if (is_name("is")) e = parse_test(std::move(e));
            else if (is_op("(")) e = parse_call(std::move(e));
            else return e;
        }
    }

    std::string dotted_name() {
        std::string name = expect_name();
        while (is_op(".")) {
            next();
            name += "." + expect_name();
        }
        return name;
    }

    ExprPtr parse_filter(ExprPtr operand, bool leading_pipe = true) {
        if (leading_pipe) expect_op("|");
        const int line = cur().line;
        auto e  = make(Expr::Filter, line);
        e->name = dotted_name();
        if (!is_known_filter(e->name)) template_error(line, "unknown filter '" + e->name + "'");
        e->args.push_back(std::move(operand));
        if (is_op("(")) parse_call_args(*e);
        return e;
    }

    ExprPtr parse_test(ExprPtr operand) {
        const int line = next().line;  // 'is'
        auto e = make(Expr::Test, line);
        if (is_name("not")) {
            next();
            e->negated = true;
        }
        e->name = dotted_name();
        if (!is_known_test(e->name)) template_error(line, "unknown test '" + e->name + "'");
        e->args.push_back(std::move(operand));
        if (is_op("(")) {
            parse_call_args(*e);
        } else if ((cur().kind == Token::Name || cur().kind == Token::String || cur().kind == Token::Int ||
                    cur().kind == Token::Float || is_op("[") || is_op("{")) &&
                   !(is_name("else") || is_name("or") || is_name("and") || is_name("if") || is_name("in") ||
                     is_name("not"))) {
            if (is_name("is")) error("you cannot chain multiple tests with 'is'");
            // One argument without parentheses: "x is divisibleby 3", "x is sameas none".
            e->args.push_back(parse_postfix(parse_primary()));
        }
        return e;
    }

    std::vector<Token> t_;
    size_t             p_          = 0;
    int                loop_depth_ = 0;
    bool               saw_loop_name_ = false;  // the name `loop` was read (see Node::uses_loop)
    int                depth_      = 0;
    StackMeter         stack_;
    size_t             bytes_ = 0;  // tokens and nodes
};

}  // namespace

Expr::~Expr() {
    // Chains such as 1 + 1 + ... + 1 make trees as deep as they are long: free them with a worklist
    // rather than by recursion.
    if (args.empty() && kwargs.empty()) return;
    std::vector<ExprPtr> pending;
    auto take = [&](Expr & e) {
        for (auto & a : e.args)
            if (a) pending.push_back(std::move(a));
        for (auto & kw : e.kwargs)
            if (kw.second) pending.push_back(std::move(kw.second));
    };
    take(*this);
    while (!pending.empty()) {
        ExprPtr e = std::move(pending.back());
        pending.pop_back();
        take(*e);
    }
}

void parse_too_large(int line) {
    template_error(line, "the template is too large: parsing it would take more than " +
                             std::to_string(kMaxParseBytes >> 20) + " MiB");
}

std::shared_ptr<const Template> parse_template(const std::string & source) {
    auto t  = std::make_shared<Template>();
    t->body = Parser(lex(source)).parse_all();
    return t;
}

}  // namespace spark::jinja
