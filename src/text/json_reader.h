// A strict, allocation-light pull parser for large JSON documents. tokenizer.json is ~11 MB with
// 150k vocab entries and 150k merges; building a generic DOM for it costs several hundred ms, so the
// loader walks it with this reader instead and reads only the small sections into nlohmann::json.
// Every syntax error (including truncation) throws spark::Error(SPARK_ERR_INVALID_FORMAT) with the
// line, column and byte offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace spark {

class JsonReader {
public:
    // `what` names the document in error messages ("tokenizer.json"). `base` is the offset of
    // `text` inside `whole` (for positions in error messages when reading a sub-span).
    JsonReader(std::string_view text, std::string what, std::string_view whole = {}, size_t base = 0);

    // The first character of the next value after whitespace: '{', '[', '"', 't', 'f', 'n', '-' or a digit.
    char peek_value();

    // Object iteration:  bool first = true; std::string key;
    //                    r.begin_object(); while (r.next_key(key, first)) { ...read the value... }
    void begin_object();
    bool next_key(std::string & key, bool & first);
    // Array iteration:   r.begin_array(); while (r.next_element(first)) { ...read the value... }
    void begin_array();
    bool next_element(bool & first);

    void        read_string(std::string & out);  // decodes escapes
    int64_t     read_int();                      // an integer number (fails on fractions)
    bool        read_bool();
    bool        try_read_null();                 // consumes `null` if that is what comes next
    // Validates and skips one value; returns its exact text (for nlohmann::json::parse).
    std::string_view skip_value();

    void   expect_end();  // only whitespace may follow
    size_t position() const { return pos_; }
    [[noreturn]] void error(const char * message) const;

private:
    void skip_ws();
    void expect(char c);
    void skip_string();
    void skip_number();
    void skip_literal(const char * lit);

    std::string_view text_;
    std::string_view whole_;
    size_t           base_;
    size_t           pos_ = 0;
    std::string      what_;
};

}  // namespace spark
