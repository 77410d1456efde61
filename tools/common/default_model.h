// The model spark-chat and spark-server load without -m: the installed demo model
// (<exe dir>/../share/spark/models/spark-demo-coder-moe) when the program runs from an install
// (<prefix>/bin) that has it; otherwise the source tree's (SPARK_DEFAULT_MODEL, set by the build).
// Header-only: each program links only libspark.
#pragma once

#include <filesystem>
#include <string>
#include <system_error>

namespace spark_cli {

inline std::string default_model() {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path  exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec && exe.has_parent_path()) {
        const fs::path installed = (exe.parent_path() / ".." / "share" / "spark" / "models" / "spark-demo-coder-moe").lexically_normal();
        if (fs::exists(installed, ec)) return installed.string();
    }
    return SPARK_DEFAULT_MODEL;
}

}  // namespace spark_cli
