// UTF-8 and Unicode helpers shared by the tokenizer and the chat-template interpreter.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace spark::unicode {

constexpr uint32_t kReplacementChar = 0xFFFD;

// Byte offset of the first invalid UTF-8 sequence in `s`, or std::string_view::npos when `s` is valid
// (valid = well-formed per Unicode: no overlongs, no surrogates, nothing above U+10FFFF).
size_t find_invalid_utf8(std::string_view s);
inline bool is_valid_utf8(std::string_view s) { return find_invalid_utf8(s) == std::string_view::npos; }

// Decodes the code point starting at s[i] and advances i. `s` must be valid UTF-8.
uint32_t next_codepoint(std::string_view s, size_t & i);
void     append_utf8(std::string & out, uint32_t cp);
// Number of code points of a valid UTF-8 string.
size_t   count_codepoints(std::string_view s);

// Result of examining the UTF-8 sequence that starts at s[i].
struct Utf8Step {
    enum Kind { Valid, Invalid, Incomplete } kind;
    size_t length;  // Valid: sequence length; Invalid: length of the maximal invalid subpart (>= 1);
                    // Incomplete: bytes of a valid prefix that runs into the end of `s`.
};
Utf8Step utf8_step(std::string_view s, size_t i);

// Appends `bytes` to `out`, replacing every maximal invalid subpart with U+FFFD: the same output as
// Rust's String::from_utf8_lossy and Python's bytes.decode("utf-8", "replace").
void append_utf8_lossy(std::string & out, std::string_view bytes);

// Unicode normalization forms (utf8proc). The input must be valid UTF-8.
enum class NormalForm { NFC, NFD, NFKC, NFKD };
std::string normalize(std::string_view s, NormalForm form);

// Rust's char::is_whitespace / char::is_alphanumeric (used by added-token lstrip/rstrip/single_word).
bool is_rust_whitespace(uint32_t cp);
bool is_rust_alphanumeric(uint32_t cp);
// Python's str.isspace() for one code point (str.strip()/split() with no argument).
bool is_python_space(uint32_t cp);
// Simple (1:1) case mappings.
uint32_t to_upper(uint32_t cp);
uint32_t to_lower(uint32_t cp);
bool     is_alpha(uint32_t cp);
bool     is_digit(uint32_t cp);

// GPT-2 byte-level alphabet: every byte is mapped to a printable code point (bytes_to_unicode).
const std::array<uint32_t, 256> & byte_to_codepoint();
// The byte of a byte-level code point, or -1 when the code point is not in the alphabet.
int codepoint_to_byte(uint32_t cp);

}  // namespace spark::unicode
