// The programs print the library's messages (warnings, SPARK_PROFILE* reports) on stderr: the library
// itself prints nothing (spark_log_set).
#pragma once

#include <spark/spark.h>

#include <cstdio>

namespace spark_cli {

inline void log_to_stderr(spark_log_level level, const char * text, void *) {
    if (level <= SPARK_LOG_INFO) std::fputs(text, stderr);
}

inline void install_stderr_log() { spark_log_set(&log_to_stderr, nullptr); }

}  // namespace spark_cli
