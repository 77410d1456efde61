#include "api.h"

#include "chat_output.h"
#include "web_index.h"  // generated from web/index.html: kWebIndex

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace spark_server {

namespace {

using json  = nlohmann::json;
using Clock = std::chrono::steady_clock;

// ---- errors ------------------------------------------------------------------------------------

using ApiError = RequestError;

// JSON text of anything the model or a client wrote: invalid UTF-8 becomes U+FFFD instead of an
// exception.
std::string dump(const json & j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_body(const std::string & message, const std::string & type, const std::string & param, const std::string & code) {
    return {{"error",
             {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)},
              {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

void send_error(httplib::Response & res, const ApiError & e) {
    res.status = e.status;
    if (e.status == 503) res.set_header("Retry-After", "1");
    res.set_content(dump(error_body(e.what(), e.type, e.param, e.code)), "application/json");
}

// ---- request fields ----------------------------------------------------------------------------

// Deeper bodies are refused: copying, printing and destroying a JSON value recurse once per level.
constexpr int kMaxJsonDepth = 64;

// JSON a client sent (the body, or a JSON text inside it); `what` names it in the error.
json parse_client_json(const std::string & text, const std::string & what) {
    try {
        return json::parse(text, [&](int depth, json::parse_event_t, json &) {
            if (depth > kMaxJsonDepth) throw ApiError(400, what + " is nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
            return true;
        });
    } catch (const json::exception & e) {  // a syntax error, or a number out of range (1e400)
        throw ApiError(400, what + " is not valid JSON: " + e.what());
    }
}

json parse_body(const std::string & text) {
    json body = parse_client_json(text, "the request body");
    if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
    return body;
}

void check_fields(const json & body, const std::set<std::string> & known) {
    for (auto it = body.begin(); it != body.end(); ++it)
        if (!known.count(it.key())) throw ApiError(400, "Unrecognized request argument supplied: " + it.key(), it.key());
}

// A field that may be absent or null (both: the default).
const json * field(const json & body, const char * name) {
    const auto it = body.find(name);
    return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::optional<double> number_field(const json & body, const char * name, double lo, double hi) {
    const json * v = field(body, name);
    if (!v) return std::nullopt;
    if (!v->is_number()) throw ApiError(400, std::string("'") + name + "' must be a number", name);
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi)) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "'%s' is %g; it must be between %g and %g", name, x, lo, hi);
        throw ApiError(400, buf, name);
    }
    return x;
}

std::optional<int64_t> int_field(const json & body, const char * name, int64_t lo, int64_t hi) {
    const json * v = field(body, name);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) throw ApiError(400, std::string("'") + name + "' must be an integer", name);
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi)
        throw ApiError(400, std::string("'") + name + "' is " + std::to_string(x) + "; it must be between " + std::to_string(lo) + " and " +
                                std::to_string(hi),
                       name);
    return x;
}

std::optional<bool> bool_field(const json & body, const char * name) {
    const json * v = field(body, name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw ApiError(400, std::string("'") + name + "' must be true or false", name);
    return v->get<bool>();
}

std::optional<std::string> string_field(const json & body, const char * name) {
    const json * v = field(body, name);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw ApiError(400, std::string("'") + name + "' must be a string", name);
    return v->get<std::string>();
}

// ---- the model's side --------------------------------------------------------------------------

struct Context {
    Engine *                engine;
    const spark_model *     model;
    const spark_tokenizer * tok;
    const ApiConfig &       cfg;
    int32_t                 n_vocab = 0;
    std::string             bos, eos;  // token texts for the chat template
    int64_t                 created = 0;
};

std::string token_text(const spark_tokenizer * tok, spark_token t) {
    if (t < 0) return "";
    std::string out(32, '\0');
    size_t      len = 0;
    spark_status st = spark_token_to_piece(tok, t, out.data(), out.size(), &len);
    if (st == SPARK_ERR_BUFFER_TOO_SMALL) {
        out.resize(len);
        st = spark_token_to_piece(tok, t, out.data(), out.size(), &len);
    }
    out.resize(st == SPARK_OK ? len : 0);
    return out;
}

std::vector<spark_token> tokenize(const Context & c, const std::string & text, bool parse_special) {
    int32_t      n  = 0;
    spark_status st = spark_tokenize(c.tok, text.data(), text.size(), parse_special, nullptr, 0, &n);
    std::vector<spark_token> ids(size_t(std::max(n, 0)));
    if (st == SPARK_ERR_BUFFER_TOO_SMALL) st = spark_tokenize(c.tok, text.data(), text.size(), parse_special, ids.data(), n, &n);
    if (st != SPARK_OK) throw ApiError(400, std::string("cannot tokenize the prompt: ") + spark_last_error());
    ids.resize(size_t(n));
    return ids;
}

std::string detokenize(const Context & c, const std::vector<spark_token> & ids) {
    std::string  out(ids.size() * 8 + 16, '\0');
    size_t       len = 0;
    spark_status st  = spark_detokenize(c.tok, ids.data(), int32_t(ids.size()), false, out.data(), out.size(), &len);
    if (st == SPARK_ERR_BUFFER_TOO_SMALL) {
        out.resize(len);
        st = spark_detokenize(c.tok, ids.data(), int32_t(ids.size()), false, out.data(), out.size(), &len);
    }
    if (st != SPARK_OK) throw ApiError(400, std::string("cannot detokenize: ") + spark_last_error(), "tokens");
    out.resize(len);
    return out;
}

std::string random_id(const char * prefix) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    static const char                   kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    std::string                         id       = prefix;
    for (int i = 0; i < 24; ++i) id += kChars[rng() % (sizeof kChars - 1)];
    return id;
}

int64_t unix_now() { return int64_t(std::time(nullptr)); }

// ---- sampling fields shared by both completion endpoints ---------------------------------------

const std::set<std::string> kSamplingFields = {"model",     "stream",         "stream_options", "max_tokens", "temperature", "top_p",
                                               "top_k",     "min_p",          "seed",           "stop",       "presence_penalty",
                                               "frequency_penalty", "repeat_penalty", "repeat_last_n", "logit_bias", "n", "user"};

GenerationParams parse_generation(const Context & c, const json & body, int32_t default_max_tokens) {
    GenerationParams g;
    SamplingParams & s = g.sampling;
    s                  = c.cfg.sampling;
    if (const json * m = field(body, "model"); m && !m->is_string()) throw ApiError(400, "'model' must be a string", "model");
    if (auto n = int_field(body, "n", 1, 1)) (void) n;  // one choice per request
    if (auto v = number_field(body, "temperature", 0.0, 2.0)) s.temperature = float(*v);
    if (auto v = number_field(body, "top_p", 0.0, 1.0)) s.top_p = float(*v);
    if (auto v = int_field(body, "top_k", 0, 1 << 30)) s.top_k = int32_t(*v);
    if (auto v = number_field(body, "min_p", 0.0, 1.0)) s.min_p = float(*v);
    if (auto v = number_field(body, "presence_penalty", -2.0, 2.0)) s.presence = float(*v);
    if (auto v = number_field(body, "frequency_penalty", -2.0, 2.0)) s.frequency = float(*v);
    if (auto v = number_field(body, "repeat_penalty", 0.0, 10.0)) s.repeat_penalty = float(*v);
    if (auto v = int_field(body, "repeat_last_n", -1, 1 << 20)) s.repeat_last_n = int32_t(*v);
    if (auto v = int_field(body, "seed", INT64_MIN, INT64_MAX)) s.seed = uint32_t(uint64_t(*v) ^ (uint64_t(*v) >> 32));
    else s.seed = std::random_device{}();
    if (const json * lb = field(body, "logit_bias")) {
        if (!lb->is_object()) throw ApiError(400, "'logit_bias' must be an object of token ids to numbers", "logit_bias");
        for (auto it = lb->begin(); it != lb->end(); ++it) {
            char *     end = nullptr;
            const long id  = std::strtol(it.key().c_str(), &end, 10);
            if (it.key().empty() || *end != '\0' || id < 0 || id >= c.n_vocab)
                throw ApiError(400, "'logit_bias': '" + it.key() + "' is not a token id of this model", "logit_bias");
            if (!it->is_number() || !(it->get<double>() >= -100.0 && it->get<double>() <= 100.0))
                throw ApiError(400, "'logit_bias': the bias of token " + it.key() + " must be a number between -100 and 100", "logit_bias");
            const double b = it->get<double>();
            s.logit_bias.emplace_back(spark_token(id), b <= -100.0 ? -INFINITY : float(b));  // -100 bans, as OpenAI documents
        }
    }
    if (const json * st = field(body, "stop")) {
        auto add = [&](const json & v) {
            if (!v.is_string()) throw ApiError(400, "'stop' must be a string or an array of strings", "stop");
            // Every token is matched against the stop strings: bound the work per token.
            if (v.get<std::string>().size() > 1024) throw ApiError(400, "'stop': a stop string is at most 1024 bytes", "stop");
            if (!v.get<std::string>().empty()) g.stop.push_back(v.get<std::string>());
        };
        if (st->is_array()) {
            if (st->size() > 16) throw ApiError(400, "'stop' holds at most 16 strings", "stop");
            for (const json & v : *st) add(v);
        } else {
            add(*st);
        }
    }
    g.max_tokens = default_max_tokens;
    for (const char * name : {"max_tokens", "max_completion_tokens"})
        if (auto v = int_field(body, name, 1, 1 << 30)) g.max_tokens = int32_t(*v);
    if (const json * so = field(body, "stream_options")) {
        if (!so->is_object()) throw ApiError(400, "'stream_options' must be an object", "stream_options");
        check_fields(*so, {"include_usage"});
        bool_field(*so, "include_usage");
    }
    if (auto u = field(body, "user"); u && !u->is_string()) throw ApiError(400, "'user' must be a string", "user");
    return g;
}

// Speculative steps return tokens, not the logits of each (they stay on the device).
void check_logprobs_available(const Context & c, const GenerationParams & g) {
    if (c.cfg.speculative && g.logprobs >= 0)
        throw ApiError(400, "logprobs are not available while the server decodes speculatively (--spec)", "logprobs");
}

// The prompt must leave room for at least one answer token in the request's slot.
void check_prompt_length(const Context & c, const std::vector<spark_token> & prompt) {
    if (prompt.empty()) throw ApiError(400, "the prompt is empty", "prompt");
    if (int32_t(prompt.size()) >= c.cfg.n_ctx_slot)
        throw ApiError(400,
                       "This model's context per request is " + std::to_string(c.cfg.n_ctx_slot) + " tokens; the prompt has " +
                           std::to_string(prompt.size()) + " tokens (raise -c or lower --parallel)",
                       "messages", "context_length_exceeded");
}

std::shared_ptr<Request> submit(const Context & c, GenerationParams g) {
    auto req = c.engine->submit(std::move(g));
    if (!req) throw ApiError(503, "the server is busy: every slot is taken and the queue is full; retry later", "", "overloaded", "server_error");
    return req;
}

json usage_json(const Usage & u) {
    return {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

// llama-server's per-answer timings (the chat page shows tok/s from them).
json timings_json(const Usage & u) {
    const int32_t prompt_n = u.prompt_tokens - u.cached_tokens;
    return {{"prompt_n", prompt_n},
            {"prompt_ms", u.prompt_ms},
            {"prompt_per_second", u.prompt_ms > 0 ? 1e3 * prompt_n / u.prompt_ms : 0.0},
            {"predicted_n", u.completion_tokens},
            {"predicted_ms", u.generation_ms},
            {"predicted_per_second", u.generation_ms > 0 ? 1e3 * std::max(0, u.completion_tokens - 1) / u.generation_ms : 0.0},
            {"cache_n", u.cached_tokens}};
}

json bytes_json(const std::string & s) {
    json a = json::array();
    for (unsigned char ch : s) a.push_back(int(ch));
    return a;
}

// OpenAI chat logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}.
json chat_logprobs_json(const Context & c, const std::vector<TokenLogprob> & lps) {
    json content = json::array();
    for (const TokenLogprob & lp : lps) {
        const std::string text = token_text(c.tok, lp.token);
        json              top  = json::array();
        for (const TopLogprob & t : lp.top) {
            const std::string tt = token_text(c.tok, t.token);
            top.push_back({{"token", tt}, {"logprob", t.logprob}, {"bytes", bytes_json(tt)}});
        }
        content.push_back({{"token", text}, {"logprob", lp.logprob}, {"bytes", bytes_json(text)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
}

// Legacy completions logprobs: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}.
json completion_logprobs_json(const Context & c, const std::vector<TokenLogprob> & lps, size_t text_offset) {
    json tokens = json::array(), lp = json::array(), top = json::array(), offsets = json::array();
    for (const TokenLogprob & t : lps) {
        const std::string text = token_text(c.tok, t.token);
        tokens.push_back(text);
        lp.push_back(t.logprob);
        json alt = json::object();
        for (const TopLogprob & a : t.top) alt[token_text(c.tok, a.token)] = a.logprob;
        top.push_back(alt);
        offsets.push_back(text_offset);
        text_offset += text.size();
    }
    return {{"tokens", tokens}, {"token_logprobs", lp}, {"top_logprobs", top}, {"text_offset", offsets}};
}

// ---- streaming -----------------------------------------------------------------------------------

// Server-sent events from a request's events. `on_events` turns the events taken in one wake-up
// into data lines (JSON texts); `on_end` writes the closing ones. A client that goes away (a
// failed write) cancels the request: its slot is free at the engine's next step.
using ChunkWriter = std::function<bool(const std::string &)>;

void stream_request(httplib::Response & res, std::shared_ptr<Request> req,
                    std::function<void(std::vector<Event> &&, const ChunkWriter &)> on_events,
                    std::function<void(const ChunkWriter &)>                       on_end) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [req, on_events, on_end](size_t, httplib::DataSink & sink) {
            bool       ok    = true;
            ChunkWriter write = [&](const std::string & data) {
                const std::string line = "data: " + data + "\n\n";
                ok = ok && sink.write(line.data(), line.size());
                return ok;
            };
            while (ok) {
                // finished() before taking the events: the engine pushes a request's last events
                // before it marks it finished, so once it is, these are all there is.
                const bool         done   = req->finished();
                std::vector<Event> events = req->wait(done ? Clock::now() : Clock::now() + std::chrono::milliseconds(500));
                if (!sink.is_writable()) ok = false;
                if (!events.empty() && ok) on_events(std::move(events), write);
                if (!ok) break;
                if (done) {
                    on_end(write);
                    if (ok) write("[DONE]");
                    if (ok) sink.done();
                    return ok;
                }
            }
            req->cancel();
            return false;
        },
        [req](bool success) {
            if (!success) req->cancel();
        });
}

// Waits for the whole answer (non-streaming requests).
std::string collect(const std::shared_ptr<Request> & req, std::vector<TokenLogprob> & lps) {
    std::string text;
    for (;;) {
        const bool done = req->finished();  // before taking the events (see stream_request)
        for (Event & e : req->wait(done ? Clock::now() : Clock::now() + std::chrono::seconds(1))) {
            text += e.text;
            lps.insert(lps.end(), e.logprobs.begin(), e.logprobs.end());
        }
        if (done) return text;
    }
}

void check_failed(const std::shared_ptr<Request> & req) {
    const std::string err = req->error();
    if (!err.empty()) throw ApiError(500, err, "", "", "server_error");
}

// ---- chat --------------------------------------------------------------------------------------

struct RenderedChat {
    std::string  prompt;
    ParseOptions parse;
};

std::string message_content(const json & content, size_t i) {
    if (content.is_null()) return "";
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array()) throw ApiError(400, "messages[" + std::to_string(i) + "].content must be a string, null or an array of parts", "messages");
    std::string out;
    for (const json & part : content) {
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") || !part["text"].is_string())
            throw ApiError(400, "messages[" + std::to_string(i) + "].content: only text parts ({\"type\": \"text\", \"text\": ...}) are supported",
                           "messages");
        if (!out.empty()) out += "\n";
        out += part["text"].get<std::string>();
    }
    return out;
}

RenderedChat render_chat(const Context & c, const json & body) {
    const json * msgs = field(body, "messages");
    if (!msgs || !msgs->is_array() || msgs->empty()) throw ApiError(400, "'messages' must be a non-empty array", "messages");
    if (c.cfg.chat_template.empty()) throw ApiError(400, "this model has no chat template; use /v1/completions or --chat-template-file");
    struct Owned {
        std::string role, content, reasoning, tool_calls, name;
        bool        has_reasoning = false, has_tool_calls = false, has_name = false;
    };
    std::vector<Owned> owned(msgs->size());
    for (size_t i = 0; i < msgs->size(); ++i) {
        const json & m = (*msgs)[i];
        const std::string where = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) throw ApiError(400, where + " must be an object", "messages");
        check_fields(m, {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content", "refusal"});
        if (!m.contains("role") || !m["role"].is_string()) throw ApiError(400, where + ".role must be a string", "messages");
        Owned & o = owned[i];
        o.role    = m["role"].get<std::string>();
        if (o.role == "developer") o.role = "system";  // OpenAI's newer name for it
        if (o.role != "system" && o.role != "user" && o.role != "assistant" && o.role != "tool")
            throw ApiError(400, where + ".role '" + o.role + "' is not one of system, developer, user, assistant, tool", "messages");
        o.content = message_content(m.contains("content") ? m["content"] : json(nullptr), i);
        if (const json * r = field(m, "reasoning_content")) {
            if (!r->is_string()) throw ApiError(400, where + ".reasoning_content must be a string", "messages");
            o.reasoning     = r->get<std::string>();
            o.has_reasoning = true;
        }
        if (const json * tc = field(m, "tool_calls")) {
            if (!tc->is_array()) throw ApiError(400, where + ".tool_calls must be an array", "messages");
            json calls = json::array();
            for (const json & call : *tc) {
                if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
                    !call["function"].contains("name") || !call["function"]["name"].is_string())
                    throw ApiError(400, where + ".tool_calls: each call needs function.name", "messages");
                json fn = call["function"];
                // Templates print arguments as they are when a string, as JSON otherwise: hand them
                // the object (bounded as the body is; text that is not JSON stays a string).
                if (fn.contains("arguments") && fn["arguments"].is_string()) {
                    const std::string text = fn["arguments"].get<std::string>();
                    if (json::accept(text)) fn["arguments"] = parse_client_json(text, where + ".tool_calls[].function.arguments");
                }
                json out = call;
                out["function"] = fn;
                calls.push_back(out);
            }
            o.tool_calls     = dump(calls);
            o.has_tool_calls = true;
        }
        if (const json * n = field(m, "name")) {
            if (!n->is_string()) throw ApiError(400, where + ".name must be a string", "messages");
            o.name     = n->get<std::string>();
            o.has_name = true;
        }
        if (const json * id = field(m, "tool_call_id"); id && !id->is_string())
            throw ApiError(400, where + ".tool_call_id must be a string", "messages");
    }
    std::vector<spark_chat_message> view;
    for (const Owned & o : owned)
        view.push_back({o.role.c_str(), o.content.c_str(), o.has_reasoning ? o.reasoning.c_str() : nullptr,
                        o.has_tool_calls ? o.tool_calls.c_str() : nullptr, o.has_name ? o.name.c_str() : nullptr});

    RenderedChat out;
    std::string  tools_json;
    if (const json * choice = field(body, "tool_choice"); choice && *choice != "auto" && *choice != "none")
        throw ApiError(400, "'tool_choice': only \"auto\" and \"none\" are supported (the model decides whether to call a tool)", "tool_choice");
    if (const json * tools = field(body, "tools")) {
        if (!tools->is_array()) throw ApiError(400, "'tools' must be an array", "tools");
        for (const json & t : *tools)
            if (!t.is_object() || !t.contains("type") || t["type"] != "function" || !t.contains("function") || !t["function"].is_object() ||
                !t["function"].contains("name") || !t["function"]["name"].is_string())
                throw ApiError(400, "'tools': each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}", "tools");
        bool use_tools = !tools->empty();
        if (const json * choice = field(body, "tool_choice"); choice && *choice == "none") use_tools = false;
        if (use_tools) {
            tools_json                  = dump(*tools);
            out.parse.parse_tool_calls  = true;
            out.parse.tools             = *tools;
        }
    }
    json kwargs = c.cfg.template_kwargs;
    if (const json * kw = field(body, "chat_template_kwargs")) {
        if (!kw->is_object()) throw ApiError(400, "'chat_template_kwargs' must be an object", "chat_template_kwargs");
        kwargs.update(*kw);
    }
    const std::string extra = dump(kwargs);
    std::string       buf(4096, '\0');
    size_t            len = 0;
    spark_status      st  = SPARK_OK;
    for (int attempt = 0; attempt < 2; ++attempt) {
        st = spark_chat_apply_template(c.cfg.chat_template.c_str(), view.data(), view.size(), true,
                                       tools_json.empty() ? nullptr : tools_json.c_str(), extra.c_str(), c.bos.c_str(), c.eos.c_str(),
                                       buf.data(), buf.size(), &len);
        if (st != SPARK_ERR_BUFFER_TOO_SMALL) break;
        buf.resize(len + 1);
    }
    if (st != SPARK_OK) throw ApiError(400, std::string("the chat template failed on these messages: ") + spark_last_error(), "messages");
    out.prompt = buf.substr(0, len);
    // Thinking templates open the reasoning in the prompt; the answer then starts inside it.
    std::string tail = out.prompt;
    while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
    out.parse.starts_in_reasoning = tail.size() >= 7 && tail.compare(tail.size() - 7, 7, "<think>") == 0;
    return out;
}

json tool_call_json(const ToolCall & t) {
    return {{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}};
}

// The `delta` of a streamed chunk; a tool call is sent whole, with its index among the message's calls.
json delta_json(const ChatDelta & d) {
    if (d.kind == ChatDelta::Kind::content) return {{"content", d.text}};
    if (d.kind == ChatDelta::Kind::reasoning) return {{"reasoning_content", d.text}};
    json call     = tool_call_json(d.tool_call);
    call["index"] = d.tool_index;
    return {{"tool_calls", json::array({call})}};
}

// What a completion request asks for, checked field by field and tokenized, before it is queued.
struct Prepared {
    GenerationParams g;
    ParseOptions     parse;  // chat: how to read the answer
    bool             stream = false, include_usage = false, logprobs = false;
};

bool include_usage_of(const json & body, bool stream) {
    const json * so = field(body, "stream_options");
    return stream && so && so->is_object() && so->contains("include_usage") && (*so)["include_usage"].is_boolean() &&
           (*so)["include_usage"].get<bool>();
}

Prepared prepare_chat(const Context & c, const json & body) {
    std::set<std::string> known = kSamplingFields;
    known.insert({"messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
                  "response_format", "chat_template_kwargs", "store", "metadata", "service_tier", "reasoning_effort"});
    check_fields(body, known);
    Prepared p;
    GenerationParams & g = p.g;
    g                    = parse_generation(c, body, -1);
    p.logprobs           = bool_field(body, "logprobs").value_or(false);
    if (auto top = int_field(body, "top_logprobs", 0, 20)) {
        if (!p.logprobs) throw ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs");
        g.logprobs = int32_t(*top);
    } else if (p.logprobs) {
        g.logprobs = 0;
    }
    if (const json * rf = field(body, "response_format"))
        if (!rf->is_object() || !rf->contains("type") || (*rf)["type"] != "text")
            throw ApiError(400, "'response_format': only {\"type\": \"text\"} is supported", "response_format");
    bool_field(body, "parallel_tool_calls");
    check_logprobs_available(c, g);
    RenderedChat chat = render_chat(c, body);
    g.prompt          = tokenize(c, chat.prompt, true);
    check_prompt_length(c, g.prompt);
    p.parse         = chat.parse;
    p.stream        = bool_field(body, "stream").value_or(false);
    p.include_usage = include_usage_of(body, p.stream);
    return p;
}

void chat_completions(const Context & c, const httplib::Request & http_req, httplib::Response & res) {
    Prepared          prep          = prepare_chat(c, parse_body(http_req.body));
    const bool        logprobs      = prep.logprobs;
    const bool        stream        = prep.stream;
    const bool        include_usage = prep.include_usage;
    const ParseOptions parse_options = prep.parse;
    const auto   req     = submit(c, std::move(prep.g));
    const std::string id = random_id("chatcmpl-");
    const int64_t created = unix_now();
    auto chunk = [&c, id, created](json delta, json finish, json logprobs) {
        return json{{"id", id},
                    {"object", "chat.completion.chunk"},
                    {"created", created},
                    {"model", c.cfg.model_id},
                    {"choices", json::array({{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs)},
                                              {"finish_reason", std::move(finish)}}})}};
    };

    if (!stream) {
        std::vector<TokenLogprob> lps;
        const std::string         text = collect(req, lps);
        check_failed(req);
        const ChatOutput out = parse_chat_output(text, parse_options);
        json msg = {{"role", "assistant"}, {"content", out.content}};
        if (!out.reasoning.empty()) msg["reasoning_content"] = out.reasoning;
        const std::string finish(finish_reason(out, req->finish_reason() == "length"));
        if (!out.tool_calls.empty()) {
            json calls = json::array();
            for (const ToolCall & t : out.tool_calls) calls.push_back(tool_call_json(t));
            msg["tool_calls"] = calls;
            if (out.content.empty()) msg["content"] = nullptr;
        }
        const Usage u = req->usage();
        json        r = {{"id", id},
                         {"object", "chat.completion"},
                         {"created", created},
                         {"model", c.cfg.model_id},
                         {"choices", json::array({{{"index", 0}, {"message", msg}, {"logprobs", logprobs ? chat_logprobs_json(c, lps) : json(nullptr)},
                                                   {"finish_reason", finish}}})},
                         {"usage", usage_json(u)},
                         {"timings", timings_json(u)}};
        res.set_content(dump(r), "application/json");
        return;
    }

    auto parser    = std::make_shared<ChatOutputStream>(parse_options);
    auto n_calls   = std::make_shared<int>(0);
    auto sent_role = std::make_shared<bool>(false);
    stream_request(
        res, req,
        [&c, chunk, parser, n_calls, sent_role, logprobs](std::vector<Event> && events, const ChunkWriter & write) {
            for (Event & e : events) {
                json lp = logprobs && !e.logprobs.empty() ? chat_logprobs_json(c, e.logprobs) : json(nullptr);
                if (!*sent_role) {
                    *sent_role = true;
                    if (!write(dump(chunk({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr)))) return;
                }
                for (const ChatDelta & d : parser->push(e.text)) {
                    if (d.kind == ChatDelta::Kind::tool_call) ++*n_calls;
                    if (!write(dump(chunk(delta_json(d), nullptr, lp)))) return;
                    lp = nullptr;
                }
                if (!lp.is_null() && !write(dump(chunk(json::object(), nullptr, lp)))) return;
            }
        },
        [&c, chunk, req, parser, n_calls, sent_role, include_usage](const ChunkWriter & write) {
            const std::string err = req->error();
            if (!err.empty()) {
                write(dump(error_body(err, "server_error", "", "")));
                return;
            }
            if (!*sent_role) {
                *sent_role = true;
                write(dump(chunk({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr)));
            }
            for (const ChatDelta & d : parser->finish()) {
                if (d.kind == ChatDelta::Kind::tool_call) ++*n_calls;
                write(dump(chunk(delta_json(d), nullptr, nullptr)));
            }
            const std::string finish = req->finish_reason() != "length" && *n_calls > 0 ? "tool_calls" : req->finish_reason();
            const Usage       u      = req->usage();
            json              last   = chunk(json::object(), finish, nullptr);
            last["timings"]          = timings_json(u);
            write(dump(last));
            if (include_usage) {
                json usage = chunk(json::object(), nullptr, nullptr);
                usage["choices"] = json::array();
                usage["usage"]   = usage_json(u);
                usage["timings"] = timings_json(u);
                write(dump(usage));
            }
        });
}

// llama-server's /apply-template: the prompt a chat request renders to (what the model reads).
void apply_template_endpoint(const Context & c, const httplib::Request & http_req, httplib::Response & res) {
    const json body = parse_body(http_req.body);
    check_fields(body, {"messages", "tools", "tool_choice", "chat_template_kwargs", "model"});
    res.set_content(dump({{"prompt", render_chat(c, body).prompt}}), "application/json");
}

// ---- completions -------------------------------------------------------------------------------

Prepared prepare_completion(const Context & c, const json & body) {
    std::set<std::string> known = kSamplingFields;
    known.insert({"prompt", "logprobs", "echo", "suffix", "best_of"});
    check_fields(body, known);
    Prepared           p;
    GenerationParams & g = p.g;
    g                    = parse_generation(c, body, 16);  // OpenAI's default for this endpoint
    if (auto lp = int_field(body, "logprobs", 0, 20)) g.logprobs = int32_t(*lp);
    check_logprobs_available(c, g);
    if (bool_field(body, "echo").value_or(false)) throw ApiError(400, "'echo' is not supported", "echo");
    if (field(body, "suffix")) throw ApiError(400, "'suffix' is not supported", "suffix");
    int_field(body, "best_of", 1, 1);
    const json * pr = field(body, "prompt");
    if (!pr) throw ApiError(400, "'prompt' is required", "prompt");
    const json * one = pr;
    if (pr->is_array() && !pr->empty() && (pr->front().is_string() || pr->front().is_array())) {
        if (pr->size() != 1) throw ApiError(400, "'prompt': one prompt per request (n = 1)", "prompt");
        one = &pr->front();
    }
    if (one->is_string()) {
        g.prompt = tokenize(c, one->get<std::string>(), true);
    } else if (one->is_array()) {
        for (const json & t : *one) {
            if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= c.n_vocab)
                throw ApiError(400, "'prompt': token ids must be integers in [0, " + std::to_string(c.n_vocab) + ")", "prompt");
            g.prompt.push_back(spark_token(t.get<int64_t>()));
        }
    } else {
        throw ApiError(400, "'prompt' must be a string, an array of token ids, or an array of one of those", "prompt");
    }
    check_prompt_length(c, g.prompt);
    p.logprobs      = g.logprobs >= 0;
    p.stream        = bool_field(body, "stream").value_or(false);
    p.include_usage = include_usage_of(body, p.stream);
    return p;
}

void completions(const Context & c, const httplib::Request & http_req, httplib::Response & res) {
    Prepared   prep          = prepare_completion(c, parse_body(http_req.body));
    const bool logprobs      = prep.logprobs;
    const bool stream        = prep.stream;
    const bool include_usage = prep.include_usage;
    const auto        req     = submit(c, std::move(prep.g));
    const std::string id      = random_id("cmpl-");
    const int64_t     created = unix_now();
    auto chunk = [&c, id, created](const std::string & text, json finish, json lp) {
        return json{{"id", id},
                    {"object", "text_completion"},
                    {"created", created},
                    {"model", c.cfg.model_id},
                    {"choices", json::array({{{"index", 0}, {"text", text}, {"logprobs", std::move(lp)}, {"finish_reason", std::move(finish)}}})}};
    };
    if (!stream) {
        std::vector<TokenLogprob> lps;
        const std::string         text = collect(req, lps);
        check_failed(req);
        json r     = chunk(text, req->finish_reason(), logprobs ? completion_logprobs_json(c, lps, 0) : json(nullptr));
        r["usage"] = usage_json(req->usage());
        r["timings"] = timings_json(req->usage());
        res.set_content(dump(r), "application/json");
        return;
    }
    auto offset = std::make_shared<size_t>(0);
    stream_request(
        res, req,
        [&c, chunk, offset, logprobs](std::vector<Event> && events, const ChunkWriter & write) {
            for (Event & e : events) {
                json lp = logprobs ? completion_logprobs_json(c, e.logprobs, *offset) : json(nullptr);
                *offset += e.text.size();
                if (!write(dump(chunk(e.text, nullptr, lp)))) return;
            }
        },
        [chunk, req, include_usage](const ChunkWriter & write) {
            const std::string err = req->error();
            if (!err.empty()) {
                write(dump(error_body(err, "server_error", "", "")));
                return;
            }
            json last       = chunk("", req->finish_reason(), nullptr);
            last["timings"] = timings_json(req->usage());
            write(dump(last));
            if (include_usage) {
                json u     = chunk("", nullptr, nullptr);
                u["choices"] = json::array();
                u["usage"] = usage_json(req->usage());
                write(dump(u));
            }
        });
}

// ---- small endpoints ---------------------------------------------------------------------------

void tokenize_endpoint(const Context & c, const httplib::Request & http_req, httplib::Response & res) {
    const json body = parse_body(http_req.body);
    check_fields(body, {"content", "add_special", "parse_special", "with_pieces"});
    const auto content = string_field(body, "content");
    if (!content) throw ApiError(400, "'content' (a string) is required", "content");
    bool_field(body, "add_special");  // the models' tokenizers add no BOS: nothing to add
    const bool parse_special = bool_field(body, "parse_special").value_or(true);
    const bool with_pieces   = bool_field(body, "with_pieces").value_or(false);
    json       tokens        = json::array();
    for (spark_token t : tokenize(c, *content, parse_special)) {
        if (with_pieces) tokens.push_back({{"id", t}, {"piece", token_text(c.tok, t)}});
        else tokens.push_back(t);
    }
    res.set_content(dump({{"tokens", tokens}}), "application/json");
}

void detokenize_endpoint(const Context & c, const httplib::Request & http_req, httplib::Response & res) {
    const json body = parse_body(http_req.body);
    check_fields(body, {"tokens"});
    const json * tokens = field(body, "tokens");
    if (!tokens || !tokens->is_array()) throw ApiError(400, "'tokens' (an array of token ids) is required", "tokens");
    std::vector<spark_token> ids;
    for (const json & t : *tokens) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= c.n_vocab)
            throw ApiError(400, "'tokens': token ids must be integers in [0, " + std::to_string(c.n_vocab) + ")", "tokens");
        ids.push_back(spark_token(t.get<int64_t>()));
    }
    res.set_content(dump({{"content", detokenize(c, ids)}}), "application/json");
}

void models_endpoint(const Context & c, httplib::Response & res) {
    spark_model_info info{};
    spark_model_get_info(c.model, &info);
    json meta = {{"architecture", info.architecture}, {"weight_format", info.weight_format}, {"n_vocab", info.n_vocab},
                 {"n_ctx_train", info.n_ctx_train},   {"n_ctx_slot", c.cfg.n_ctx_slot},      {"n_params", info.n_params},
                 {"n_parallel", c.engine->options().n_parallel}};
    res.set_content(dump({{"object", "list"},
                          {"data", json::array({{{"id", c.cfg.model_id}, {"object", "model"}, {"created", c.created}, {"owned_by", "spark"},
                                                 {"meta", meta}}})}}),
                    "application/json");
}

void metrics_endpoint(const Context & c, httplib::Response & res) {
    const EngineStats s = c.engine->stats();
    std::string       out;
    auto metric = [&](const char * name, const char * type, const char * help, double value) {
        char buf[512];
        std::snprintf(buf, sizeof buf, "# HELP spark_%s %s\n# TYPE spark_%s %s\nspark_%s %.17g\n", name, help, name, type, name, value);
        out += buf;
    };
    metric("requests_total", "counter", "Generation requests accepted.", double(s.requests_total));
    metric("requests_failed_total", "counter", "Requests that ended with an error.", double(s.requests_failed));
    metric("requests_cancelled_total", "counter", "Requests whose client went away before the end.", double(s.requests_cancelled));
    metric("requests_rejected_total", "counter", "Requests refused because the queue was full.", double(s.requests_rejected));
    metric("prompt_tokens_total", "counter", "Prompt tokens decoded.", double(s.prompt_tokens));
    metric("prompt_tokens_cached_total", "counter", "Prompt tokens reused from a slot's cache instead of decoded.", double(s.cached_prompt_tokens));
    metric("generated_tokens_total", "counter", "Answer tokens generated.", double(s.generated_tokens));
    metric("decode_steps_total", "counter", "Batched decode steps.", double(s.steps));
    metric("requests_running", "gauge", "Requests holding a slot.", double(s.running));
    metric("requests_queued", "gauge", "Requests waiting for a slot (queue depth).", double(s.queued));
    metric("slots", "gauge", "Slots (sequences decoded together).", double(c.engine->options().n_parallel));
    metric("generated_tokens_per_second", "gauge", "Answer tokens per second over the last 10 s.", s.generated_per_s);
    res.set_content(out, "text/plain; version=0.0.4");
}

// Constant-time comparison: the key check does not leak how much of a guess was right.
bool same_key(const std::string & a, const std::string & b) {
    unsigned char diff = a.size() == b.size() ? 0 : 1;
    for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(1, b.size())]);
    return diff == 0;
}

}  // namespace

void mount_api(httplib::Server & server, Engine & engine, const spark_model * model, const ApiConfig & config) {
    auto ctx = std::make_shared<Context>(Context{&engine, model, spark_model_get_tokenizer(model), config, 0, "", "", 0});
    spark_model_info info{};
    spark_model_get_info(model, &info);
    ctx->n_vocab = info.n_vocab;
    ctx->bos     = token_text(ctx->tok, spark_tokenizer_bos(ctx->tok));
    ctx->eos     = token_text(ctx->tok, spark_tokenizer_eos(ctx->tok));
    ctx->created = unix_now();

    // Every handler answers a refused request with an OpenAI error object.
    auto guarded = [ctx](void (*handler)(const Context &, const httplib::Request &, httplib::Response &)) {
        return [ctx, handler](const httplib::Request & req, httplib::Response & res) {
            try {
                handler(*ctx, req, res);
            } catch (const ApiError & e) {
                send_error(res, e);
            } catch (const std::exception & e) {
                send_error(res, ApiError(500, e.what(), "", "", "server_error"));
            }
        };
    };
    server.Post("/v1/chat/completions", guarded(chat_completions));
    server.Post("/chat/completions", guarded(chat_completions));
    server.Post("/v1/completions", guarded(completions));
    server.Post("/completions", guarded(completions));
    server.Post("/apply-template", guarded(apply_template_endpoint));
    server.Post("/tokenize", guarded(tokenize_endpoint));
    server.Post("/detokenize", guarded(detokenize_endpoint));
    server.Get("/v1/models", [ctx](const httplib::Request &, httplib::Response & res) { models_endpoint(*ctx, res); });
    server.Get("/models", [ctx](const httplib::Request &, httplib::Response & res) { models_endpoint(*ctx, res); });
    server.Get("/health", [](const httplib::Request &, httplib::Response & res) { res.set_content("{\"status\":\"ok\"}", "application/json"); });
    server.Get("/metrics", [ctx](const httplib::Request &, httplib::Response & res) { metrics_endpoint(*ctx, res); });
    server.Get("/", [](const httplib::Request &, httplib::Response & res) { res.set_content(kWebIndex, "text/html; charset=utf-8"); });

    // Authentication (every path but the page and /health, which carry nothing private).
    server.set_pre_routing_handler([ctx](const httplib::Request & req, httplib::Response & res) {
        if (ctx->cfg.api_key.empty() || req.path == "/" || req.path == "/health" || req.method == "OPTIONS")
            return httplib::Server::HandlerResponse::Unhandled;
        const std::string auth   = req.get_header_value("Authorization");
        const std::string prefix = "Bearer ";
        if (auth.compare(0, prefix.size(), prefix) == 0 && same_key(auth.substr(prefix.size()), ctx->cfg.api_key))
            return httplib::Server::HandlerResponse::Unhandled;
        send_error(res, ApiError(401, "Invalid API key: send the server's --api-key as 'Authorization: Bearer KEY'", "", "invalid_api_key",
                                 "authentication_error"));
        return httplib::Server::HandlerResponse::Handled;
    });
    // Statuses httplib sets itself (no route, body too large, bad request line) get an error object too.
    server.set_error_handler([](const httplib::Request & req, httplib::Response & res) {
        if (!res.body.empty()) return;
        std::string msg = "error " + std::to_string(res.status);
        std::string type = "invalid_request_error";
        if (res.status == 404) msg = "Not found: " + req.method + " " + req.path;
        else if (res.status == 405) msg = "Method not allowed: " + req.method + " " + req.path;
        else if (res.status == 413) msg = "the request body is too large";
        else if (res.status >= 500) type = "server_error";
        res.set_content(dump(error_body(msg, type, "", "")), "application/json");
    });
    server.set_exception_handler([](const httplib::Request &, httplib::Response & res, std::exception_ptr ep) {
        std::string msg = "internal error";
        try {
            if (ep) std::rethrow_exception(ep);
        } catch (const std::exception & e) {
            msg = e.what();
        } catch (...) {
        }
        res.status = 500;
        res.set_content(dump(error_body(msg, "server_error", "", "")), "application/json");
    });
    server.set_payload_max_length(config.max_body);
}

}  // namespace spark_server
