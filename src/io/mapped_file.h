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
    // The open file behind the mapping, for positioned reads (pread) of large ranges: faster than
    // faulting the mapping in, and from several threads at once.
    int                 fd() const { return fd_; }
    bool                contains(const void * p) const { return data_ && p >= data_ && p < data_ + size_; }

    // Reads [offset, offset + bytes) with pread, whole. Throws Error(SPARK_ERR_IO) on a read error
    // or when the file has become shorter. Thread-safe.
    void read_at(void * dst, size_t offset, size_t bytes) const;
    // Asks the kernel to start reading [offset, offset + bytes) into the page cache (no wait).
    void prefetch(size_t offset, size_t bytes) const;

private:
    MappedFile() = default;
    const uint8_t * data_ = nullptr;
    size_t          size_ = 0;
    int             fd_   = -1;
    std::string     path_;
};

// Whole-file read into a string (small text files: config.json, tokenizer.json). Throws on error.
std::string read_text_file(const std::string & path);
bool        file_exists(const std::string & path);
bool        is_directory(const std::string & path);
std::string path_join(const std::string & a, const std::string & b);

}  // namespace spark::io
