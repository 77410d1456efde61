// The answer text of a chat completion split into the OpenAI message fields: `reasoning_content`
// (Qwen3's and MiniMax-M2's <think> ... </think>), `tool_calls` (<tool_call> blocks, Hermes JSON or
// Qwen3-Coder XML; MiniMax-M2's <minimax:tool_call> blocks) and `content` (the rest), whole for a
// response or incrementally for a stream.
//
// The input is the text decoded from the generated tokens (special tokens such as <|im_end|> are
// never in it; <think> and <tool_call> are plain text). Rules:
//   - reasoning: a <think> at the start of the answer (after optional whitespace), or the start of
//     the answer when the prompt already opened it, up to </think> or the end; trimmed of
//     whitespace on both sides, and the whitespace after </think> is dropped (as Qwen3 and
//     llama.cpp do, so a re-rendered message matches what the model wrote).
//   - tool calls (when the request had tools): each <tool_call> ... </tool_call> block after the
//     reasoning (up to the first </tool_call>), either
//       {"name": "f", "arguments": {...}}                              (Hermes / Qwen3; arguments may be a JSON string)
//       <function=f> <parameter=p> value </parameter> ... </function>  (Qwen3-Coder; a value loses one newline on
//                                                                        each side, and is JSON unless its schema
//                                                                        says string or it does not parse)
//     and each <minimax:tool_call> ... </minimax:tool_call> block, one call per
//       <invoke name="f"> <parameter name="p">value</parameter> ... </invoke>  (MiniMax-M2; values as Qwen3-Coder's)
//     Whitespace right before a tool call, and after the last one at the end, is dropped; content
//     does not start with the whitespace that follows the reasoning or a tool call.
//   - a block that does not parse, or is not closed by the end, stays in `content` as written: model
//     output is never dropped silently.
// The stream reaches the same message whatever the split of the text into pieces: it emits text as
// soon as it cannot be part of a tag (or of whitespace that may be dropped) and holds back the rest.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace spark_server {

struct ParseOptions {
    bool parse_reasoning     = true;   // false: the text is left as generated (<think> stays in content)
    bool starts_in_reasoning = false;  // the rendered prompt ended with an opening <think> (Qwen3 Thinking-2507)
    bool parse_tool_calls    = false;  // the request had tools
    // The request's tools, OpenAI format ([{"type": "function", "function": {"name", "parameters"}}]):
    // their JSON schemas say which Qwen3-Coder parameter values are strings and which are JSON.
    nlohmann::json tools = nlohmann::json::array();
    // Makes each tool call's id; empty: random_tool_call_id(). Tests inject a deterministic one.
    std::function<std::string()> make_tool_call_id;
};

struct ToolCall {
    std::string id;         // "call_..."
    std::string name;
    std::string arguments;  // a JSON object serialized compactly, as OpenAI sends it
};

struct ChatOutput {
    std::string           content;
    std::string           reasoning;
    std::vector<ToolCall> tool_calls;
};

// One piece of a streamed message, in the order of the text.
struct ChatDelta {
    enum class Kind { reasoning, content, tool_call };
    Kind        kind = Kind::content;
    std::string text;            // Kind::reasoning and Kind::content: the new text
    ToolCall    tool_call;       // Kind::tool_call: the whole call (a call is only sent once complete)
    size_t      tool_index = 0;  // Kind::tool_call: its position among the message's calls (OpenAI's `index`)
};

class ChatOutputStream {
public:
    explicit ChatOutputStream(ParseOptions options);

    // Feeds the next piece of the answer text; returns what became final (adjacent text of one kind
    // merged into one delta). Text that may still be the start of a tag is held back.
    std::vector<ChatDelta> push(std::string_view text);
    // The answer is complete: returns the held-back rest. A push() afterwards throws std::logic_error.
    std::vector<ChatDelta> finish();

    // Everything emitted so far, as one message (after finish(): equal to parse_chat_output's).
    const ChatOutput & result() const { return out_; }

private:
    enum class Mode { start, reasoning, content, tool_call };

    void advance(bool at_end);
    void emit_reasoning(std::string_view text);
    void emit_content(std::string_view text);
    void emit_tool_call(ToolCall call);

    ParseOptions             options_;
    Mode                     mode_;
    std::string              pending_;                  // received, not yet emitted or discarded
    size_t                   block_     = 0;            // tool_call mode: which kind of block (kCallBlocks)
    size_t                   scan_from_ = 0;            // tool_call mode: where its close tag may start in pending_
    std::string              call_prefix_;              // tool_call mode: whitespace + "<tool_call>", content if no call
    bool                     in_reasoning_    = false;  // non-whitespace reasoning was emitted (the leading trim is done)
    bool                     drop_content_ws_ = false;  // no content yet after </think> or a call: leading whitespace goes
    bool                     last_was_call_   = false;  // a call was emitted last: whitespace at the end goes
    bool                     finished_        = false;
    ChatOutput               out_;
    std::vector<ChatDelta> * deltas_ = nullptr;         // the batch push() or finish() is filling
};

// The whole message of a complete answer.
ChatOutput parse_chat_output(std::string_view text, const ParseOptions & options);

// OpenAI's finish_reason: "length" when generation hit its token limit, else "tool_calls" when the
// message has tool calls, else "stop" (a stop string or the end-of-turn token).
std::string_view finish_reason(const ChatOutput & message, bool hit_length_limit);

// "call_" + 24 random letters and digits.
std::string random_tool_call_id();

}  // namespace spark_server
