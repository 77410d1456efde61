#include "text/tokenizer.h"

#include "common/error.h"
#include "io/config_fields.h"
#include "io/mapped_file.h"
#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/json_reader.h"
#include "text/normalizer.h"
#include "text/regex.h"
#include "text/unicode.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <deque>
#include <unordered_map>
#include <unordered_set>

namespace spark {

using nlohmann::json;

struct Tokenizer::Impl {
    std::string tokenizer_json, tokenizer_config_json, generation_config_json;

    std::unique_ptr<BpeModel>     model;
    std::unique_ptr<Normalizer>   normalizer;
    std::unique_ptr<PreTokenizer> pre_tokenizer;
    AddedTokenMatcher             raw_added;         // added tokens matched on the input text
    AddedTokenMatcher             normalized_added;  // added tokens matched after normalization
    std::vector<AddedToken>       added;             // every added token, in the order HF keeps them
    StringIdMap                   added_by_content;

    bool decoder_byte_level = true;  // false: no decoder, tokens are joined with " "
    bool clean_up_spaces    = false;

    int32_t                     n_vocab = 0;
    std::vector<std::string>    pieces;   // decoded bytes of each id
    std::vector<uint8_t>        special;  // 1 for special added tokens
    std::vector<uint8_t>        present;  // 0 for ids in a gap of the vocabulary
    std::unordered_set<int32_t> eog;
    int32_t                     bos = -1, eos = -1;
    std::optional<std::string>  bos_text, eos_text;
    std::string                 chat_template;

    // add_tokens' state while loading: which live token has each content and id (a token replaced
    // by a later one with the same id stays in `added` as a tombstone until compact_added()).
    std::unordered_map<std::string, size_t> added_slot_of_content;
    std::unordered_map<int32_t, size_t>     added_slot_of_id;
    std::vector<bool>                       added_removed;
    int32_t                                 added_max_id = -1;

    void parse_tokenizer_json();
    void add_tokens(std::vector<AddedToken> tokens);
    void compact_added();
    void parse_config();
    void parse_generation_config();
    void build_pieces();

    void encode_segment(std::string_view text, bool parse_special, std::vector<int32_t> & out) const;
    void encode_words(std::string_view text, std::vector<int32_t> & out) const;
};

namespace {

json parse_small_json(std::string_view text, const char * what) {
    try {
        return json::parse(text);
    } catch (const json::exception & e) {
        fail(SPARK_ERR_INVALID_FORMAT, "%s: %s", what, e.what());
    }
}

// A token string as messages show it: quoted, escaped, cut short.
std::string shown_token(std::string_view token) { return ConfigFields::shown(json(std::string(token))); }

// A vocabulary may leave ids unused (a few published ones have holes), but spark's per-id tables
// are sized by the largest id: past the number of entries plus this many, an id is refused, so that
// what a tokenizer allocates follows the size of its file, not a number written in it.
constexpr int64_t kMaxUnusedIds = 1024;

// "bos_token" / "eos_token" of tokenizer_config.json: a string or an AddedToken object; null: none.
std::optional<std::string> token_text(const ConfigFields & c, const char * key) {
    const json * v = c.find(key);
    if (!v) return std::nullopt;
    if (v->is_string()) return v->get<std::string>();
    if (!v->is_object()) c.bad(key, "must be a string or an object with \"content\", not %s", ConfigFields::shown(*v).c_str());
    return ConfigFields(*v, c.origin(), c.prefix() + key + ".").string("content", "", true);
}

// An entry of "added_tokens" (tokenizer.json) or "added_tokens_decoder" (tokenizer_config.json) at
// `path`; the id is the caller's.
AddedToken added_token_from_json(const json & e, const std::string & origin, const std::string & path) {
    if (!e.is_object()) fail(SPARK_ERR_INVALID_FORMAT, "%s: '%s' must be an object, not %s", origin.c_str(), path.c_str(), ConfigFields::shown(e).c_str());
    const ConfigFields f(e, origin, path + ".");
    AddedToken         t;
    t.content     = f.string("content", "", true);
    if (t.content.size() > AddedTokenMatcher::kMaxTokenBytes)
        f.bad("content", "is %zu bytes; added tokens are at most %zu", t.content.size(), AddedTokenMatcher::kMaxTokenBytes);
    t.single_word = f.boolean("single_word", false);
    t.lstrip      = f.boolean("lstrip", false);
    t.rstrip      = f.boolean("rstrip", false);
    t.special     = f.boolean("special", false);
    t.normalized  = f.boolean("normalized", !t.special);
    return t;
}

// The text of transformers' clean_up_tokenization().
std::string clean_up_tokenization(std::string s) {
    static const std::pair<const char *, const char *> kRules[] = {
        {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
        {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (const auto & [from, to] : kRules) {
        const std::string f(from), t(to);
        std::string out;
        size_t pos = 0, hit;
        while ((hit = s.find(f, pos)) != std::string::npos) {
            out.append(s, pos, hit - pos);
            out += t;
            pos = hit + f.size();
        }
        out.append(s, pos);
        s = std::move(out);
    }
    return s;
}

}  // namespace

void Tokenizer::Impl::parse_tokenizer_json() {
    const std::string_view doc = tokenizer_json;
    const char * what = "tokenizer.json";
    if (const size_t bad = unicode::find_invalid_utf8(doc); bad != std::string_view::npos)
        fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: not valid UTF-8 at byte %zu", bad);

    // Top level: remember where each section is; only "model" is large.
    JsonReader top(doc, what);
    std::string key;
    bool first = true;
    std::optional<std::string_view> model_span, added_span, normalizer_span, pre_span, decoder_span;
    top.begin_object();
    while (top.next_key(key, first)) {
        const std::string_view span = top.skip_value();
        if (key == "model") model_span = span;
        else if (key == "added_tokens") added_span = span;
        else if (key == "normalizer") normalizer_span = span;
        else if (key == "pre_tokenizer") pre_span = span;
        else if (key == "decoder") decoder_span = span;
    }
    top.expect_end();
    if (!model_span) fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: no \"model\" section");

    // model: vocab and merges are read straight into the BPE tables.
    JsonReader r(*model_span, what, doc, size_t(model_span->data() - doc.data()));
    std::vector<std::pair<std::string, int32_t>>     vocab;
    std::vector<std::pair<std::string, std::string>> merges;
    bool have_vocab = false, have_merges = false;
    std::optional<std::string> type;
    BpeOptions options;
    std::string value;
    first = true;
    r.begin_object();
    while (r.next_key(key, first)) {
        if (key == "vocab") {
            if (r.peek_value() != '{') r.error("\"vocab\" must be an object");
            have_vocab = true;
            vocab.reserve(size_t(model_span->size() / 40));
            bool vfirst = true;
            std::string token;
            r.begin_object();
            while (r.next_key(token, vfirst)) {
                const std::string_view text = r.skip_value();
                int64_t                id   = -1;
                const auto [end, ec]        = std::from_chars(text.data(), text.data() + text.size(), id);
                if (ec != std::errc() || end != text.data() + text.size() || id < 0 || id > INT32_MAX)
                    fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: model.vocab[%s]: %s is not a token id (an integer in [0, 2^31))",
                         shown_token(token).c_str(), ConfigFields::shown(json::parse(text, nullptr, false)).c_str());
                vocab.emplace_back(token, int32_t(id));
            }
        } else if (key == "merges") {
            if (r.peek_value() != '[') r.error("\"merges\" must be an array");
            have_merges = true;
            merges.reserve(vocab.size());
            bool mfirst = true;
            r.begin_array();
            while (r.next_element(mfirst)) {
                if (r.peek_value() == '"') {  // "left right"
                    r.read_string(value);
                    const size_t space = value.find(' ');
                    if (space == std::string::npos || value.find(' ', space + 1) != std::string::npos)
                        r.error("a merge must be two tokens separated by one space");
                    merges.emplace_back(value.substr(0, space), value.substr(space + 1));
                } else {  // ["left", "right"]
                    std::pair<std::string, std::string> m;
                    bool pfirst = true;
                    r.begin_array();
                    if (!r.next_element(pfirst)) r.error("a merge pair must have two tokens");
                    r.read_string(m.first);
                    if (!r.next_element(pfirst)) r.error("a merge pair must have two tokens");
                    r.read_string(m.second);
                    if (r.next_element(pfirst)) r.error("a merge pair must have two tokens");
                    merges.push_back(std::move(m));
                }
            }
        } else {
            const json v = parse_small_json(r.skip_value(), what);
            auto opt_string = [&](const char * name) -> std::optional<std::string> {
                if (v.is_null()) return std::nullopt;
                if (!v.is_string()) fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: 'model.%s' must be a string, not %s", name, ConfigFields::shown(v).c_str());
                return v.get<std::string>();
            };
            auto opt_bool = [&](const char * name) {
                if (v.is_null()) return false;
                if (!v.is_boolean()) fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: 'model.%s' must be a boolean, not %s", name, ConfigFields::shown(v).c_str());
                return v.get<bool>();
            };
            if (key == "type") type = opt_string("type");
            else if (key == "unk_token") options.unk_token = opt_string("unk_token");
            else if (key == "continuing_subword_prefix") options.continuing_subword_prefix = opt_string(key.c_str()).value_or("");
            else if (key == "end_of_word_suffix") options.end_of_word_suffix = opt_string(key.c_str()).value_or("");
            else if (key == "fuse_unk") options.fuse_unk = opt_bool("fuse_unk");
            else if (key == "byte_fallback") options.byte_fallback = opt_bool("byte_fallback");
            else if (key == "ignore_merges") options.ignore_merges = opt_bool("ignore_merges");
            else if (key == "dropout") {
                // Dropout is a training-time feature; 0 or null is deterministic.
                if (!v.is_null() && !v.is_number())
                    fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: 'model.dropout' must be a number or null, not %s", ConfigFields::shown(v).c_str());
                if (v.is_number() && v.get<double>() != 0.0) fail(SPARK_ERR_UNSUPPORTED, "tokenizer.json: BPE dropout is not supported");
            }
        }
    }
    r.expect_end();
    if (type && *type != "BPE")
        fail(SPARK_ERR_UNSUPPORTED, "tokenizer.json: model type '%s' is not supported (only BPE)", type->c_str());
    if (!have_vocab) fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: model has no \"vocab\"");
    if (!have_merges) fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: model has no \"merges\"");

    // added_tokens: read before the model is built, as they count towards the ids it may use.
    std::vector<AddedToken> tokens;
    if (added_span) {
        const json a = parse_small_json(*added_span, what);
        if (!a.is_null() && !a.is_array()) fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: 'added_tokens' must be a list, not %s", ConfigFields::shown(a).c_str());
        for (size_t i = 0; a.is_array() && i < a.size(); ++i) {
            const std::string path = "added_tokens[" + std::to_string(i) + "]";
            AddedToken        t    = added_token_from_json(a[i], what, path);
            // HF assigns the ids itself (add_tokens); the file's must still be token ids.
            t.id = int32_t(ConfigFields(a[i], what, path + ".").integer("id", 0, 0, INT32_MAX, true));
            tokens.push_back(std::move(t));
        }
    }
    const int64_t id_limit = int64_t(vocab.size()) + int64_t(tokens.size()) + kMaxUnusedIds;
    for (const auto & [token, id] : vocab)
        if (id >= id_limit)
            fail(SPARK_ERR_INVALID_FORMAT,
                 "tokenizer.json: model.vocab[%s]: id %d is outside [0, %lld) (%zu entries and %zu added tokens; at most %lld ids may be unused)",
                 shown_token(token).c_str(), id, (long long) id_limit, vocab.size(), tokens.size(), (long long) kMaxUnusedIds);

    if (normalizer_span) normalizer = Normalizer::from_json(parse_small_json(*normalizer_span, what));
    if (pre_span) pre_tokenizer = PreTokenizer::from_json(parse_small_json(*pre_span, what));
    options.byte_level = pre_tokenizer && pre_tokenizer->byte_level();
    model = std::make_unique<BpeModel>(std::move(vocab), merges, options);

    decoder_byte_level = false;  // no decoder: tokens are joined with spaces
    if (decoder_span) {
        const json d = parse_small_json(*decoder_span, what);
        if (!d.is_null()) {
            if (!d.is_object()) fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: 'decoder' must be an object or null, not %s", ConfigFields::shown(d).c_str());
            const std::string dtype = ConfigFields(d, what, "decoder.").string("type", "", true);
            if (dtype != "ByteLevel")
                fail(SPARK_ERR_UNSUPPORTED, "tokenizer.json: decoder type %s is not supported (only ByteLevel)", shown_token(dtype).c_str());
            decoder_byte_level = true;
        }
    }
    add_tokens(std::move(tokens));
}

void Tokenizer::Impl::add_tokens(std::vector<AddedToken> tokens) {
    // HF (AddedVocabulary::add_tokens) does not trust the ids written in the file: a token whose
    // text is already known keeps that id (an added token or a vocabulary entry), a new one gets
    // the next id after the vocabulary and the added tokens so far. Each content and each id has
    // at most one live token (a token with a known content takes its id and replaces it), so
    // hash maps find them: a file with many added tokens loads in linear time.
    const auto vocab_size = int32_t(model->vocab_size());
    for (AddedToken & t : tokens) {
        if (t.content.empty()) continue;
        int32_t id = -1;
        if (auto it = added_slot_of_content.find(t.content); it != added_slot_of_content.end()) {
            const AddedToken & o = added[it->second];
            const bool duplicate = o.single_word == t.single_word && o.lstrip == t.lstrip && o.rstrip == t.rstrip &&
                                   o.normalized == t.normalized && o.special == t.special;
            if (duplicate) continue;
            id = o.id;
        }
        if (id < 0) id = model->token_to_id(t.content);
        if (id < 0)
            id = added_max_id < 0 ? vocab_size : (added_max_id >= vocab_size || vocab_size == 0 ? added_max_id + 1 : vocab_size);
        t.id = id;
        // A later token with the same id replaces the earlier one (HF's added_tokens_map_r).
        if (auto it = added_slot_of_id.find(id); it != added_slot_of_id.end()) {
            added_removed[it->second] = true;
            added_slot_of_content.erase(added[it->second].content);
        }
        added_slot_of_content[t.content] = added.size();
        added_slot_of_id[id]             = added.size();
        added_max_id                     = std::max(added_max_id, id);
        added.push_back(std::move(t));
        added_removed.push_back(false);
    }
}

void Tokenizer::Impl::compact_added() {
    std::vector<AddedToken> live;
    for (size_t i = 0; i < added.size(); ++i)
        if (!added_removed[i]) live.push_back(std::move(added[i]));
    added = std::move(live);
    added_slot_of_content.clear();
    added_slot_of_id.clear();
    added_removed.clear();
}

void Tokenizer::Impl::parse_config() {
    if (tokenizer_config_json.empty()) return;
    const std::string what = "tokenizer_config.json";
    const json        c    = parse_small_json(tokenizer_config_json, what.c_str());
    if (!c.is_object()) fail(SPARK_ERR_INVALID_FORMAT, "tokenizer_config.json: not a JSON object");
    const ConfigFields f(c, what);

    // Tokens declared only in the config are added like transformers does.
    if (const json * decoder = f.find("added_tokens_decoder")) {
        if (!decoder->is_object()) f.bad("added_tokens_decoder", "must be an object of token ids, not %s", ConfigFields::shown(*decoder).c_str());
        for (const auto & [id_text, e] : decoder->items()) {
            int64_t    id = -1;
            const auto [end, ec] = std::from_chars(id_text.data(), id_text.data() + id_text.size(), id);
            if (ec != std::errc() || end != id_text.data() + id_text.size() || id < 0 || id > INT32_MAX)
                f.bad("added_tokens_decoder", "key %s is not a token id (an integer in [0, 2^31))", shown_token(id_text).c_str());
            if (added_slot_of_id.count(int32_t(id))) continue;
            AddedToken t = added_token_from_json(e, what, "added_tokens_decoder[\"" + id_text + "\"]");
            t.id         = int32_t(id);
            add_tokens({std::move(t)});
        }
    }
    if (const json * t = f.find("chat_template")) {
        if (t->is_string()) {
            chat_template = t->get<std::string>();
        } else if (t->is_array()) {
            // Named templates: [{"name": "default", "template": "..."}, ...]
            for (size_t i = 0; i < t->size(); ++i) {
                const json &      e    = (*t)[i];
                const std::string path = "chat_template[" + std::to_string(i) + "]";
                if (!e.is_object()) fail(SPARK_ERR_INVALID_FORMAT, "tokenizer_config.json: '%s' must be an object, not %s", path.c_str(), ConfigFields::shown(e).c_str());
                const ConfigFields named(e, what, path + ".");
                const std::string  name = named.string("name", ""), text = named.string("template", "", true);
                if (chat_template.empty() || name == "default") chat_template = text;
            }
        } else {
            f.bad("chat_template", "must be a string or a list of {\"name\", \"template\"}, not %s", ConfigFields::shown(*t).c_str());
        }
    }
    bos_text        = token_text(f, "bos_token");
    eos_text        = token_text(f, "eos_token");
    clean_up_spaces = f.boolean("clean_up_tokenization_spaces", false);
}

void Tokenizer::Impl::parse_generation_config() {
    if (generation_config_json.empty()) return;
    const std::string what = "generation_config.json";
    const json        g    = parse_small_json(generation_config_json, what.c_str());
    if (!g.is_object()) fail(SPARK_ERR_INVALID_FORMAT, "generation_config.json: not a JSON object");
    const ConfigFields f(g, what);
    for (const int32_t id : f.token_ids("eos_token_id", n_vocab)) eog.insert(id);
}

void Tokenizer::Impl::build_pieces() {
    n_vocab = model->max_id() + 1;
    for (const AddedToken & t : added) n_vocab = std::max(n_vocab, t.id + 1);
    pieces.assign(size_t(n_vocab), std::string());
    special.assign(size_t(n_vocab), 0);
    present.assign(size_t(n_vocab), 0);

    // ByteLevel decoder: each character maps back to its byte; a token with a character outside the
    // alphabet is taken as its UTF-8 text (as HF's decoder does).
    auto decode_piece = [&](std::string_view token) {
        if (!decoder_byte_level) return std::string(token);
        std::string bytes;
        bytes.reserve(token.size());
        for (size_t i = 0; i < token.size();) {
            const int b = unicode::codepoint_to_byte(unicode::next_codepoint(token, i));
            if (b < 0) return std::string(token);
            bytes += char(b);
        }
        return bytes;
    };
    for (int32_t id = 0; id <= model->max_id(); ++id) {
        const std::string_view token = model->id_to_token(id);
        pieces[size_t(id)]  = decode_piece(token);
        present[size_t(id)] = !token.empty() || model->token_to_id(token) == id;
    }
    for (const AddedToken & t : added) {
        pieces[size_t(t.id)]  = decode_piece(t.content);
        special[size_t(t.id)] = t.special;
        present[size_t(t.id)] = 1;
    }

    // Added tokens with normalized=true are matched on normalized text, in their normalized form.
    std::vector<AddedToken> raw, norm;
    for (const AddedToken & t : added) {
        if (!unicode::is_valid_utf8(t.content))
            fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: added token %d is not valid UTF-8", t.id);
        added_by_content.insert(t.content, t.id);
        if (t.normalized && normalizer) {
            AddedToken n = t;
            n.content = normalizer->apply(t.content);
            if (n.content.size() > AddedTokenMatcher::kMaxTokenBytes)
                fail(SPARK_ERR_INVALID_FORMAT, "tokenizer.json: added token %s is %zu bytes once normalized; added tokens are at most %zu",
                     shown_token(t.content).c_str(), n.content.size(), AddedTokenMatcher::kMaxTokenBytes);
            norm.push_back(std::move(n));
        } else {
            raw.push_back(t);
        }
    }
    raw_added.build(std::move(raw));
    normalized_added.build(std::move(norm));
}

Tokenizer Tokenizer::from_json_strings(std::string tokenizer_json, std::string tokenizer_config_json,
                                       std::string generation_config_json) {
    auto impl                    = std::make_unique<Impl>();
    impl->tokenizer_json         = std::move(tokenizer_json);
    impl->tokenizer_config_json  = std::move(tokenizer_config_json);
    impl->generation_config_json = std::move(generation_config_json);
    impl->parse_tokenizer_json();
    impl->parse_config();
    impl->compact_added();
    impl->build_pieces();
    impl->parse_generation_config();  // its ids are checked against the vocabulary
    Tokenizer tok(std::move(impl));
    Impl & t = *tok.impl_;
    t.bos = t.bos_text ? tok.find(*t.bos_text) : -1;
    t.eos = t.eos_text ? tok.find(*t.eos_text) : -1;
    if (t.eos >= 0) t.eog.insert(t.eos);
    return tok;

}

Tokenizer Tokenizer::from_file(const std::string & path) {
    return from_json_strings(io::read_text_file(path), std::string(), std::string());
}

Tokenizer Tokenizer::from_directory(const std::string & dir) {
    const std::string tok_path = io::path_join(dir, "tokenizer.json");
    if (!io::file_exists(tok_path)) fail(SPARK_ERR_IO, "no tokenizer.json in %s", dir.c_str());
    std::string config, generation;
    const std::string config_path = io::path_join(dir, "tokenizer_config.json");
    if (io::file_exists(config_path)) config = io::read_text_file(config_path);
    const std::string gen_path = io::path_join(dir, "generation_config.json");
    if (io::file_exists(gen_path)) generation = io::read_text_file(gen_path);
    // Newer checkpoints keep the template in its own file, which transformers prefers.
    const std::string jinja_path = io::path_join(dir, "chat_template.jinja");
    if (io::file_exists(jinja_path)) {
        json c = config.empty() ? json::object() : parse_small_json(config, "tokenizer_config.json");
        if (c.is_object()) {
            c["chat_template"] = io::read_text_file(jinja_path);
            config = c.dump(2);
        }
    }
    return from_json_strings(io::read_text_file(tok_path), std::move(config), std::move(generation));
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer &&) noexcept             = default;
Tokenizer & Tokenizer::operator=(Tokenizer &&) noexcept = default;
Tokenizer::~Tokenizer()                                 = default;

// ------------------------------------------------------------------------------------------------
// Encoding

void Tokenizer::Impl::encode_words(std::string_view text, std::vector<int32_t> & out) const {
    if (!pre_tokenizer) {
        model->tokenize(text, out);
        return;
    }
    thread_local std::vector<std::string_view> words;
    thread_local std::deque<std::string>       storage;
    words.clear();
    storage.clear();
    pre_tokenizer->split(text, words, storage);
    for (std::string_view w : words) model->tokenize(w, out);
}

void Tokenizer::Impl::encode_segment(std::string_view text, bool parse_special, std::vector<int32_t> & out) const {
    std::string normalized;
    if (normalizer) {
        normalized = normalizer->apply(text);
        text       = normalized;
    }
    if (normalized_added.empty()) {
        encode_words(text, out);
        return;
    }
    std::vector<AddedTokenMatcher::Segment> segments;
    normalized_added.split(text, !parse_special, segments);
    for (const auto & s : segments) {
        if (s.token >= 0) out.push_back(normalized_added.token(s.token).id);
        else encode_words(text.substr(s.begin, s.end - s.begin), out);
    }
}

void Tokenizer::encode(std::string_view text, bool parse_special, std::vector<int32_t> & out) const {
    if (const size_t bad = unicode::find_invalid_utf8(text); bad != std::string_view::npos)
        fail(SPARK_ERR_INVALID_TEXT, "text is not valid UTF-8 (invalid sequence at byte %zu)", bad);
    RegexBudget budget(text.size());  // pre-tokenizer searches: linear in the text, whatever the patterns
    if (impl_->raw_added.empty()) {
        impl_->encode_segment(text, parse_special, out);
        return;
    }
    std::vector<AddedTokenMatcher::Segment> segments;
    impl_->raw_added.split(text, !parse_special, segments);
    for (const auto & s : segments) {
        if (s.token >= 0) out.push_back(impl_->raw_added.token(s.token).id);
        else impl_->encode_segment(text.substr(s.begin, s.end - s.begin), parse_special, out);
    }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
    std::vector<int32_t> ids;
    encode(text, parse_special, ids);
    return ids;
}

// ------------------------------------------------------------------------------------------------
// Decoding and queries

std::string_view Tokenizer::piece(int32_t id) const {
    if (!is_valid(id)) fail(SPARK_ERR_INVALID_TOKEN, "token id %d is outside [0, %d)", id, impl_->n_vocab);
    return impl_->pieces[size_t(id)];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
    std::string bytes;
    bool first = true;
    for (const int32_t id : ids) {
        const std::string_view p = piece(id);
        if (skip_special && impl_->special[size_t(id)]) continue;
        if (!impl_->present[size_t(id)]) continue;  // an id in a gap of the vocabulary: HF skips it
        if (!impl_->decoder_byte_level && !first) bytes += ' ';
        bytes.append(p);
        first = false;
    }
    std::string text;
    text.reserve(bytes.size());
    unicode::append_utf8_lossy(text, bytes);
    if (impl_->clean_up_spaces) text = clean_up_tokenization(std::move(text));
    return text;
}

int32_t Tokenizer::n_vocab() const { return impl_->n_vocab; }
int32_t Tokenizer::bos() const { return impl_->bos; }
int32_t Tokenizer::eos() const { return impl_->eos; }
bool    Tokenizer::is_eog(int32_t id) const { return impl_->eog.count(id) != 0; }
bool    Tokenizer::is_special(int32_t id) const { return is_valid(id) && impl_->special[size_t(id)]; }
bool    Tokenizer::joins_with_spaces() const { return !impl_->decoder_byte_level; }

int32_t Tokenizer::find(std::string_view token) const {
    const int32_t added = impl_->added_by_content.find(token);
    return added >= 0 ? added : impl_->model->token_to_id(token);
}

const std::string &                Tokenizer::chat_template() const { return impl_->chat_template; }
const std::optional<std::string> & Tokenizer::bos_token_text() const { return impl_->bos_text; }
const std::optional<std::string> & Tokenizer::eos_token_text() const { return impl_->eos_text; }
const std::string &                Tokenizer::tokenizer_json() const { return impl_->tokenizer_json; }
const std::string &                Tokenizer::tokenizer_config_json() const { return impl_->tokenizer_config_json; }
const std::string &                Tokenizer::generation_config_json() const { return impl_->generation_config_json; }

}  // namespace spark
