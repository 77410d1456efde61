// What the evaluator (jinja_eval.cpp) shares with the filters and tests: Python's operators on
// values, and attribute and item lookup with jinja2's rules.
#pragma once

#include "text/jinja_value.h"

#include <string>
#include <string_view>

namespace spark::jinja {

// a <op> b for + - * / // % ** with Python semantics on int64/double (overflow is an error rather
// than a bigint; str % args formats).
Value arithmetic(std::string_view op, const Value & a, const Value & b, int line);
// `item in container`.
bool  contains(const Value & container, const Value & item, int line);

// obj.name and obj[key]: jinja2 tries a dict's methods before its items, and a missing one is an
// Undefined that says what was missing.
Value get_attr(const Value & obj, const std::string & name, int line);
Value get_item(const Value & obj, const Value & key, int line);
// obj.name as a value: a bound method (of str, dict or list), or undefined.
Value bound_method(const Value & obj, const std::string & name, int line);

}  // namespace spark::jinja
