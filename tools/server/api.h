// The HTTP endpoints of spark-server: OpenAI's /v1/chat/completions, /v1/completions and
// /v1/models, llama-server's /tokenize, /detokenize and /health, Prometheus /metrics and the chat
// page at /. Requests are checked field by field; anything wrong is answered with an OpenAI error
// object, never a crash: the server keeps serving its other clients.
#pragma once

#include "engine.h"

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

namespace httplib {
class Server;
}

namespace spark_server {

struct ApiConfig {
    std::string    model_id;           // the name /v1/models reports
    std::string    api_key;            // empty: no authentication
    std::string    chat_template;      // the model's, or --chat-template-file
    nlohmann::json template_kwargs = nlohmann::json::object();  // --chat-template-kwargs (e.g. enable_thinking)
    SamplingParams sampling;           // the defaults of every request
    int32_t        n_ctx_slot = 0;     // prompt + answer tokens of one request
    size_t         max_body   = 8u << 20;
    bool           speculative = false;  // --spec: no logits reach the host, so no logprobs
};

// A request the server refuses, answered as OpenAI does: {"error": {message, type, param, code}}
// with this HTTP status.
struct RequestError : std::runtime_error {
    int         status;
    std::string type, param, code;
    RequestError(int st, std::string msg, std::string p = "", std::string c = "", std::string t = "invalid_request_error")
        : std::runtime_error(std::move(msg)), status(st), type(std::move(t)), param(std::move(p)), code(std::move(c)) {}
};

// Mounts every endpoint on `server`. The engine, model and config must outlive it.
void mount_api(httplib::Server & server, Engine & engine, const spark_model * model, const ApiConfig & config);

}  // namespace spark_server
