#include "chat_output.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>
#include <random>
#include <stdexcept>
#include <utility>

namespace spark_server {

namespace {

using ordered_json = nlohmann::ordered_json;  // keeps the model's key order in arguments

constexpr std::string_view kWhitespace = " \t\n\r\f\v";
constexpr std::string_view kThinkOpen  = "<think>";
constexpr std::string_view kThinkClose = "</think>";

// The tool-call blocks a model may write, each with its own body syntax (parse_call_block).
struct CallBlock {
    std::string_view open, close;
};
constexpr CallBlock kCallBlocks[] = {
    {"<tool_call>", "</tool_call>"},                  // Hermes JSON or Qwen3-Coder XML, one call
    {"<minimax:tool_call>", "</minimax:tool_call>"},  // MiniMax-M2: one or more <invoke>
};
constexpr size_t kMiniMaxBlock = 1;

bool is_space(char c) { return kWhitespace.find(c) != std::string_view::npos; }

std::string_view trim_left(std::string_view s) {
    size_t b = s.find_first_not_of(kWhitespace);
    return b == std::string_view::npos ? std::string_view{} : s.substr(b);
}

std::string_view trim_right(std::string_view s) {
    size_t e = s.find_last_not_of(kWhitespace);
    return e == std::string_view::npos ? std::string_view{} : s.substr(0, e + 1);
}

std::string_view trim(std::string_view s) { return trim_right(trim_left(s)); }

// Length of the longest end of `s` that is the start of `tag` but not all of it: text the next piece
// may complete into the tag, so it is held back.
size_t partial_tag_length(std::string_view s, std::string_view tag) {
    for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
        if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
    }
    return 0;
}

// End of `s[0, end)` without its trailing whitespace.
size_t end_before_whitespace(std::string_view s, size_t end) {
    while (end > 0 && is_space(s[end - 1])) --end;
    return end;
}

std::string dump_compact(const ordered_json & j) {
    // replace: a model may write invalid UTF-8 inside a string; dump() would throw on it.
    return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

// Hermes / Qwen3: {"name": "f", "arguments": {...}}. Some models send arguments as a JSON string:
// it is passed on compacted when it holds JSON, as written otherwise (the client sees what the
// model meant; OpenAI's arguments are not guaranteed valid JSON either).
std::optional<ToolCall> parse_json_call(std::string_view body) {
    ordered_json j = ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return std::nullopt;
    auto name = j.find("name");
    if (name == j.end() || !name->is_string() || name->get_ref<const std::string &>().empty()) return std::nullopt;
    ToolCall call;
    call.name = name->get<std::string>();
    auto args = j.find("arguments");
    if (args == j.end() || args->is_null()) {
        call.arguments = "{}";  // a call without parameters
    } else if (args->is_object()) {
        call.arguments = dump_compact(*args);
    } else if (args->is_string()) {
        const std::string & s = args->get_ref<const std::string &>();
        ordered_json inner    = ordered_json::parse(s, nullptr, false);
        call.arguments        = inner.is_discarded() ? s : dump_compact(inner);
    } else {
        return std::nullopt;
    }
    return call;
}

// The JSON schema of parameter `param` of tool `function` in the request's tools; nullptr if unknown.
const nlohmann::json * parameter_schema(const nlohmann::json & tools, std::string_view function, std::string_view param) {
    if (!tools.is_array()) return nullptr;
    for (const auto & tool : tools) {
        if (!tool.is_object()) continue;
        auto fn = tool.find("function");
        if (fn == tool.end() || !fn->is_object()) continue;
        auto name = fn->find("name");
        if (name == fn->end() || !name->is_string() || name->get_ref<const std::string &>() != function) continue;
        auto params = fn->find("parameters");
        if (params == fn->end() || !params->is_object()) return nullptr;
        auto props = params->find("properties");
        if (props == params->end() || !props->is_object()) return nullptr;
        auto schema = props->find(std::string(param));
        return schema == props->end() ? nullptr : &*schema;
    }
    return nullptr;
}

// "type": "string" or "type": [..., "string", ...].
bool schema_allows_string(const nlohmann::json * schema) {
    if (schema == nullptr || !schema->is_object()) return false;
    auto type = schema->find("type");
    if (type == schema->end()) return false;
    if (type->is_string()) return *type == "string";
    if (type->is_array()) {
        for (const auto & t : *type) {
            if (t == "string") return true;
        }
    }
    return false;
}

// Qwen3-Coder writes every value as bare text: a string parameter stays text (even "42" or "true");
// any other (or unknown) parameter is read as JSON when it parses, else kept as text.
ordered_json typed_value(std::string_view text, const nlohmann::json * schema) {
    if (!schema_allows_string(schema)) {
        ordered_json j = ordered_json::parse(text, nullptr, false);
        if (!j.is_discarded()) return j;
    }
    return ordered_json(std::string(text));
}

// Qwen3-Coder:
//   <function=NAME>
//   <parameter=P>
//   VALUE
//   </parameter>
//   </function>
// The value is the text between the tags less one newline on each side (the template puts them
// there). A missing </function> at the end of the block is tolerated; anything else is not.
std::optional<ToolCall> parse_xml_call(std::string_view body, const nlohmann::json & tools) {
    constexpr std::string_view kFunctionOpen = "<function=", kFunctionClose = "</function>";
    constexpr std::string_view kParamOpen = "<parameter=", kParamClose = "</parameter>";
    std::string_view rest = trim(body);
    if (!rest.starts_with(kFunctionOpen)) return std::nullopt;
    rest.remove_prefix(kFunctionOpen.size());
    size_t gt = rest.find('>');
    if (gt == std::string_view::npos) return std::nullopt;
    ToolCall call;
    call.name = std::string(trim(rest.substr(0, gt)));
    if (call.name.empty()) return std::nullopt;
    rest.remove_prefix(gt + 1);

    ordered_json args = ordered_json::object();
    while (true) {
        rest = trim_left(rest);
        if (rest.empty()) break;
        if (rest.starts_with(kFunctionClose)) {
            if (!trim(rest.substr(kFunctionClose.size())).empty()) return std::nullopt;
            break;
        }
        if (!rest.starts_with(kParamOpen)) return std::nullopt;
        rest.remove_prefix(kParamOpen.size());
        gt = rest.find('>');
        if (gt == std::string_view::npos) return std::nullopt;
        std::string_view param = trim(rest.substr(0, gt));
        if (param.empty()) return std::nullopt;
        rest.remove_prefix(gt + 1);
        size_t close = rest.find(kParamClose);
        if (close == std::string_view::npos) return std::nullopt;
        std::string_view value = rest.substr(0, close);
        if (value.starts_with('\n')) value.remove_prefix(1);
        if (value.ends_with('\n')) value.remove_suffix(1);
        args[std::string(param)] = typed_value(value, parameter_schema(tools, call.name, param));
        rest.remove_prefix(close + kParamClose.size());
    }
    call.arguments = dump_compact(args);
    return call;
}

// The value of attribute `name="..."` (or '...') at the start of `s` (after whitespace), with the
// rest after the closing '>' in `rest`; nullopt if `s` does not start so.
std::optional<std::string_view> name_attribute(std::string_view s, std::string_view & rest) {
    constexpr std::string_view kName = "name=";
    s = trim_left(s);
    if (!s.starts_with(kName) || s.size() <= kName.size()) return std::nullopt;
    const char quote = s[kName.size()];
    if (quote != '"' && quote != '\'') return std::nullopt;
    s.remove_prefix(kName.size() + 1);
    const size_t end = s.find(quote);
    if (end == std::string_view::npos) return std::nullopt;
    std::string_view value = s.substr(0, end), after = trim_left(s.substr(end + 1));
    if (!after.starts_with('>')) return std::nullopt;
    rest = after.substr(1);
    return value;
}

// MiniMax-M2 (its chat template shows the model this form):
//   <invoke name="NAME">
//   <parameter name="P">VALUE</parameter>
//   </invoke>
// one or more invokes per block. The template writes a value as text when it is a string and as
// JSON otherwise, so a value is read as Qwen3-Coder's are: typed by the tool's schema, less one
// newline on each side. The block is calls only: anything else in it, and it stays content.
std::optional<std::vector<ToolCall>> parse_invoke_block(std::string_view body, const nlohmann::json & tools) {
    constexpr std::string_view kInvokeOpen = "<invoke", kInvokeClose = "</invoke>";
    constexpr std::string_view kParamOpen = "<parameter", kParamClose = "</parameter>";
    std::vector<ToolCall> calls;
    std::string_view      rest = trim(body);
    while (!rest.empty()) {
        if (!rest.starts_with(kInvokeOpen)) return std::nullopt;
        std::optional<std::string_view> name = name_attribute(rest.substr(kInvokeOpen.size()), rest);
        if (!name || trim(*name).empty()) return std::nullopt;
        ToolCall call;
        call.name         = std::string(trim(*name));
        ordered_json args = ordered_json::object();
        while (true) {
            rest = trim_left(rest);
            if (rest.starts_with(kInvokeClose)) {
                rest = trim_left(rest.substr(kInvokeClose.size()));
                break;
            }
            if (!rest.starts_with(kParamOpen)) return std::nullopt;  // also: an invoke not closed
            std::optional<std::string_view> param = name_attribute(rest.substr(kParamOpen.size()), rest);
            if (!param || param->empty()) return std::nullopt;
            const size_t close = rest.find(kParamClose);
            if (close == std::string_view::npos) return std::nullopt;
            std::string_view value = rest.substr(0, close);
            if (value.starts_with('\n')) value.remove_prefix(1);
            if (value.ends_with('\n')) value.remove_suffix(1);
            args[std::string(*param)] = typed_value(value, parameter_schema(tools, call.name, *param));
            rest.remove_prefix(close + kParamClose.size());
        }
        call.arguments = dump_compact(args);
        calls.push_back(std::move(call));
    }
    if (calls.empty()) return std::nullopt;
    return calls;
}

// The text between the open and close tags of block kind `block`; nullopt when it is not calls (it
// then stays content).
std::optional<std::vector<ToolCall>> parse_call_block(size_t block, std::string_view body, const nlohmann::json & tools) {
    if (block == kMiniMaxBlock) return parse_invoke_block(body, tools);
    std::string_view        t = trim(body);
    std::optional<ToolCall> call;
    if (t.starts_with('{')) call = parse_json_call(t);
    if (t.starts_with('<')) call = parse_xml_call(t, tools);
    if (!call) return std::nullopt;
    return std::vector<ToolCall>{std::move(*call)};
}

}  // namespace

std::string random_tool_call_id() {
    static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    thread_local std::mt19937_64 rng{(uint64_t(std::random_device{}()) << 32) ^ std::random_device{}()};
    std::uniform_int_distribution<size_t> pick(0, kAlphabet.size() - 1);
    std::string id = "call_";
    for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
    return id;
}

ChatOutputStream::ChatOutputStream(ParseOptions options) : options_(std::move(options)) {
    if (!options_.parse_reasoning) {
        mode_ = Mode::content;
    } else {
        mode_ = options_.starts_in_reasoning ? Mode::reasoning : Mode::start;
    }
}

std::vector<ChatDelta> ChatOutputStream::push(std::string_view text) {
    if (finished_) throw std::logic_error("ChatOutputStream::push after finish");
    std::vector<ChatDelta> deltas;
    deltas_ = &deltas;
    pending_.append(text);
    advance(false);
    deltas_ = nullptr;
    return deltas;
}

std::vector<ChatDelta> ChatOutputStream::finish() {
    std::vector<ChatDelta> deltas;
    if (finished_) return deltas;
    deltas_ = &deltas;
    advance(true);
    deltas_  = nullptr;
    finished_ = true;
    return deltas;
}

// Consumes pending_ as far as it is decided. Each mode either emits and moves on (continue) or waits
// for more text (return). At the end every mode empties pending_.
void ChatOutputStream::advance(bool at_end) {
    while (true) {
        std::string_view p = pending_;
        switch (mode_) {
        case Mode::start: {
            // Is there a <think> after the leading whitespace? The whitespace is content if not.
            std::string_view rest = trim_left(p);
            if (rest.starts_with(kThinkOpen)) {
                pending_.erase(0, p.size() - rest.size() + kThinkOpen.size());
                mode_ = Mode::reasoning;
                continue;
            }
            if (!at_end && kThinkOpen.starts_with(rest)) return;  // empty, or a part of the tag
            mode_ = Mode::content;
            continue;
        }
        case Mode::reasoning: {
            size_t close = p.find(kThinkClose);
            if (close != std::string_view::npos) {
                emit_reasoning(trim_right(p.substr(0, close)));
                pending_.erase(0, close + kThinkClose.size());
                mode_            = Mode::content;
                drop_content_ws_ = true;
                continue;
            }
            if (at_end) {  // never closed: all of it was reasoning
                emit_reasoning(trim_right(p));
                pending_.clear();
                return;
            }
            // Hold back a partial </think> and the whitespace before it (trimmed if the tag comes).
            size_t cut = end_before_whitespace(p, p.size() - partial_tag_length(p, kThinkClose));
            emit_reasoning(p.substr(0, cut));
            pending_.erase(0, cut);
            return;
        }
        case Mode::content: {
            if (!options_.parse_tool_calls) {
                emit_content(p);
                pending_.clear();
                return;
            }
            // The first block tag in the text; the longest partial tag at its end.
            size_t open = std::string_view::npos, partial = 0;
            for (size_t b = 0; b < std::size(kCallBlocks); ++b) {
                const size_t at = p.find(kCallBlocks[b].open);
                if (at < open) open = at, block_ = b;
                partial = std::max(partial, partial_tag_length(p, kCallBlocks[b].open));
            }
            if (open == std::string_view::npos && at_end) {
                // Whitespace after the last tool call is dropped; text after it keeps its whitespace.
                if (!(last_was_call_ && trim_left(p).empty())) emit_content(p);
                pending_.clear();
                return;
            }
            // Emit up to the tag (or a partial tag), holding back the whitespace before it: it is
            // dropped if the block turns out to be a tool call.
            size_t text_end = open != std::string_view::npos ? open : p.size() - partial;
            size_t cut      = end_before_whitespace(p, text_end);
            emit_content(p.substr(0, cut));
            if (open == std::string_view::npos) {
                pending_.erase(0, cut);
                return;
            }
            const std::string_view tag = kCallBlocks[block_].open;
            call_prefix_               = pending_.substr(cut, open + tag.size() - cut);
            pending_.erase(0, open + tag.size());
            scan_from_ = 0;
            mode_      = Mode::tool_call;
            continue;
        }
        case Mode::tool_call: {
            const std::string_view tag_close = kCallBlocks[block_].close;
            size_t                 close     = p.find(tag_close, scan_from_);
            if (close == std::string_view::npos) {
                if (at_end) {  // never closed: the raw text is content
                    emit_content(call_prefix_ + pending_);
                    pending_.clear();
                    call_prefix_.clear();
                    mode_ = Mode::content;
                    return;
                }
                // The next search only needs to look at what may complete a tag with new text.
                scan_from_ = p.size() >= tag_close.size() ? p.size() - tag_close.size() + 1 : 0;
                return;
            }
            std::string_view body = p.substr(0, close);
            if (std::optional<std::vector<ToolCall>> calls = parse_call_block(block_, body, options_.tools)) {
                for (ToolCall & call : *calls) emit_tool_call(std::move(call));
            } else {
                emit_content(call_prefix_ + std::string(body) + std::string(tag_close));
            }
            pending_.erase(0, close + tag_close.size());
            call_prefix_.clear();
            mode_ = Mode::content;
            continue;
        }
        }
    }
}

void ChatOutputStream::emit_reasoning(std::string_view text) {
    if (!in_reasoning_) {
        text = trim_left(text);
        if (text.empty()) return;
        in_reasoning_ = true;
    }
    if (text.empty()) return;
    out_.reasoning.append(text);
    if (!deltas_->empty() && deltas_->back().kind == ChatDelta::Kind::reasoning) {
        deltas_->back().text.append(text);
    } else {
        deltas_->push_back(ChatDelta{ChatDelta::Kind::reasoning, std::string(text), {}, 0});
    }
}

void ChatOutputStream::emit_content(std::string_view text) {
    if (drop_content_ws_) {
        text = trim_left(text);
        if (text.empty()) return;
        drop_content_ws_ = false;
    }
    if (text.empty()) return;
    last_was_call_ = false;
    out_.content.append(text);
    if (!deltas_->empty() && deltas_->back().kind == ChatDelta::Kind::content) {
        deltas_->back().text.append(text);
    } else {
        deltas_->push_back(ChatDelta{ChatDelta::Kind::content, std::string(text), {}, 0});
    }
}

void ChatOutputStream::emit_tool_call(ToolCall call) {
    call.id          = options_.make_tool_call_id ? options_.make_tool_call_id() : random_tool_call_id();
    if (out_.content.empty()) drop_content_ws_ = true;  // content does not start with the whitespace after a call
    last_was_call_ = true;
    out_.tool_calls.push_back(call);
    deltas_->push_back(ChatDelta{ChatDelta::Kind::tool_call, {}, std::move(call), out_.tool_calls.size() - 1});
}

ChatOutput parse_chat_output(std::string_view text, const ParseOptions & options) {
    ChatOutputStream stream(options);
    stream.push(text);
    stream.finish();
    return stream.result();
}

std::string_view finish_reason(const ChatOutput & message, bool hit_length_limit) {
    if (hit_length_limit) return "length";
    return message.tool_calls.empty() ? "stop" : "tool_calls";
}

}  // namespace spark_server
