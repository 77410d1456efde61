// Chat templates: renders a tokenizer_config.json chat template the way transformers'
// apply_chat_template does (jinja2 with trim_blocks/lstrip_blocks, the same globals and inputs).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace spark {

namespace jinja {
struct RenderLimits;
}

struct ChatMessage {
    std::string                role;
    std::optional<std::string> content;            // absent: rendered as none
    std::optional<std::string> reasoning_content;
    std::optional<std::string> tool_calls_json;    // a JSON array, becomes message.tool_calls
    std::optional<std::string> name;
};

struct ChatInputs {
    std::vector<ChatMessage>   messages;
    bool                       add_generation_prompt = false;
    std::optional<std::string> tools_json;          // a JSON array, becomes `tools` (none when absent)
    std::optional<std::string> extra_context_json;  // a JSON object, each key becomes a variable
    std::optional<std::string> bos_token, eos_token;
};

// Throws spark::Error: SPARK_ERR_TEMPLATE (syntax error, unsupported construct, raise_exception,
// evaluation error, a limit of the render reached; the message names the line or the limit),
// SPARK_ERR_INVALID_FORMAT (bad JSON inputs), SPARK_ERR_INVALID_ARGUMENT (extra context redefining
// messages/tools/...). The render's limits are `base_limits` (default: RenderLimits{}) plus room
// for the size of the inputs.
std::string render_chat_template(const std::string & tmpl, const ChatInputs & inputs,
                                 const jinja::RenderLimits * base_limits = nullptr);

}  // namespace spark
