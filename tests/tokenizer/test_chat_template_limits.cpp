// Hostile chat templates: templates come inside downloaded model directories and run inside host
// processes, so whatever a template does, a render must end quickly with SPARK_ERR_TEMPLATE (or its
// result) rather than overflow the stack, run for hours, exhaust memory or leak.
#include "common/error.h"
#include "text/chat_template.h"
#include "text/jinja_ast.h"
#include "text/tokenizer.h"
#include "tokenizer_test_util.h"

#include <doctest/doctest.h>
#include <spark/spark.h>

#include <ctime>
#include <string>

namespace {

struct Outcome {
    spark_status status = SPARK_OK;
    std::string  text;     // the rendered text, or the error message
    double       seconds = 0;  // CPU time of the call (other processes on the machine do not count)
};

double thread_cpu_seconds() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

// Renders through the C API, as a host does: one user message "hi" and a generation prompt.
Outcome apply(const std::string & tmpl) {
    const spark_chat_message user{"user", "hi", nullptr, nullptr, nullptr};
    Outcome o;
    const double start = thread_cpu_seconds();
    size_t len = 0;
    o.status = spark_chat_apply_template(tmpl.c_str(), &user, 1, true, nullptr, nullptr, nullptr, nullptr, nullptr, 0, &len);
    if (o.status == SPARK_ERR_BUFFER_TOO_SMALL) {
        std::string buf(len + 1, '\0');
        o.status = spark_chat_apply_template(tmpl.c_str(), &user, 1, true, nullptr, nullptr, nullptr, nullptr, buf.data(),
                                             buf.size(), &len);
        buf.resize(len);
        o.text = buf;
    }
    o.seconds = thread_cpu_seconds() - start;
    if (o.status != SPARK_OK) o.text = spark_last_error();
    return o;
}

std::string repeat(const std::string & s, size_t n) {
    std::string out;
    out.reserve(s.size() * n);
    for (size_t k = 0; k < n; ++k) out += s;
    return out;
}

// Runaway cases stop in a fraction of a second (without the budgets they would run for hours):
// checked in optimized builds only, where times mean something (debug and sanitizer builds run
// several times slower), with room for a loaded 2-core machine.
#if defined(__has_feature)
#    if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#        define SPARK_TEST_SANITIZED 1
#    endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#    define SPARK_TEST_SANITIZED 1
#endif
#if defined(NDEBUG) && !defined(SPARK_TEST_SANITIZED)
constexpr double kMaxSecondsPerCase = 10.0;
#else
constexpr double kMaxSecondsPerCase = 1e9;
#endif

void check_fails_with(const std::string & tmpl, const std::string & message_part) {
    const Outcome o = apply(tmpl);
    CAPTURE(tmpl.substr(0, 160));
    CAPTURE(o.text.substr(0, 300));
    CHECK(o.status == SPARK_ERR_TEMPLATE);
    CHECK(o.text.find(message_part) != std::string::npos);
    CHECK(o.seconds < kMaxSecondsPerCase);
    MESSAGE((std::to_string(o.seconds * 1e3) + " ms: " + tmpl.substr(0, 60) + " -> " + o.text.substr(0, 120)));
}

void check_renders(const std::string & tmpl, const std::string & expected) {
    const Outcome o = apply(tmpl);
    CAPTURE(tmpl.substr(0, 160));
    CAPTURE(o.text.substr(0, 300));
    CHECK(o.status == SPARK_OK);
    CHECK(o.text == expected);
    CHECK(o.seconds < kMaxSecondsPerCase);
}

constexpr size_t kTerms = 100000;  // well past where recursion per term overflowed (2,000 in debug builds)
// Block tags are ~10 tokens each: fewer of them, so that the template stays within the parse budget
// (kMaxParseBytes) and reaches the parser's nesting limit rather than that one.
constexpr size_t kBlocks = 50000;

}  // namespace

TEST_CASE("long operator, attribute, filter and not chains render without recursion") {
    check_renders("{{ 1" + repeat(" + 1", kTerms) + " }}", std::to_string(kTerms + 1));
    check_renders("{{ 1" + repeat(" * 1", kTerms) + " }}", "1");
    check_renders("{{ ('a'" + repeat(" ~ 'b'", kTerms) + ") | length }}", std::to_string(kTerms + 1));
    check_renders("{{ ('a'" + repeat(" + 'b'", kTerms) + ") | length }}", std::to_string(kTerms + 1));
    check_renders("{{ " + repeat("not ", kTerms) + "false }}", kTerms % 2 ? "True" : "False");
    check_renders("{{ " + repeat("- ", kTerms) + "7 }}", kTerms % 2 ? "-7" : "7");
    check_renders("{{ 'abc'" + repeat(" | first", kTerms) + " }}", "a");
    check_renders("{{ 'abc'" + repeat("[0]", kTerms) + " }}", "a");
    check_renders("{{ false" + repeat(" or false", kTerms) + " }}", "False");
    check_renders("{{ true" + repeat(" and true", kTerms) + " }}", "True");
    check_renders("{{ 1" + repeat(" == 1", kTerms) + " }}", "True");
    // A namespace that holds itself: x.a.a.a... walks the cycle (and the render breaks it, see below).
    check_renders("{% set ns = namespace() %}{% set ns.a = ns %}{{ ns" + repeat(".a", kTerms) + " is defined }}", "True");
    check_renders(repeat("{% if true %}{% endif %}", kBlocks) + "done", "done");
    check_renders("{% if false %}{% " + repeat("elif false %}{% ", kBlocks) + "else %}else{% endif %}", "else");
}

// Deep nesting stops at a nesting limit, or at the stack limit where frames are large (debug and
// sanitizer builds): "nests deeper than N levels", "nests too deeply", "macro calls nest deeper".
constexpr const char * kNestingError = "nest";

TEST_CASE("deep nesting fails cleanly at the nesting limit") {
    const std::string limit = kNestingError;
    check_fails_with("{{ " + repeat("(", kTerms) + "1" + repeat(")", kTerms) + " }}", limit);
    check_fails_with("{{ " + repeat("[", kTerms) + repeat("]", kTerms) + " }}", limit);
    check_fails_with("{{ " + repeat("{'a': ", kTerms) + "1" + repeat("}", kTerms) + " }}", limit);
    check_fails_with("{{ " + repeat("1 + (", kTerms) + "1" + repeat(")", kTerms) + " }}", limit);
    check_fails_with("{{ " + repeat("range(", kTerms) + "1" + repeat(")", kTerms) + " }}", limit);
    check_fails_with("{{ " + repeat("'a' | replace('a', ", kTerms) + "'b'" + repeat(")", kTerms) + " }}", limit);
    check_fails_with("{{ 'abc'" + repeat("['abc'", kTerms) + repeat("]", kTerms) + " }}", limit);
    check_fails_with("{{ " + repeat("1 if false else ", kTerms) + "2 }}", limit);
    check_fails_with(repeat("{% if true %}", kBlocks) + repeat("{% endif %}", kBlocks), limit);
    check_fails_with(repeat("{% for x in [1] %}", kBlocks) + repeat("{% endfor %}", kBlocks), limit);
    check_fails_with(repeat("{% with a = 1 %}", kBlocks) + repeat("{% endwith %}", kBlocks), limit);
    check_fails_with(repeat("{% macro m() %}", kBlocks) + repeat("{% endmacro %}", kBlocks), limit);
    check_fails_with(repeat("{% if true %}", kBlocks), limit);  // unclosed as well
}

TEST_CASE("templates too large to parse fail cleanly") {
    // The tokens and the syntax tree stay within kMaxParseBytes (some hundreds of bytes for
    // every term), whatever the length of the template.
    const std::string too_large = "the template is too large";
    check_fails_with("{{ 1" + repeat(" + 1", 2'000'000) + " }}", too_large);
    check_fails_with(repeat("{{ x }}", 2'000'000), too_large);
    check_fails_with(repeat("text{# comment #}", 2'000'000), too_large);
}

TEST_CASE("runaway recursion and deep values fail cleanly") {
    check_fails_with("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", kNestingError);
    check_fails_with("{% macro f(n) %}{{ f(n + 1) ~ f(n + 1) }}{% endmacro %}{{ f(0) }}", kNestingError);
    check_fails_with("{% macro f() %}{% call f() %}{{ caller() }}{% endcall %}{% endmacro %}{{ f() }}", kNestingError);
    // Macro recursion where every level nests expressions deeply.
    const std::string deep = repeat("[", 100) + "f()" + repeat("]", 100);
    check_fails_with("{% macro f() %}{{ " + deep + " }}{% endmacro %}{{ f() }}", kNestingError);
    check_fails_with("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}"
                     "{{ ns.x }}",
                     "nested too deeply");
    check_fails_with("{% set ns = namespace(x={}) %}{% for i in range(100000) %}{% set ns.x = {'a': ns.x} %}"
                     "{% endfor %}{{ ns.x | tojson }}",
                     "nested too deeply");
}

TEST_CASE("runaway work stops at the work budget") {
    // The limit named is the default plus a little for the inputs (chat_template.cpp).
    const std::string budget = "chat template: the render exceeded its work budget of 100000";
    check_fails_with("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", budget);
    check_fails_with("{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}", budget);
    check_fails_with("{% for i in range(100000) %}{% set x = range(100000) | list %}{% endfor %}", budget);
    check_fails_with("{% for i in range(100000) %}{% set x = range(100000) | join %}{% endfor %}", budget);
    check_fails_with("{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% set y = s | length %}{% endfor %}", budget);
    check_fails_with("{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% set y = 'y' in s %}{% endfor %}", budget);
    check_fails_with("{% set s = 'ab' * 50000 %}{% for i in range(100000) %}{% set y = s.split('a') %}{% endfor %}",
                     budget);
    check_fails_with("{% set l = range(100000) | list %}{% for i in range(100000) %}{% set y = l | sort %}{% endfor %}",
                     budget);
    check_fails_with("{% set l = range(100000) | list %}{% for i in range(100000) %}{% set y = 99999 in l %}{% endfor %}",
                     budget);
    // Quadratic: a dict grown key by key copies and scans all its keys at every step.
    check_fails_with("{% set ns = namespace(d={}) %}{% for i in range(100000) %}{% set ns.d = dict(ns.d, x=i) %}"
                     "{% set ns.d = dict(ns.d, [[i, i]]) %}{% endfor %}",
                     budget);
    // Quadratic: many distinct variables in one scope.
    std::string many_sets;
    for (size_t k = 0; k < 30000; ++k) many_sets += "{% set v" + std::to_string(k) + " = 1 %}";
    check_fails_with(many_sets, budget);
    // Macro calls that fan out: 2^25 calls, 25 deep.
    check_fails_with("{% macro f(n) %}{% if n < 25 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}",
                     budget);
}

TEST_CASE("runaway memory stops at the memory budget") {
    const std::string budget = "chat template: the render exceeded its memory budget of " +
                               std::to_string(spark::jinja::RenderLimits{}.max_bytes >> 20) + " MiB";
    check_fails_with("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                     budget);
    check_fails_with("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                     budget);
    check_fails_with("{% set ns = namespace(l=[0]) %}{% for i in range(100) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
                     budget);
    check_fails_with("{{ [0] * 1000000000 }}", budget);
    check_fails_with("{{ 'x' * 1000000000 }}", budget);
    check_fails_with("{{ 'xx' * 4611686018427387904 }}", "too large");  // 2^62: the size itself overflows
    check_fails_with("{{ [0, 0] * 4611686018427387904 }}", "too large");
    check_fails_with("{{ range(100000) | list | tojson(indent=1000000000) }}", budget);
    check_fails_with("{{ [[[[1]]]] | tojson(indent=100000000) }}", budget);
    check_fails_with("{{ range(10) | list | tojson(indent='x' * 100000000) }}", budget);
    check_fails_with("{{ 'x' | indent(1000000000, true) }}", budget);
    check_fails_with("{{ ('x' * 10000000) | replace('x', 'xxxxxxxxxxxxxxxxxxxxxxxxx') }}", budget);
    check_fails_with("{{ ('x' * 10000000).split('') }}", "empty separator");
}

TEST_CASE("values that are small but expand stop at one of the budgets") {
    // Whichever of the work and memory budgets comes first.
    const std::string either = "chat template: the render exceeded its ";
    check_fails_with("{{ ('x' * 10000000) | list | length }}", either);  // a value per character
    // Shared values: a list of 2^40 references to one list is small, its text is not.
    const std::string shared = "{% set ns = namespace(l=['xxxxxxxxxxxxxxxx']) %}{% for i in range(40) %}"
                               "{% set ns.l = [ns.l, ns.l] %}{% endfor %}";
    check_fails_with(shared + "{{ ns.l }}", either);
    check_fails_with(shared + "{{ ns.l | tojson }}", either);
    check_fails_with(shared + "{{ ns.l | tojson(indent=2) }}", either);
    check_fails_with(shared + "{{ ns.l | string | length }}", either);
    check_fails_with(shared + "{{ ns.l == ns.l }}", either);
    check_fails_with(shared + "{{ ns.l | unique | list }}", either);
}

namespace {

// Renders `tmpl` `renders` times with a conversation, checking after each render that every shared
// value (list, dict, namespace, scope, macro) that the render created has been freed.
void check_no_leak(const std::string & tmpl, int renders) {
    spark::ChatInputs in;
    for (int k = 0; k < 4; ++k) {
        in.messages.push_back({"user", "question " + std::to_string(k), std::nullopt, std::nullopt, std::nullopt});
        in.messages.push_back({"assistant", "answer " + std::to_string(k), std::nullopt, std::nullopt, std::nullopt});
    }
    const std::string first = spark::render_chat_template(tmpl, in);  // creates the evaluator's globals once
    const int64_t live = spark::jinja::live_shared_values();
    int leaking_renders = 0;
    for (int k = 0; k < renders; ++k) {
        CHECK(spark::render_chat_template(tmpl, in) == first);
        leaking_renders += spark::jinja::live_shared_values() != live;
    }
    CHECK(leaking_renders == 0);
    CHECK(spark::jinja::live_shared_values() == live);
}

}  // namespace

TEST_CASE("renders free everything they create: macros, caller blocks and namespaces that hold each other") {
    // A macro's closure holds the scope that holds the macro.
    check_no_leak("{% macro show(m) %}{{ m.role }}: {{ m.content }}\n{% endmacro %}"
                  "{% for m in messages %}{{ show(m) }}{% endfor %}",
                  5000);
    // A macro defined in a loop body, a macro inside a macro, a call block's caller.
    check_no_leak("{% for m in messages %}{% macro show() %}{{ m.content }}{% endmacro %}{{ show() }}{% endfor %}"
                  "{% macro outer() %}{% macro inner() %}[{{ caller() }}]{% endmacro %}{{ inner(caller=caller) }}"
                  "{% endmacro %}{% call outer() %}{{ messages | length }}{% endcall %}",
                  5000);
    // Namespaces that reference each other, and one that holds a macro.
    check_no_leak("{% set a = namespace(n=0) %}{% set b = namespace(other=a) %}{% set a.other = b %}"
                  "{% macro f() %}{{ a.n }}{% endmacro %}{% set a.f = f %}"
                  "{% for m in messages %}{% set a.n = a.n + 1 %}{{ b.other.other.other.f() }}{% endfor %}",
                  5000);
}

TEST_CASE("renders that fail free everything too") {
    const int64_t live = spark::jinja::live_shared_values();
    for (const char * tmpl : {"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
                              "{% set a = namespace() %}{% set b = namespace(a=a) %}{% set a.b = b %}{{ raise_exception('x') }}",
                              "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}{% endfor %}"}) {
        CAPTURE(tmpl);
        CHECK(apply(tmpl).status == SPARK_ERR_TEMPLATE);
        CHECK(spark::jinja::live_shared_values() == live);
    }
}

TEST_CASE("limits can be set per render; usage stays below them") {
    using spark::jinja::RenderLimits;
    const auto tmpl = spark::jinja::parse_template("{% for i in range(1000) %}{{ i }}{% endfor %}");
    RenderLimits small;
    small.max_steps = 1000;
    CHECK_THROWS_WITH_AS(spark::jinja::render(*tmpl, {}, small), doctest::Contains("work budget of 1000 steps"),
                         spark::Error);
    RenderLimits tight_memory;
    tight_memory.max_bytes = 1000;
    CHECK_THROWS_WITH_AS(spark::jinja::render(*spark::jinja::parse_template("{{ 'x' * 2000 }}"), {}, tight_memory),
                         doctest::Contains("memory budget"), spark::Error);
    CHECK(spark::jinja::render(*tmpl, {}).size() == 2890);
}

TEST_CASE("the Qwen3 template renders a long conversation within what its inputs allow") {
    // 2,000 turns (~4,800 messages, ~3 MB): user questions, answers with their reasoning inline,
    // and every fifth turn a tool call and its result.
    const std::string tmpl = spark::Tokenizer::from_directory(tokenizer_test::data_path("qwen3")).chat_template();
    std::string paragraph;
    for (int k = 0; k < 12; ++k) paragraph += "The quick brown fox jumps over the lazy dog, again and again. ";
    spark::ChatInputs in;
    in.messages.push_back({"system", std::string("You are a helpful assistant."), std::nullopt, std::nullopt, std::nullopt});
    for (int t = 0; t < 2000; ++t) {
        in.messages.push_back({"user", "Question " + std::to_string(t) + ": " + paragraph, std::nullopt, std::nullopt,
                               std::nullopt});
        if (t % 5 == 4) {
            in.messages.push_back({"assistant", std::string(), std::nullopt,
                                   std::string(R"([{"type": "function", "function": {"name": "get_weather", )"
                                               R"("arguments": {"city": "Paris"}}}])"),
                                   std::nullopt});
            in.messages.push_back({"tool", std::string("{\"temp\": 21}"), std::nullopt, std::nullopt, std::nullopt});
        }
        in.messages.push_back({"assistant", "<think>\nreasoning " + paragraph + "\n</think>\n\nAnswer: " + paragraph,
                               std::nullopt, std::nullopt, std::nullopt});
    }
    in.add_generation_prompt = true;
    const std::string expected = spark::render_chat_template(tmpl, in);
    CHECK(expected.size() > 3'000'000);
    // With no budget of their own, the room the inputs give (chat_template.cpp: 4 steps and 8 bytes
    // per input byte) is enough: a long conversation never meets the limits however large it is.
    spark::jinja::RenderLimits nothing;
    nothing.max_steps = 1;
    nothing.max_bytes = 1;
    CHECK(spark::render_chat_template(tmpl, in, &nothing) == expected);
    // The default limits alone are enough too (it takes ~40% of the steps).
    spark::jinja::Dict vars;
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    for (const spark::ChatMessage & m : in.messages) {
        nlohmann::ordered_json j = {{"role", m.role}, {"content", *m.content}};
        if (m.tool_calls_json) j["tool_calls"] = nlohmann::ordered_json::parse(*m.tool_calls_json);
        messages.push_back(std::move(j));
    }
    vars.set(spark::jinja::Value::string("messages"), spark::jinja::from_json(messages));
    vars.set(spark::jinja::Value::string("add_generation_prompt"), spark::jinja::Value::boolean(true));
    CHECK(spark::jinja::render(*spark::jinja::parse_template(tmpl), vars, spark::jinja::RenderLimits{}) == expected);
}
