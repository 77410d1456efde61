// spark-server's chat output parser: Qwen3 and MiniMax-M2 answers split into content, reasoning_content
// and tool_calls (Hermes JSON, Qwen3-Coder XML, MiniMax-M2 invokes), whole and streamed; a stream reaches the same
// message for every split of the text into pieces.
#include "chat_output.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <random>
#include <string>
#include <vector>

using spark_server::ChatDelta;
using spark_server::ChatOutput;
using spark_server::ChatOutputStream;
using spark_server::parse_chat_output;
using spark_server::ParseOptions;

namespace {

// Ids call_0, call_1, ... per stream (each stream copies the options, and with them the counter).
ParseOptions options(bool tool_calls, bool starts_in_reasoning = false, nlohmann::json tools = nlohmann::json::array()) {
    ParseOptions o;
    o.parse_tool_calls    = tool_calls;
    o.starts_in_reasoning = starts_in_reasoning;
    o.tools               = std::move(tools);
    o.make_tool_call_id   = [n = 0]() mutable { return "call_" + std::to_string(n++); };
    return o;
}

const nlohmann::json & weather_tools() {
    static const nlohmann::json tools = nlohmann::json::parse(R"([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city",
         "parameters": {"type": "object", "required": ["city"], "properties": {
             "city": {"type": "string"}, "zip": {"type": "string"}, "days": {"type": "integer"},
             "units": {"type": ["string", "null"], "enum": ["metric", "imperial"]},
             "options": {"type": "object", "properties": {"hourly": {"type": "boolean"}}},
             "fields": {"type": "array", "items": {"type": "string"}}}}}},
        {"type": "function", "function": {"name": "write_file",
         "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}}}
    ])");
    return tools;
}

// Streams `text` cut at `cuts` (ascending offsets) and rebuilds the message from the deltas alone.
ChatOutput stream_pieces(std::string_view text, const ParseOptions & o, const std::vector<size_t> & cuts) {
    ChatOutputStream stream(o);
    ChatOutput       built;
    auto             apply = [&](const std::vector<ChatDelta> & deltas) {
        for (const ChatDelta & d : deltas) {
            switch (d.kind) {
            case ChatDelta::Kind::reasoning: built.reasoning += d.text; break;
            case ChatDelta::Kind::content: built.content += d.text; break;
            case ChatDelta::Kind::tool_call:
                CHECK(d.tool_index == built.tool_calls.size());
                built.tool_calls.push_back(d.tool_call);
                break;
            }
        }
    };
    size_t from = 0;
    for (size_t cut : cuts) {
        apply(stream.push(text.substr(from, cut - from)));
        from = cut;
    }
    apply(stream.push(text.substr(from)));
    apply(stream.finish());
    CHECK(stream.result().content == built.content);
    CHECK(stream.result().reasoning == built.reasoning);
    CHECK(stream.result().tool_calls.size() == built.tool_calls.size());
    return built;
}

std::vector<size_t> every(size_t step, size_t size) {
    std::vector<size_t> cuts;
    for (size_t i = step; i < size; i += step) cuts.push_back(i);
    return cuts;
}

bool same(const ChatOutput & a, const ChatOutput & b) {
    if (a.content != b.content || a.reasoning != b.reasoning || a.tool_calls.size() != b.tool_calls.size()) return false;
    for (size_t i = 0; i < a.tool_calls.size(); ++i) {
        const auto &x = a.tool_calls[i], &y = b.tool_calls[i];
        if (x.id != y.id || x.name != y.name || x.arguments != y.arguments) return false;
    }
    return true;
}

// Every single split point, 1, 2, 3 and 7 characters at a time, and random cuts.
void check_stream_matches_whole(std::string_view text, const ParseOptions & o) {
    const ChatOutput whole = parse_chat_output(text, o);
    CAPTURE(text);
    for (size_t i = 0; i <= text.size(); ++i) {
        CAPTURE(i);
        REQUIRE(same(stream_pieces(text, o, {i}), whole));
    }
    for (size_t step : {1, 2, 3, 7}) {
        CAPTURE(step);
        REQUIRE(same(stream_pieces(text, o, every(step, text.size())), whole));
    }
    std::mt19937 rng(1234);
    for (int round = 0; round < 20; ++round) {
        std::vector<size_t> cuts;
        for (size_t at = 0; (at += rng() % 12) < text.size();) cuts.push_back(at);
        CAPTURE(round);
        REQUIRE(same(stream_pieces(text, o, cuts), whole));
    }
}

std::string content_of(const std::vector<ChatDelta> & deltas) {
    std::string s;
    for (const ChatDelta & d : deltas) {
        if (d.kind == ChatDelta::Kind::content) s += d.text;
    }
    return s;
}

std::string reasoning_of(const std::vector<ChatDelta> & deltas) {
    std::string s;
    for (const ChatDelta & d : deltas) {
        if (d.kind == ChatDelta::Kind::reasoning) s += d.text;
    }
    return s;
}

// Real-looking Qwen3 answers.
const std::string kThinkThenAnswer =
    "<think>\nThe user says hello. I should greet them back and offer help.\n</think>\n\nHello! How can I help you today?";
const std::string kThinkThenCall =
    "<think>\nThe user wants the forecast for Paris for three days. I'll call get_weather.\n</think>\n\n"
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>";
const std::string kTwoCalls =
    "I'll look up both cities.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Tokyo\", \"units\": \"metric\"}}\n</tool_call>";
const std::string kCoderCall =
    "I'll create the script now.\n\n<tool_call>\n<function=write_file>\n<parameter=path>\nhello.py\n</parameter>\n"
    "<parameter=content>\ndef main():\n    print(\"hello\")\n\nmain()\n</parameter>\n</function>\n</tool_call>";
const std::string kBadThenGood =
    "Trying.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n\nDone <tool";
// A MiniMax-M2 answer as its chat template shows the model to write one: the prompt ends in
// "<think>\n" (starts_in_reasoning), two calls in one block, values as text or JSON.
const std::string kMiniMaxCalls =
    "The user wants Paris and Tokyo. Two calls.\n</think>\n\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n"
    "<parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">3</parameter>\n"
    "<parameter name=\"options\">{\"hourly\": true}</parameter>\n</invoke>\n<invoke name=\"get_weather\">\n"
    "<parameter name=\"city\">Tokyo</parameter>\n<parameter name=\"zip\">100</parameter>\n</invoke>\n</minimax:tool_call>";

}  // namespace

TEST_CASE("chat output: plain content passes through unchanged") {
    for (bool tools : {false, true}) {
        ChatOutput m = parse_chat_output("  Hello! 2 < 3 and <b>bold</b> stay as written.\n", options(tools));
        CHECK(m.content == "  Hello! 2 < 3 and <b>bold</b> stay as written.\n");
        CHECK(m.reasoning.empty());
        CHECK(m.tool_calls.empty());
        CHECK(spark_server::finish_reason(m, false) == "stop");
        CHECK(spark_server::finish_reason(m, true) == "length");
    }
    CHECK(parse_chat_output("", options(true)).content.empty());
}

TEST_CASE("chat output: reasoning and content, trimmed as Qwen3 does") {
    ChatOutput m = parse_chat_output(kThinkThenAnswer, options(false));
    CHECK(m.reasoning == "The user says hello. I should greet them back and offer help.");
    CHECK(m.content == "Hello! How can I help you today?");

    m = parse_chat_output("\n <think>\n\nabc\n</think>\n\n\n  Answer\n", options(false));  // whitespace before <think> too
    CHECK(m.reasoning == "abc");
    CHECK(m.content == "Answer\n");

    m = parse_chat_output("<think>\n\n</think>\n\nHi", options(false));  // the empty block of a non-thinking turn
    CHECK(m.reasoning.empty());
    CHECK(m.content == "Hi");

    m = parse_chat_output("Use <think> tags.</think>", options(false));  // not at the start: plain text
    CHECK(m.reasoning.empty());
    CHECK(m.content == "Use <think> tags.</think>");
}

TEST_CASE("chat output: starts_in_reasoning (the prompt opened <think>)") {
    ChatOutput m = parse_chat_output("Paris is in France, so the answer is Paris.\n</think>\n\nThe capital is **Paris**.",
                                     options(false, true));
    CHECK(m.reasoning == "Paris is in France, so the answer is Paris.");
    CHECK(m.content == "The capital is **Paris**.");

    m = parse_chat_output("Still thinking about it", options(false, true));  // cut off inside the reasoning
    CHECK(m.reasoning == "Still thinking about it");
    CHECK(m.content.empty());
}

TEST_CASE("chat output: an unclosed <think> makes the rest reasoning") {
    ChatOutput m = parse_chat_output("<think>\nLet me work out 17 * 23.\n17 * 20 = 340 <tool_call> ", options(true));
    CHECK(m.reasoning == "Let me work out 17 * 23.\n17 * 20 = 340 <tool_call>");
    CHECK(m.content.empty());
    CHECK(m.tool_calls.empty());
}

TEST_CASE("chat output: parse_reasoning=false leaves <think> in content") {
    ParseOptions o    = options(false);
    o.parse_reasoning = false;
    CHECK(parse_chat_output(kThinkThenAnswer, o).content == kThinkThenAnswer);
    CHECK(parse_chat_output(kThinkThenAnswer, o).reasoning.empty());
    o.starts_in_reasoning = true;  // ignored: nothing is taken out of the text
    CHECK(parse_chat_output("x</think>\n\ny", o).content == "x</think>\n\ny");
}

TEST_CASE("chat output: one Hermes tool call after reasoning") {
    ParseOptions o = options(true, false, weather_tools());
    o.make_tool_call_id = nullptr;  // the real random ids
    ChatOutput m = parse_chat_output(kThinkThenCall, o);
    CHECK(m.reasoning == "The user wants the forecast for Paris for three days. I'll call get_weather.");
    CHECK(m.content.empty());
    REQUIRE(m.tool_calls.size() == 1);
    CHECK(m.tool_calls[0].name == "get_weather");
    CHECK(m.tool_calls[0].arguments == R"({"city":"Paris","days":3})");
    const std::string & id = m.tool_calls[0].id;
    CHECK(id.size() == 29);
    CHECK(id.starts_with("call_"));
    CHECK(id.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", 5) == std::string::npos);
    CHECK(spark_server::finish_reason(m, false) == "tool_calls");
    CHECK(spark_server::finish_reason(m, true) == "length");
    CHECK(parse_chat_output(kThinkThenCall, o).tool_calls[0].id != id);  // random each time
}

TEST_CASE("chat output: two Hermes tool calls with text before them") {
    ChatOutput m = parse_chat_output(kTwoCalls, options(true));
    CHECK(m.content == "I'll look up both cities.");  // the newline before the call is the template's, not content
    REQUIRE(m.tool_calls.size() == 2);
    CHECK(m.tool_calls[0].id == "call_0");
    CHECK(m.tool_calls[0].arguments == R"({"city":"Paris"})");
    CHECK(m.tool_calls[1].id == "call_1");
    CHECK(m.tool_calls[1].name == "get_weather");
    CHECK(m.tool_calls[1].arguments == R"({"city":"Tokyo","units":"metric"})");

    m = parse_chat_output(kTwoCalls + "\n\nBoth are on their way.", options(true));  // text after the calls is kept
    CHECK(m.content == "I'll look up both cities.\n\nBoth are on their way.");
    CHECK(m.tool_calls.size() == 2);
    // Content that follows a call starts at its text.
    m = parse_chat_output("<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>\n\nAsked.", options(true));
    CHECK(m.content == "Asked.");
    CHECK(m.tool_calls.size() == 1);
}

TEST_CASE("chat output: Hermes arguments as a JSON string, in the model's key order, or absent") {
    ChatOutput m = parse_chat_output(R"(<tool_call>
{"name": "get_weather", "arguments": "{\"zip\": \"75001\", \"days\": 2}"}
</tool_call>)",
                                     options(true));
    REQUIRE(m.tool_calls.size() == 1);
    CHECK(m.tool_calls[0].arguments == R"({"zip":"75001","days":2})");

    m = parse_chat_output(R"(<tool_call>
{"name": "f", "arguments": {"b": [1, 2], "a": {"y": null, "x": "é"}}}
</tool_call>)",
                          options(true));
    REQUIRE(m.tool_calls.size() == 1);
    CHECK(m.tool_calls[0].arguments == R"({"b":[1,2],"a":{"y":null,"x":"é"}})");

    m = parse_chat_output("<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>", options(true));
    REQUIRE(m.tool_calls.size() == 1);
    CHECK(m.tool_calls[0].arguments == "{}");
}

TEST_CASE("chat output: Qwen3-Coder XML call, values typed by the tool's schema") {
    const std::string text =
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=zip>\n75001\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=options>\n{\"hourly\": true}\n</parameter>\n"
        "<parameter=fields>\n[\"temp\", \"wind\"]\n</parameter>\n<parameter=units>\nnull\n</parameter>\n"
        "<parameter=extra>\n42\n</parameter>\n<parameter=note>\nsunny?\n</parameter>\n</function>\n</tool_call>";
    ChatOutput m = parse_chat_output(text, options(true, false, weather_tools()));
    CHECK(m.content.empty());
    REQUIRE(m.tool_calls.size() == 1);
    CHECK(m.tool_calls[0].name == "get_weather");
    // zip is a string that looks like a number; units allows string; extra and note are unknown:
    // JSON when they parse, text otherwise.
    CHECK(m.tool_calls[0].arguments ==
          R"({"city":"Paris","zip":"75001","days":3,"options":{"hourly":true},"fields":["temp","wind"],"units":"null",)"
          R"("extra":42,"note":"sunny?"})");

    // A non-string parameter whose value is no JSON is passed on as text.
    m = parse_chat_output("<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>",
                          options(true, false, weather_tools()));
    REQUIRE(m.tool_calls.size() == 1);
    CHECK(m.tool_calls[0].arguments == R"({"days":"three"})");

    // Without the tools' schemas every value that is JSON becomes JSON.
    m = parse_chat_output("<tool_call>\n<function=get_weather>\n<parameter=zip>\n75001\n</parameter>\n</function>\n</tool_call>",
                          options(true));
    REQUIRE(m.tool_calls.size() == 1);
    CHECK(m.tool_calls[0].arguments == R"({"zip":75001})");
}

TEST_CASE("chat output: Qwen3-Coder multi-line string values keep their inner newlines") {
    ChatOutput m = parse_chat_output(kCoderCall, options(true, false, weather_tools()));
    CHECK(m.content == "I'll create the script now.");
    REQUIRE(m.tool_calls.size() == 1);
    CHECK(m.tool_calls[0].name == "write_file");
    nlohmann::json args = nlohmann::json::parse(m.tool_calls[0].arguments);
    CHECK(args["path"] == "hello.py");
    CHECK(args["content"] == "def main():\n    print(\"hello\")\n\nmain()");

    // A missing </function> is tolerated; a missing </parameter> is not.
    m = parse_chat_output("<tool_call>\n<function=get_time>\n</tool_call>", options(true));
    REQUIRE(m.tool_calls.size() == 1);
    CHECK(m.tool_calls[0].arguments == "{}");
    const std::string unclosed_param = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>";
    m = parse_chat_output(unclosed_param, options(true));
    CHECK(m.tool_calls.empty());
    CHECK(m.content == unclosed_param);
}

TEST_CASE("chat output: MiniMax-M2 <minimax:tool_call> blocks, several invokes each, values typed by the schema") {
    ChatOutput m = parse_chat_output(kMiniMaxCalls, options(true, true, weather_tools()));
    CHECK(m.reasoning == "The user wants Paris and Tokyo. Two calls.");
    CHECK(m.content.empty());
    REQUIRE(m.tool_calls.size() == 2);
    CHECK(m.tool_calls[0].id == "call_0");
    CHECK(m.tool_calls[0].name == "get_weather");
    CHECK(m.tool_calls[0].arguments == R"({"city":"Paris","days":3,"options":{"hourly":true}})");
    CHECK(m.tool_calls[1].id == "call_1");
    CHECK(m.tool_calls[1].arguments == R"({"city":"Tokyo","zip":"100"})");  // zip's schema says string
    CHECK(spark_server::finish_reason(m, false) == "tool_calls");

    // Text before the block, single quotes, a call without parameters, a multi-line string value
    // (one newline on each side dropped), and the two block kinds in one answer.
    m = parse_chat_output("Writing it.\n<minimax:tool_call>\n<invoke name='write_file'>\n<parameter name=\"content\">\n"
                          "line 1\n\nline 3\n</parameter>\n</invoke>\n<invoke name=\"get_time\">\n</invoke>\n"
                          "</minimax:tool_call>\n<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
                          options(true, false, weather_tools()));
    CHECK(m.content == "Writing it.");
    REQUIRE(m.tool_calls.size() == 3);
    CHECK(m.tool_calls[0].name == "write_file");
    CHECK(m.tool_calls[0].arguments == R"({"content":"line 1\n\nline 3"})");
    CHECK(m.tool_calls[1].name == "get_time");
    CHECK(m.tool_calls[1].arguments == "{}");
    CHECK(m.tool_calls[2].name == "f");

    // Without tools in the request the tags are text.
    m = parse_chat_output(kMiniMaxCalls, options(false, true));
    CHECK(m.tool_calls.empty());
    CHECK(m.content.starts_with("<minimax:tool_call>\n<invoke name=\"get_weather\">"));
}

TEST_CASE("chat output: a MiniMax-M2 block that is not calls only stays in content") {
    for (const std::string body : {"<invoke name=\"f\">\n<parameter name=\"a\">1</parameter>\n",     // invoke not closed
                                   "<invoke name=\"f\">\n<parameter name=\"a\">1\n</invoke>",         // parameter not closed
                                   "<invoke name=\"\">\n</invoke>",                                     // empty name
                                   "<invoke name=f>\n</invoke>",                                         // unquoted name
                                   "<invoke name=\"f\">\n</invoke>\nand some text",                     // text after a call
                                   "<invoke name=\"f\">\n<parameter>1</parameter>\n</invoke>",          // parameter without name
                                   "", "call f(1)"}) {
        const std::string text = "Let me check.\n<minimax:tool_call>\n" + body + "\n</minimax:tool_call>";
        CAPTURE(text);
        ChatOutput m = parse_chat_output(text, options(true));
        CHECK(m.tool_calls.empty());
        CHECK(m.content == text);
    }
    const std::string unclosed = "Checking.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Par";
    ChatOutput        m        = parse_chat_output(unclosed, options(true));
    CHECK(m.content == unclosed);
    CHECK(m.tool_calls.empty());
}

TEST_CASE("chat output: a block that does not parse stays in content") {
    for (const std::string body : {"{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}",  // missing brace
                                   "{\"arguments\": {\"city\": \"Paris\"}}",                          // no name
                                   "{\"name\": 7, \"arguments\": {}}",                                 // name not a string
                                   "{\"name\": \"f\", \"arguments\": [1]}",                             // arguments not an object
                                   "{\"name\": \"f\"} trailing", "call get_weather(Paris)", ""}) {
        const std::string text = "Let me check.\n<tool_call>\n" + body + "\n</tool_call>";
        CAPTURE(text);
        ChatOutput m = parse_chat_output(text, options(true));
        CHECK(m.tool_calls.empty());
        CHECK(m.content == text);
        CHECK(spark_server::finish_reason(m, false) == "stop");
    }

    ChatOutput m = parse_chat_output(kBadThenGood, options(true));  // a bad block does not stop the next one
    CHECK(m.content ==
          "Trying.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}\n</tool_call>\n\nDone <tool");
    REQUIRE(m.tool_calls.size() == 1);
    CHECK(m.tool_calls[0].arguments == R"({"city":"Paris"})");
}

TEST_CASE("chat output: an unclosed <tool_call> stays in content") {
    const std::string text = "Checking.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par";
    ChatOutput m = parse_chat_output(text, options(true));
    CHECK(m.content == text);
    CHECK(m.tool_calls.empty());
}

TEST_CASE("chat output: parse_tool_calls=false leaves the tags in content") {
    ChatOutput m = parse_chat_output(kTwoCalls, options(false));
    CHECK(m.content == kTwoCalls);
    CHECK(m.tool_calls.empty());
    m = parse_chat_output(kThinkThenCall, options(false));
    CHECK(m.reasoning == "The user wants the forecast for Paris for three days. I'll call get_weather.");
    CHECK(m.content.starts_with("<tool_call>\n{\"name\": \"get_weather\""));
}

TEST_CASE("chat output: streaming gives the whole message for every split") {
    const nlohmann::json tools = weather_tools();
    for (const std::string & text : {kThinkThenAnswer, kThinkThenCall, kTwoCalls, kCoderCall, kBadThenGood,
                                     std::string("\n <think>\n\nabc \n</thinking> d\n</think>\n\n\n  x< y\n\n"),
                                     std::string("Checking.\n\n<tool_call>\n{\"name\": \"f\""), std::string("x<"),
                                     std::string(" <thi"), std::string("")}) {
        for (bool tool_calls : {false, true}) {
            check_stream_matches_whole(text, options(tool_calls, false, tools));
        }
    }
    check_stream_matches_whole("a b\n</thin\n\n</think>\n\n <tool_call>\n{\"name\": \"f\"}\n</tool_call>\n", options(true, true));
    check_stream_matches_whole("thinking </think", options(true, true));
    for (bool tool_calls : {false, true}) {
        check_stream_matches_whole(kMiniMaxCalls, options(tool_calls, true, tools));
        check_stream_matches_whole("x <minimax:tool_ca", options(tool_calls, false, tools));
        check_stream_matches_whole("<minimax:tool_call>\n<invoke name=\"f\">\n</invoke>\n</minimax:tool_call", options(tool_calls, false, tools));
    }
    ParseOptions raw    = options(true);
    raw.parse_reasoning = false;
    check_stream_matches_whole(kThinkThenCall, raw);
}

TEST_CASE("chat output: streaming emits text at once and holds back only possible tags") {
    ChatOutputStream s(options(true));
    CHECK(content_of(s.push("Hello")) == "Hello");  // decided: sent at once
    CHECK(content_of(s.push(" wor")) == " wor");
    CHECK(content_of(s.push("ld. a <")) == "ld. a");  // " <" may start <tool_call>
    CHECK(content_of(s.push("b")) == " <b");          // it did not
    CHECK(content_of(s.push(" x<too")) == " x");
    CHECK(content_of(s.push("th")) == "<tooth");
    CHECK(content_of(s.push("\n\n")).empty());  // whitespace that would go if a call followed
    CHECK(content_of(s.push("x<")) == "\n\nx");
    CHECK(content_of(s.finish()) == "<");  // the end decides
    CHECK(s.result().content == "Hello world. a <b x<tooth\n\nx<");
    CHECK_THROWS_AS(s.push("more"), std::logic_error);

    ChatOutputStream start(options(false));
    CHECK(start.push("<").empty());  // may be <think>
    CHECK(content_of(start.push("b>")) == "<b>");

    ChatOutputStream think(options(false, true));
    CHECK(reasoning_of(think.push("The answer is 4.\n</thi")) == "The answer is 4.");
    std::vector<ChatDelta> d = think.push("nk>\n\nIt is 4.");
    CHECK(reasoning_of(d).empty());
    CHECK(content_of(d) == "It is 4.");

    ChatOutputStream not_closing(options(false, true));
    CHECK(reasoning_of(not_closing.push("a </thi")) == "a");
    CHECK(reasoning_of(not_closing.push("s")) == " </this");
}

TEST_CASE("chat output: streamed tool calls come whole, once their block closes") {
    ChatOutputStream s(options(true));
    std::vector<ChatDelta> d = s.push("I'll look up both cities.\n<tool_call>\n{\"name\": \"get_weather\", ");
    REQUIRE(d.size() == 1);
    CHECK(d[0].kind == ChatDelta::Kind::content);
    CHECK(d[0].text == "I'll look up both cities.");
    CHECK(s.push("\"arguments\": {\"city\": \"Paris\"}}\n</tool_call").empty());
    d = s.push(">\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Tokyo\"}}\n</tool_call>");
    REQUIRE(d.size() == 2);
    CHECK(d[0].kind == ChatDelta::Kind::tool_call);
    CHECK(d[0].tool_index == 0);
    CHECK(d[0].tool_call.id == "call_0");
    CHECK(d[0].tool_call.arguments == R"({"city":"Paris"})");
    CHECK(d[1].tool_index == 1);
    CHECK(d[1].tool_call.arguments == R"({"city":"Tokyo"})");
    CHECK(s.push("\n").empty());
    CHECK(s.finish().empty());  // whitespace after the last call is dropped

    ChatOutputStream unclosed(options(true));
    CHECK(unclosed.push("<tool_call>\n{\"name\": \"f\"").empty());
    d = unclosed.finish();
    REQUIRE(d.size() == 1);
    CHECK(d[0].kind == ChatDelta::Kind::content);
    CHECK(d[0].text == "<tool_call>\n{\"name\": \"f\"");
}
