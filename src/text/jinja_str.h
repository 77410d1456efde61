// Python's str for the Jinja evaluator: the str methods templates call (split, strip, replace,
// format, ...), indexing and slicing by code point, printf-style `%` formatting, substring search in
// linear time, and the budgeted string building they share. Every function counts its work and
// memory against the render's Budget (jinja_value.h), whatever the text.
#pragma once

#include "text/jinja_value.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace spark::jinja {

// Code point boundaries of a UTF-8 string: offsets[i] is where character i starts.
std::vector<size_t> char_offsets(const std::string & s);

// Python's slice.indices(length): the positions start, start + step, ... (count of them).
struct SliceRange {
    int64_t start, step, count;
    int64_t at(int64_t k) const { return start + k * step; }
};
SliceRange  slice_range(int64_t n, const Value & start, const Value & stop, const Value & step, int line);
// s[start:stop:step], by code points.
std::string slice_string(const std::string & s, const Value & start, const Value & stop, const Value & step, int line);

// The first occurrence of `needle` at or after `from`, in linear time whatever the text.
size_t find_text(std::string_view text, std::string_view needle, size_t from = 0);

// Appends to a string being built piece by piece (join, replace, format, ...): its growth is
// checked against the memory budget, and the copy counts as work.
void append_checked(std::string & out, std::string_view piece);

// str.strip/lstrip/rstrip (chars: nullptr or None strips whitespace), str.split (sep and maxsplit:
// nullptr when not given), str.replace (count < 0: all), str.upper/lower, str.capitalize.
std::string strip_chars(const std::string & s, const Value * chars, bool left, bool right, int line);
List        split_string(const std::string & s, const Value * sep, const Value * maxsplit, int line);
std::string replace_all(const std::string & s, const std::string & from, const std::string & to, int64_t count);
std::string map_case(const std::string & s, bool upper);
std::string py_capitalize(const std::string & s);

// Decimal digits as a small non-negative number; -1 when they are not (all digits, below 10^9).
int64_t small_number(std::string_view digits);
// A float as an int64 (Python's int(x)); overflow is an error rather than a bigint.
int64_t float_to_int(double x, int line);
// printf-style "%s" % args (the string % operator and the format filter).
std::string percent_format(const std::string & fmt, const Value & args, int line);

// The str methods: whether `name` is one, and calling it on `s`.
bool  is_str_method(std::string_view name);
Value str_method(const Value & s, CallArgs & a, std::string_view name);

}  // namespace spark::jinja
