// One command-line convention for every program: --help and --version exit 0; a parse error (a
// value that does not parse or is out of range, an unknown option) prints "PROGRAM: what" and the
// hint to --help, and exits 2.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>

namespace spark_cli {

// Parses argv into `app`; an exit status when the program should stop now, nullopt to go on.
inline std::optional<int> parse_args(CLI::App & app, int argc, const char * const * argv, const std::string & program) {
    app.failure_message([program](const CLI::App *, const CLI::Error & e) { return program + ": " + e.what() + "\nRun with --help for more information.\n"; });
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError & e) {
        return app.exit(e) == 0 ? 0 : 2;
    }
    return std::nullopt;
}

}  // namespace spark_cli
