// Jinja lexer with the whitespace rules transformers configures (trim_blocks=True,
// lstrip_blocks=True, keep_trailing_newline=False), following jinja2's lexer.py.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spark::jinja {

struct Token {
    enum Kind { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End } kind;
    std::string text;  // Text: the data; Name/Op: the spelling; String: the decoded value
    int         line = 1;
    int64_t     int_value   = 0;
    double      float_value = 0;
};

// Throws spark::Error(SPARK_ERR_TEMPLATE) on lexical errors (unterminated tags, strings, comments).
std::vector<Token> lex(const std::string & source);

}  // namespace spark::jinja
