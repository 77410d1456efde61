#include "text/chat_template.h"

#include "common/error.h"
#include "text/jinja_ast.h"
#include "text/unicode.h"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace spark {

namespace {

using jinja::Value;

// Deepest nesting of arrays/objects (outside strings); the conversion to template values recurses.
size_t nesting_depth(const std::string & text) {
    size_t depth = 0, max_depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\') ++i;
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            max_depth = std::max(max_depth, ++depth);
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
    return max_depth;
}

nlohmann::ordered_json parse_json(const std::string & text, const char * what) {
    if (!unicode::is_valid_utf8(text)) fail(SPARK_ERR_INVALID_FORMAT, "%s is not valid UTF-8", what);
    if (nesting_depth(text) > 128) fail(SPARK_ERR_INVALID_FORMAT, "%s is nested too deeply", what);
    try {
        return nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::exception & e) {
        fail(SPARK_ERR_INVALID_FORMAT, "%s is not valid JSON: %s", what, e.what());
    }
}

// The limits of a render: the defaults, which stop a runaway template within a fraction of a
// second, plus room for large inputs, so that a long conversation renders however long it is
// (Qwen3's template takes ~1.2 steps and ~1 byte alive per input byte).
constexpr uint64_t kStepsPerInputByte = 4;
constexpr uint64_t kBytesPerInputByte = 8;

jinja::RenderLimits limits_for(const ChatInputs & in, const jinja::RenderLimits * base) {
    uint64_t input = 0;
    auto add = [&](const std::optional<std::string> & s) { input += s ? s->size() : 0; };
    for (const ChatMessage & m : in.messages) {
        input += m.role.size();
        add(m.content);
        add(m.reasoning_content);
        add(m.tool_calls_json);
        add(m.name);
    }
    add(in.tools_json);
    add(in.extra_context_json);
    add(in.bos_token);
    add(in.eos_token);
    jinja::RenderLimits limits = base ? *base : jinja::RenderLimits{};
    limits.max_steps += kStepsPerInputByte * input;
    limits.max_bytes += kBytesPerInputByte * input;
    return limits;
}

Value string_value(const std::string & s, const char * what) {
    if (!unicode::is_valid_utf8(s)) fail(SPARK_ERR_INVALID_FORMAT, "%s is not valid UTF-8", what);
    return Value::string(s);
}

}  // namespace

std::string render_chat_template(const std::string & tmpl, const ChatInputs & in, const jinja::RenderLimits * base_limits) {
    if (!unicode::is_valid_utf8(tmpl)) fail(SPARK_ERR_TEMPLATE, "chat template: not valid UTF-8");
    const auto parsed = jinja::parse_template(tmpl);

    jinja::List messages;
    for (size_t i = 0; i < in.messages.size(); ++i) {
        const ChatMessage & m = in.messages[i];
        jinja::Dict d;
        // transformers copies reasoning_content to "thinking" (first key) for templates that read it.
        if (m.reasoning_content) d.set(Value::string("thinking"), string_value(*m.reasoning_content, "reasoning_content"));
        d.set(Value::string("role"), string_value(m.role, "role"));
        d.set(Value::string("content"), m.content ? string_value(*m.content, "content") : Value::none());
        if (m.reasoning_content)
            d.set(Value::string("reasoning_content"), string_value(*m.reasoning_content, "reasoning_content"));
        if (m.tool_calls_json) {
            const auto j = parse_json(*m.tool_calls_json, "tool_calls_json");
            if (!j.is_array()) fail(SPARK_ERR_INVALID_FORMAT, "tool_calls_json of message %zu must be a JSON array", i);
            d.set(Value::string("tool_calls"), jinja::from_json(j));
        }
        if (m.name) d.set(Value::string("name"), string_value(*m.name, "name"));
        messages.push_back(Value::dict_of(std::move(d)));
    }

    jinja::Dict vars;
    vars.set(Value::string("messages"), Value::list_of(std::move(messages)));
    Value tools = Value::none();
    if (in.tools_json) {
        const auto j = parse_json(*in.tools_json, "tools_json");
        if (!j.is_array()) fail(SPARK_ERR_INVALID_FORMAT, "tools_json must be a JSON array");
        tools = jinja::from_json(j);
    }
    vars.set(Value::string("tools"), tools);
    vars.set(Value::string("documents"), Value::none());
    vars.set(Value::string("add_generation_prompt"), Value::boolean(in.add_generation_prompt));
    if (in.bos_token) vars.set(Value::string("bos_token"), string_value(*in.bos_token, "bos_token"));
    if (in.eos_token) vars.set(Value::string("eos_token"), string_value(*in.eos_token, "eos_token"));
    if (in.extra_context_json) {
        const auto j = parse_json(*in.extra_context_json, "extra_context_json");
        if (!j.is_object()) fail(SPARK_ERR_INVALID_FORMAT, "extra_context_json must be a JSON object");
        for (auto it = j.begin(); it != j.end(); ++it) {
            const std::string & key = it.key();
            if (key == "messages" || key == "tools" || key == "documents" || key == "add_generation_prompt")
                fail(SPARK_ERR_INVALID_ARGUMENT, "extra_context_json must not redefine '%s'", key.c_str());
            vars.set(Value::string(key), jinja::from_json(it.value()));
        }
    }
    return jinja::render(*parsed, vars, limits_for(in, base_limits));
}

}  // namespace spark
