// Shared helpers of the tokenizer tests: test data paths and JSONL goldens.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace tokenizer_test {

inline std::string data_path(const std::string & rel) { return std::string(SPARK_TEST_DATA) + "/tokenizers/" + rel; }

inline std::string read_file(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open " + path);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

inline std::vector<nlohmann::ordered_json> read_jsonl(const std::string & path) {
    std::vector<nlohmann::ordered_json> out;
    std::ifstream f(path);
    if (!f) throw std::runtime_error("cannot open " + path);
    std::string line;
    while (std::getline(f, line))
        if (!line.empty()) out.push_back(nlohmann::ordered_json::parse(line));
    return out;
}

}  // namespace tokenizer_test
