// The library's only way to print: messages go to the host's callback (spark_log_set), nothing is
// printed without one. Thread-safe.
#pragma once

#include <spark/spark.h>

namespace spark {

void log_message(spark_log_level level, const char * text);

template <typename... Args> void log(spark_log_level level, const char * fmt, Args... args);

}  // namespace spark

#include "common/error.h"

namespace spark {

template <typename... Args> void log(spark_log_level level, const char * fmt, Args... args) { log_message(level, strfmt(fmt, args...).c_str()); }

}  // namespace spark
