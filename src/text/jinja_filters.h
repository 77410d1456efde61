// The filters (`v | name(args)`) and tests (`v is name(args)`) of the Jinja subset, each a table of
// name -> function (jinja_filters.cpp). The tables are the lists of what is supported: the parser
// rejects other names, as jinja2 does when it compiles a template.
#pragma once

#include "text/jinja_value.h"

#include <string>

namespace spark::jinja {

bool is_known_filter(const std::string & name);
bool is_known_test(const std::string & name);

// Throw SPARK_ERR_TEMPLATE for an unknown name, bad arguments, or what the filter or test refuses.
Value apply_filter(const std::string & name, const Value & v, CallArgs & a, Context & ctx, int line);
bool  apply_test(const std::string & name, const Value & v, CallArgs & a, Context & ctx, int line);

}  // namespace spark::jinja
