// A read-only memory-mapped file. Weights are used straight from the mapping where their layout
// allows (CPU backend), so a model costs about its file size in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace spark::io {

class MappedFile {
public:
    // Throws Error(SPARK_ERR_IO) when the file is missing or unreadable.
    static std::shared_ptr<MappedFile> open(const std::string & path);
    ~MappedFile();
    MappedFile(const MappedFile &) = delete;
    MappedFile & operator=(const MappedFile &) = delete;

    const uint8_t *     data() const { return data_; }
    size_t              size() const { return size_; }
    const std::string & path() const { return path_; }

private:
    MappedFile() = default;
    const uint8_t * data_ = nullptr;
    size_t          size_ = 0;
    std::string     path_;
};

// Whole-file read into a string (small text files: config.json, tokenizer.json). Throws on error.
std::string read_text_file(const std::string & path);
bool        file_exists(const std::string & path);
bool        is_directory(const std::string & path);
std::string path_join(const std::string & a, const std::string & b);

}  // namespace spark::io
