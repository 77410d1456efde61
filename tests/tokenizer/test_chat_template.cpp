// Chat templates: the Qwen3 template rendered exactly like transformers' apply_chat_template, Jinja
// conformance cases rendered by jinja2 (transformers' environment), and the error contract.
#include "common/error.h"
#include "text/chat_template.h"
#include "text/jinja_ast.h"
#include "text/tokenizer.h"
#include "tokenizer_test_util.h"

#include <doctest/doctest.h>
#include <spark/spark.h>

#include <cstring>
#include <list>

using tokenizer_test::data_path;
using tokenizer_test::read_jsonl;

namespace {

const std::string & qwen3_template() {
    static const std::string t = spark::Tokenizer::from_directory(data_path("qwen3")).chat_template();
    return t;
}

// Renders a golden line ({"messages", "tools", "extra", "add_generation_prompt"}) through the C API.
spark_status render_c(const std::string & tmpl, const nlohmann::ordered_json & g, std::string & out) {
    std::list<std::string> keep;  // owns the strings the C structs point to
    auto c_str = [&](const std::string & s) { return keep.emplace_back(s).c_str(); };
    std::vector<spark_chat_message> msgs;
    for (const auto & m : g["messages"]) {
        spark_chat_message cm{};
        cm.role              = c_str(m["role"].get<std::string>());
        cm.content           = m.contains("content") && !m["content"].is_null() ? c_str(m["content"].get<std::string>()) : nullptr;
        cm.reasoning_content = m.contains("reasoning_content") ? c_str(m["reasoning_content"].get<std::string>()) : nullptr;
        cm.tool_calls_json   = m.contains("tool_calls") ? c_str(m["tool_calls"].dump()) : nullptr;
        cm.name              = m.contains("name") ? c_str(m["name"].get<std::string>()) : nullptr;
        msgs.push_back(cm);
    }
    const char * tools = g.contains("tools") && !g["tools"].is_null() ? c_str(g["tools"].dump()) : nullptr;
    const char * extra = g.contains("extra") && !g["extra"].is_null() ? c_str(g["extra"].dump()) : nullptr;
    size_t len = 0;
    spark_status st = spark_chat_apply_template(tmpl.c_str(), msgs.data(), msgs.size(), g["add_generation_prompt"].get<bool>(),
                                                tools, extra, nullptr, "<|im_end|>", nullptr, 0, &len);
    if (st != SPARK_ERR_BUFFER_TOO_SMALL && st != SPARK_OK) return st;
    std::vector<char> buf(len + 1);
    st = spark_chat_apply_template(tmpl.c_str(), msgs.data(), msgs.size(), g["add_generation_prompt"].get<bool>(), tools,
                                   extra, nullptr, "<|im_end|>", buf.data(), buf.size(), &len);
    out.assign(buf.data(), len);
    if (st == SPARK_OK) CHECK(buf[len] == '\0');  // room for the terminator: it is written
    return st;
}

}  // namespace

TEST_CASE("qwen3 chat template renders the Hugging Face chat goldens") {
    size_t n = 0;
    for (const auto & file : {"qwen3/chat_golden.jsonl", "qwen3_chat_tools_golden.jsonl"}) {
        for (const auto & g : read_jsonl(data_path(file))) {
            std::string out;
            CAPTURE(g["messages"].dump());
            REQUIRE(render_c(qwen3_template(), g, out) == SPARK_OK);
            CHECK(out == g["rendered"].get<std::string>());
            ++n;
        }
    }
    CHECK(n >= 16);
    MESSAGE(n << " chat goldens");
}

TEST_CASE("jinja conformance cases match jinja2 (transformers' environment)") {
    size_t rendered = 0, errors = 0;
    for (const auto & g : read_jsonl(data_path("jinja_golden.jsonl"))) {
        const std::string tmpl = g["template"].get<std::string>();
        CAPTURE(tmpl);
        spark::jinja::Dict vars;
        for (auto it = g["vars"].begin(); it != g["vars"].end(); ++it)
            vars.set(spark::jinja::Value::string(it.key()), spark::jinja::from_json(it.value()));
        if (g.contains("error")) {
            CAPTURE(g["error"].get<std::string>());
            try {
                spark::jinja::render(*spark::jinja::parse_template(tmpl), vars);
                FAIL("rendered a template that jinja2 rejects");
            } catch (const spark::Error & e) {
                CHECK(e.status() == SPARK_ERR_TEMPLATE);
                CHECK(std::string(e.what()).find("line") != std::string::npos);
            }
            ++errors;
            continue;
        }
        try {
            CHECK(spark::jinja::render(*spark::jinja::parse_template(tmpl), vars) == g["rendered"].get<std::string>());
        } catch (const spark::Error & e) {
            FAIL(e.what());
        }
        ++rendered;
    }
    MESSAGE(rendered << " rendered, " << errors << " error cases");
    CHECK(rendered >= 40);
    CHECK(errors >= 10);
}

TEST_CASE("chat template errors: syntax - unknown constructs - raise_exception - bad JSON - buffers") {
    const spark_chat_message user{"user", "hi", nullptr, nullptr, nullptr};
    char buf[256];
    size_t len = 0;
    auto apply = [&](const char * tmpl, const char * tools = nullptr, const char * extra = nullptr) {
        return spark_chat_apply_template(tmpl, &user, 1, true, tools, extra, nullptr, nullptr, buf, sizeof buf, &len);
    };
    CHECK(apply("{{ messages[0].content | frobnicate }}") == SPARK_ERR_TEMPLATE);
    CHECK(std::string(spark_last_error()).find("frobnicate") != std::string::npos);
    CHECK(apply("line one\n{% foreach x in y %}{% endforeach %}") == SPARK_ERR_TEMPLATE);
    CHECK(std::string(spark_last_error()).find("line 2") != std::string::npos);
    CHECK(std::string(spark_last_error()).find("foreach") != std::string::npos);
    CHECK(apply("{% if true %}unclosed") == SPARK_ERR_TEMPLATE);
    CHECK(apply("{{ 1 + }}") == SPARK_ERR_TEMPLATE);
    CHECK(apply("{{ messages[0].content is palindrome }}") == SPARK_ERR_TEMPLATE);
    CHECK(apply("{{ raise_exception('System role not supported') }}") == SPARK_ERR_TEMPLATE);
    CHECK(std::string(spark_last_error()).find("System role not supported") != std::string::npos);
    CHECK(apply("{{ messages[0].content.zfill(5) }}") == SPARK_ERR_TEMPLATE);
    CHECK(std::string(spark_last_error()).find("zfill") != std::string::npos);
    CHECK(apply("{{ x }}", "[not json") == SPARK_ERR_INVALID_FORMAT);
    CHECK(apply("{{ x }}", "{\"not\": \"an array\"}") == SPARK_ERR_INVALID_FORMAT);
    CHECK(apply("{{ x }}", nullptr, "[1]") == SPARK_ERR_INVALID_FORMAT);
    const spark_chat_message bad_calls{"assistant", "x", nullptr, "{\"name\": ", nullptr};
    CHECK(spark_chat_apply_template("{{ 1 }}", &bad_calls, 1, false, nullptr, nullptr, nullptr, nullptr, buf, sizeof buf,
                                    &len) == SPARK_ERR_INVALID_FORMAT);
    CHECK(spark_chat_apply_template(nullptr, &user, 1, false, nullptr, nullptr, nullptr, nullptr, buf, sizeof buf, &len) ==
          SPARK_ERR_INVALID_ARGUMENT);

    // Extra context and bos/eos become variables.
    REQUIRE(spark_chat_apply_template("{{ bos_token }}|{{ eos_token }}|{{ flag }}|{{ tools }}", &user, 1, false, nullptr,
                                      "{\"flag\": [1, \"two\"]}", "<s>", "</s>", buf, sizeof buf, &len) == SPARK_OK);
    CHECK(std::string(buf, len) == "<s>|</s>|[1, 'two']|None");

    // Buffer protocol: exact fit has no terminator; one spare byte gets one.
    REQUIRE(apply("{{ messages[0].content }}!") == SPARK_OK);
    CHECK(len == 3);
    std::memset(buf, 'X', sizeof buf);
    CHECK(spark_chat_apply_template("{{ messages[0].content }}!", &user, 1, false, nullptr, nullptr, nullptr, nullptr, buf,
                                    2, &len) == SPARK_ERR_BUFFER_TOO_SMALL);
    CHECK(len == 3);
    CHECK(spark_chat_apply_template("{{ messages[0].content }}!", &user, 1, false, nullptr, nullptr, nullptr, nullptr, buf,
                                    3, &len) == SPARK_OK);
    CHECK(buf[3] == 'X');
    CHECK(spark_chat_apply_template("{{ messages[0].content }}!", &user, 1, false, nullptr, nullptr, nullptr, nullptr, buf,
                                    4, &len) == SPARK_OK);
    CHECK(buf[3] == '\0');
}

TEST_CASE("message fields: content none - reasoning aliases - tool_calls - name") {
    const spark_chat_message m{"assistant", nullptr, "why", "[{\"name\": \"f\", \"arguments\": {\"b\": 1, \"a\": 2}}]", "bot"};
    char buf[512];
    size_t len = 0;
    REQUIRE(spark_chat_apply_template("{{ messages[0] | tojson }}|{{ messages[0].content }}", &m, 1, false, nullptr, nullptr,
                                      nullptr, nullptr, buf, sizeof buf, &len) == SPARK_OK);
    // transformers adds "thinking" (first) as an alias of reasoning_content; key order is kept.
    CHECK(std::string(buf, len) ==
          "{\"thinking\": \"why\", \"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"why\", "
          "\"tool_calls\": [{\"name\": \"f\", \"arguments\": {\"b\": 1, \"a\": 2}}], \"name\": \"bot\"}|None");
}

TEST_CASE("hostile templates and inputs fail cleanly") {
    const spark_chat_message user{"user", "hi", nullptr, nullptr, nullptr};
    char buf[64];
    size_t len = 0;
    auto apply = [&](const std::string & tmpl, const char * tools = nullptr) {
        return spark_chat_apply_template(tmpl.c_str(), &user, 1, true, tools, nullptr, nullptr, nullptr, buf, sizeof buf, &len);
    };
    CHECK(apply("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}") == SPARK_ERR_TEMPLATE);
    CHECK(apply("{{ " + std::string(100000, '[') + " }}") == SPARK_ERR_TEMPLATE);
    std::string nested_ifs;
    for (int k = 0; k < 5000; ++k) nested_ifs += "{% if true %}";
    CHECK(apply(nested_ifs) == SPARK_ERR_TEMPLATE);
    const std::string deep = std::string(50000, '[') + std::string(50000, ']');
    CHECK(apply("{{ tools }}", deep.c_str()) == SPARK_ERR_INVALID_FORMAT);
    CHECK(apply("{% set ns = namespace(x=[]) %}{% for i in range(2000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}") ==
          SPARK_ERR_TEMPLATE);
    CHECK(apply("{% for i in range(1000000) %}{% endfor %}") == SPARK_ERR_TEMPLATE);  // sandbox range limit
    CHECK(apply("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}") == SPARK_ERR_TEMPLATE);
    CHECK(apply("{{ 9223372036854775807 + 1 }}") == SPARK_ERR_TEMPLATE);
    // Every prefix of the Qwen3 template either renders or fails with SPARK_ERR_TEMPLATE.
    const std::string & t = qwen3_template();
    int errors = 0;
    for (size_t cut = 0; cut < t.size(); cut += 37) {
        const spark_status st = apply(t.substr(0, cut));
        CHECK((st == SPARK_OK || st == SPARK_ERR_TEMPLATE || st == SPARK_ERR_BUFFER_TOO_SMALL));
        errors += st == SPARK_ERR_TEMPLATE;
    }
    CHECK(errors > 0);
}
