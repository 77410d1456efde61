// libFuzzer harness of the chat templates: parse and render a template the way the library does
// (render_chat_template, the function behind spark_chat_apply_template).
//
// Input: the template, then optionally a 0 byte and the inputs as JSON, in the form of the chat
// goldens: {"messages": [...], "tools": [...], "extra": {...}, "add_generation_prompt": bool}, or
// just the messages array. Without a (valid) JSON part the template renders a small conversation
// with a system prompt, a tool call, its result and tools.
//
// Template errors of every kind are expected (SPARK_ERR_TEMPLATE and the input errors); anything
// else is a finding: a crash or sanitizer report, another exception (std::bad_alloc would mean that
// an allocation escaped the memory budget), or a render that leaves shared values alive (a leak
// through a reference cycle).
#include "common/error.h"
#include "text/chat_template.h"
#include "text/jinja_value.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace {

using nlohmann::ordered_json;

const char * const kDefaultInputs = R"({
  "messages": [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Weather in Paris? <b>&</b>"},
    {"role": "assistant", "content": "<think>\nlook it up\n</think>\n\n", "tool_calls":
      [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}}]},
    {"role": "tool", "content": "{\"temp\": 21.5}", "name": "get_weather"},
    {"role": "assistant", "content": "It is 21.5 \u00b0C.", "reasoning_content": "easy"}],
  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
  "add_generation_prompt": true})";

std::optional<std::string> string_field(const ordered_json & m, const char * key) {
    if (!m.contains(key) || !m[key].is_string()) return std::nullopt;
    return m[key].get<std::string>();
}

std::optional<std::string> json_field(const ordered_json & m, const char * key) {
    if (!m.contains(key) || m[key].is_null()) return std::nullopt;
    return m[key].dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

spark::ChatInputs inputs_of(const ordered_json & j) {
    spark::ChatInputs in;
    const ordered_json * messages = j.is_array() ? &j : (j.is_object() && j.contains("messages") ? &j["messages"] : nullptr);
    if (messages && messages->is_array()) {
        for (const auto & m : *messages) {
            if (!m.is_object()) continue;
            spark::ChatMessage cm;
            cm.role              = string_field(m, "role").value_or("user");
            cm.content           = string_field(m, "content");
            cm.reasoning_content = string_field(m, "reasoning_content");
            cm.tool_calls_json   = json_field(m, "tool_calls");
            cm.name              = string_field(m, "name");
            in.messages.push_back(std::move(cm));
        }
    }
    if (j.is_object()) {
        in.tools_json         = json_field(j, "tools");
        in.extra_context_json = json_field(j, "extra");
        in.add_generation_prompt = j.contains("add_generation_prompt") && j["add_generation_prompt"].is_boolean() &&
                                   j["add_generation_prompt"].get<bool>();
    }
    in.bos_token = "<s>";
    in.eos_token = "</s>";
    return in;
}

// Limits a hundred times smaller than a host's: every input runs in milliseconds under the
// sanitizers, and the same code paths stop it.
const spark::jinja::RenderLimits & fuzz_limits() {
    static const spark::jinja::RenderLimits limits = [] {
        spark::jinja::RenderLimits l;
        l.max_steps = l.max_steps / 100;
        l.max_bytes = l.max_bytes / 100;
        return l;
    }();
    return limits;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string input(reinterpret_cast<const char *>(data), size);
    const size_t split = input.find('\0');
    const std::string tmpl = input.substr(0, split);
    ordered_json j;
    if (split != std::string::npos) j = ordered_json::parse(input.substr(split + 1), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || j.is_null()) j = ordered_json::parse(kDefaultInputs);
    const spark::ChatInputs in = inputs_of(j);

    // The first render creates the evaluator's globals, which live as long as the process.
    static const bool globals_made = [] {
        spark::render_chat_template("", spark::ChatInputs{});
        return true;
    }();
    (void) globals_made;
    const int64_t live_before = spark::jinja::live_shared_values();
    try {
        const std::string out = spark::render_chat_template(tmpl, in, &fuzz_limits());
        // The output counts against the memory budget, which grows by 8 bytes per input byte.
        const size_t inputs = input.size() + std::strlen(kDefaultInputs);
        if (out.size() > fuzz_limits().max_bytes + 8 * inputs) {
            std::fprintf(stderr, "output of %zu bytes beyond the memory budget\n", out.size());
            std::abort();
        }
    } catch (const spark::Error & e) {
        const spark_status st = e.status();
        if (st != SPARK_ERR_TEMPLATE && st != SPARK_ERR_INVALID_FORMAT && st != SPARK_ERR_INVALID_ARGUMENT) {
            std::fprintf(stderr, "unexpected status %d: %s\n", int(st), e.what());
            std::abort();
        }
    }
    if (spark::jinja::live_shared_values() != live_before) {
        std::fprintf(stderr, "the render left %lld shared values alive\n",
                     (long long) (spark::jinja::live_shared_values() - live_before));
        std::abort();
    }
    return 0;
}
