// --version for every program: the library's build description (version, commit, backends, CUDA
// targets; spark_build_info), the same wherever it is asked.
#pragma once

#include <CLI/CLI.hpp>
#include <spark/spark.h>

#include <string>

namespace spark_cli {

inline void add_version_flag(CLI::App & app, const std::string & program) {
    app.set_version_flag("--version", program + ": " + spark_build_info(), "print the version, the commit, the backends and the CUDA targets, and exit");
}

}  // namespace spark_cli
