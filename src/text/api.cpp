// C API of the tokenizer and the chat templates (spark.h, sections "Tokenizer" and "Chat templates").
#include "common/error.h"
#include "io/gguf_reader.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

#include <spark/spark.h>

#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>

using spark::fail;

struct spark_detok_stream {
    spark_detok_stream(const spark::Tokenizer * t, bool skip) : tokenizer(t), skip_special(skip) {}
    const spark::Tokenizer * tokenizer;
    bool                     skip_special;
    bool                     first = true;  // for tokenizers that join tokens with spaces
    std::string              pending;       // bytes not yet returned: an incomplete UTF-8 tail
};

namespace {

const spark::Tokenizer & tokenizer_of(const spark_tokenizer * tok) {
    if (!tok) fail(SPARK_ERR_INVALID_ARGUMENT, "tokenizer is NULL");
    return tok->tokenizer;
}

// The shared output protocol: copy what fits, report the full length, fail when it did not fit.
void write_output(std::string_view bytes, char * buf, size_t capacity, size_t * len, bool nul_if_room = false) {
    if (!len) fail(SPARK_ERR_INVALID_ARGUMENT, "len is NULL");
    if (!buf && capacity > 0) fail(SPARK_ERR_INVALID_ARGUMENT, "buf is NULL but capacity is %zu", capacity);
    *len = bytes.size();
    std::copy_n(bytes.begin(), std::min(capacity, bytes.size()), buf);
    if (bytes.size() > capacity)
        fail(SPARK_ERR_BUFFER_TOO_SMALL, "output needs %zu bytes, the buffer holds %zu", bytes.size(), capacity);
    if (nul_if_room && bytes.size() < capacity) buf[bytes.size()] = '\0';
}

// Splits `pending` into the complete-character prefix to return now (invalid sequences already
// replaced by U+FFFD) and the incomplete tail to keep.
size_t complete_prefix(std::string_view pending) {
    size_t i = 0;
    while (i < pending.size()) {
        const auto step = spark::unicode::utf8_step(pending, i);
        if (step.kind == spark::unicode::Utf8Step::Incomplete) break;
        i += step.length;
    }
    return i;
}

}  // namespace

extern "C" {

SPARK_API spark_status spark_tokenizer_load(const char * path, spark_tokenizer ** out) {
    return spark::api_guard([&] {
        if (!path || !out) fail(SPARK_ERR_INVALID_ARGUMENT, "path and out must not be NULL");
        struct stat st {};
        if (::stat(path, &st) != 0) fail(SPARK_ERR_IO, "cannot open %s: %s", path, std::strerror(errno));
        std::unique_ptr<spark_tokenizer> tok;
        if (S_ISDIR(st.st_mode)) {
            tok.reset(new spark_tokenizer{spark::Tokenizer::from_directory(path)});
        } else {
            char magic[4] = {};
            std::ifstream f(path, std::ios::binary);
            if (!f) fail(SPARK_ERR_IO, "cannot read %s", path);
            f.read(magic, 4);
            if (f.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0) {
                // A spark file stores the three source documents verbatim (docs/FORMAT.md).
                auto gguf = spark::io::GgufFile::open(path);
                auto json = gguf->get_string("tokenizer.huggingface.json");
                if (!json) fail(SPARK_ERR_INVALID_FORMAT, "%s: the spark file holds no tokenizer (tokenizer.huggingface.json)", path);
                tok.reset(new spark_tokenizer{spark::Tokenizer::from_json_strings(
                    *json, gguf->get_string("spark.tokenizer_config_json").value_or(""),
                    gguf->get_string("spark.generation_config_json").value_or(""))});
            } else {
                tok.reset(new spark_tokenizer{spark::Tokenizer::from_file(path)});
            }
        }
        *out = tok.release();
    });
}

SPARK_API void spark_tokenizer_free(spark_tokenizer * tok) { delete tok; }

SPARK_API int32_t spark_tokenizer_n_vocab(const spark_tokenizer * tok) { return tok ? tok->tokenizer.n_vocab() : 0; }
SPARK_API spark_token spark_tokenizer_bos(const spark_tokenizer * tok) { return tok ? tok->tokenizer.bos() : -1; }
SPARK_API spark_token spark_tokenizer_eos(const spark_tokenizer * tok) { return tok ? tok->tokenizer.eos() : -1; }

SPARK_API bool spark_tokenizer_is_eog(const spark_tokenizer * tok, spark_token token) {
    return tok && tok->tokenizer.is_eog(token);
}

SPARK_API bool spark_tokenizer_is_special(const spark_tokenizer * tok, spark_token token) {
    return tok && tok->tokenizer.is_special(token);
}

SPARK_API spark_token spark_tokenizer_find(const spark_tokenizer * tok, const char * text) {
    if (!tok || !text) return -1;
    return tok->tokenizer.find(text);
}

SPARK_API spark_status spark_tokenize(const spark_tokenizer * tok, const char * text, size_t len, bool parse_special,
                                      spark_token * tokens, int32_t capacity, int32_t * n_tokens) {
    return spark::api_guard([&] {
        const spark::Tokenizer & t = tokenizer_of(tok);
        if (!text && len > 0) fail(SPARK_ERR_INVALID_ARGUMENT, "text is NULL but len is %zu", len);
        if (!n_tokens) fail(SPARK_ERR_INVALID_ARGUMENT, "n_tokens is NULL");
        if (capacity < 0 || (!tokens && capacity > 0))
            fail(SPARK_ERR_INVALID_ARGUMENT, "bad output buffer (tokens %p, capacity %d)", (void *) tokens, capacity);
        const std::vector<int32_t> ids = t.encode(std::string_view(text ? text : "", len), parse_special);
        if (ids.size() > size_t(INT32_MAX)) fail(SPARK_ERR_INVALID_ARGUMENT, "text produces more than INT32_MAX tokens");
        *n_tokens = int32_t(ids.size());
        // std::copy_n, not memcpy: an empty vector's data() may be null, which memcpy must not get.
        std::copy_n(ids.begin(), std::min(ids.size(), size_t(capacity)), tokens);
        if (ids.size() > size_t(capacity))
            fail(SPARK_ERR_BUFFER_TOO_SMALL, "%zu tokens do not fit in a buffer of %d", ids.size(), capacity);
    });
}

SPARK_API spark_status spark_token_to_piece(const spark_tokenizer * tok, spark_token token, char * buf,
                                            size_t capacity, size_t * len) {
    return spark::api_guard([&] { write_output(tokenizer_of(tok).piece(token), buf, capacity, len); });
}

SPARK_API spark_status spark_detokenize(const spark_tokenizer * tok, const spark_token * tokens, int32_t n_tokens,
                                        bool skip_special, char * buf, size_t capacity, size_t * len) {
    return spark::api_guard([&] {
        const spark::Tokenizer & t = tokenizer_of(tok);
        if (n_tokens < 0 || (!tokens && n_tokens > 0))
            fail(SPARK_ERR_INVALID_ARGUMENT, "bad token array (tokens %p, n_tokens %d)", (const void *) tokens, n_tokens);
        const std::string text = t.decode(std::span<const int32_t>(tokens, size_t(n_tokens)), skip_special);
        write_output(text, buf, capacity, len);
    });
}

SPARK_API spark_detok_stream * spark_detok_stream_init(const spark_tokenizer * tok, bool skip_special) {
    if (!tok) {
        spark::set_last_error("tokenizer is NULL");
        return nullptr;
    }
    return new (std::nothrow) spark_detok_stream(&tok->tokenizer, skip_special);
}

SPARK_API spark_status spark_detok_stream_push(spark_detok_stream * s, spark_token token, char * buf, size_t capacity,
                                               size_t * len) {
    return spark::api_guard([&] {
        if (!s) fail(SPARK_ERR_INVALID_ARGUMENT, "stream is NULL");
        if (!len) fail(SPARK_ERR_INVALID_ARGUMENT, "len is NULL");
        const spark::Tokenizer & t = *s->tokenizer;
        const std::string_view piece = t.piece(token);
        // Build the new state first: when the output does not fit, the stream is left unchanged
        // so that the caller can push the same token again with a larger buffer.
        std::string pending = s->pending;
        bool        first   = s->first;
        if (!(s->skip_special && t.is_special(token))) {
            if (t.joins_with_spaces() && !first) pending += ' ';
            pending.append(piece);
            first = false;
        }
        const size_t ready = complete_prefix(pending);
        std::string text;
        spark::unicode::append_utf8_lossy(text, std::string_view(pending).substr(0, ready));
        if (text.size() > capacity) {
            *len = text.size();
            fail(SPARK_ERR_BUFFER_TOO_SMALL, "output needs %zu bytes, the buffer holds %zu", text.size(), capacity);
        }
        write_output(text, buf, capacity, len);
        s->pending = pending.substr(ready);
        s->first   = first;
    });
}

SPARK_API spark_status spark_detok_stream_flush(spark_detok_stream * s, char * buf, size_t capacity, size_t * len) {
    return spark::api_guard([&] {
        if (!s) fail(SPARK_ERR_INVALID_ARGUMENT, "stream is NULL");
        std::string text;
        spark::unicode::append_utf8_lossy(text, s->pending);
        write_output(text, buf, capacity, len);
        s->pending.clear();
        s->first = true;
    });
}

SPARK_API void spark_detok_stream_free(spark_detok_stream * s) { delete s; }

SPARK_API const char * spark_tokenizer_chat_template(const spark_tokenizer * tok) {
    if (!tok || tok->tokenizer.chat_template().empty()) return nullptr;
    return tok->tokenizer.chat_template().c_str();
}

SPARK_API spark_status spark_chat_apply_template(const char * tmpl, const spark_chat_message * messages,
                                                 size_t n_messages, bool add_generation_prompt, const char * tools_json,
                                                 const char * extra_context_json, const char * bos_token,
                                                 const char * eos_token, char * buf, size_t capacity, size_t * len) {
    return spark::api_guard([&] {
        if (!tmpl) fail(SPARK_ERR_INVALID_ARGUMENT, "template is NULL");
        if (!messages && n_messages > 0) fail(SPARK_ERR_INVALID_ARGUMENT, "messages is NULL but n_messages is %zu", n_messages);
        spark::ChatInputs in;
        for (size_t i = 0; i < n_messages; ++i) {
            const spark_chat_message & m = messages[i];
            if (!m.role) fail(SPARK_ERR_INVALID_ARGUMENT, "message %zu has no role", i);
            spark::ChatMessage cm;
            cm.role = m.role;
            if (m.content) cm.content = std::string(m.content);
            if (m.reasoning_content) cm.reasoning_content = std::string(m.reasoning_content);
            if (m.tool_calls_json) cm.tool_calls_json = std::string(m.tool_calls_json);
            if (m.name) cm.name = std::string(m.name);
            in.messages.push_back(std::move(cm));
        }
        in.add_generation_prompt = add_generation_prompt;
        if (tools_json) in.tools_json = std::string(tools_json);
        if (extra_context_json) in.extra_context_json = std::string(extra_context_json);
        if (bos_token) in.bos_token = std::string(bos_token);
        if (eos_token) in.eos_token = std::string(eos_token);
        const std::string text = spark::render_chat_template(tmpl, in);
        write_output(text, buf, capacity, len, /*nul_if_room=*/true);
    });
}

}  // extern "C"
