// libFuzzer harness of spark-server's chat output parser (tools/server/chat_output.h): model output,
// which a server must take apart without trusting it, split into reasoning, content and tool calls.
//
// Input: one byte of options (bit 0: the request had tools, bit 1: the prompt opened <think>, bit 2:
// reasoning not parsed), one byte that seeds the stream's cuts, then the answer text.
//
// Findings: a crash or sanitizer report, an exception, a stream whose message differs from the
// whole text's for its split, or one that loses text: with no tool calls and reasoning not parsed,
// the content is the text exactly.
#include "chat_output.h"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

using spark_server::ChatDelta;
using spark_server::ChatOutput;
using spark_server::ChatOutputStream;
using spark_server::ParseOptions;

namespace {

const nlohmann::json & tools() {
    static const nlohmann::json t = nlohmann::json::parse(R"([
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            "s": {"type": "string"}, "n": {"type": "integer"}, "u": {"type": ["string", "null"]}}}}}])");
    return t;
}

bool same(const ChatOutput & a, const ChatOutput & b) {
    if (a.content != b.content || a.reasoning != b.reasoning || a.tool_calls.size() != b.tool_calls.size()) return false;
    for (size_t i = 0; i < a.tool_calls.size(); ++i) {
        if (a.tool_calls[i].name != b.tool_calls[i].name || a.tool_calls[i].arguments != b.tool_calls[i].arguments) return false;
    }
    return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    if (size < 2) return 0;
    ParseOptions o;
    o.parse_tool_calls    = data[0] & 1;
    o.starts_in_reasoning = data[0] & 2;
    o.parse_reasoning     = !(data[0] & 4);
    o.tools               = tools();
    o.make_tool_call_id   = [] { return std::string("call_x"); };
    uint32_t               seed = data[1] + 1u;
    const std::string_view text(reinterpret_cast<const char *>(data + 2), size - 2);

    const ChatOutput whole = spark_server::parse_chat_output(text, o);
    if (!o.parse_tool_calls && !o.parse_reasoning && whole.content != text) std::abort();

    // The same text streamed in pieces of 0..15 bytes; the deltas alone must rebuild the message.
    ChatOutputStream stream(o);
    ChatOutput       built;
    auto             apply = [&](const std::vector<ChatDelta> & deltas) {
        for (const ChatDelta & d : deltas) {
            if (d.kind == ChatDelta::Kind::reasoning) built.reasoning += d.text;
            if (d.kind == ChatDelta::Kind::content) built.content += d.text;
            if (d.kind == ChatDelta::Kind::tool_call) {
                if (d.tool_index != built.tool_calls.size()) std::abort();
                built.tool_calls.push_back(d.tool_call);
            }
        }
    };
    for (size_t at = 0; at < text.size();) {
        seed           = seed * 1103515245u + 12345u;
        const size_t n = (seed >> 16) % 16;
        apply(stream.push(text.substr(at, n)));
        at += n;
    }
    apply(stream.finish());
    if (!same(built, whole) || !same(stream.result(), whole)) std::abort();
    if (!stream.finish().empty()) std::abort();  // a second finish has nothing left
    return 0;
}
