#include "io/mapped_file.h"

#include "common/error.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sstream>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace spark::io {

std::shared_ptr<MappedFile> MappedFile::open(const std::string & path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(SPARK_ERR_IO, "cannot open '%s': %s", path.c_str(), std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(SPARK_ERR_IO, "'%s' is not a regular file", path.c_str());
    }
    std::shared_ptr<MappedFile> f(new MappedFile());
    f->path_ = path;
    f->size_ = size_t(st.st_size);
    if (f->size_ > 0) {
        void * p = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            ::close(fd);
            fail(SPARK_ERR_IO, "cannot map '%s': %s", path.c_str(), std::strerror(e));
        }
        f->data_ = static_cast<const uint8_t *>(p);
    }
    f->fd_ = fd;
    return f;
}

MappedFile::~MappedFile() {
    if (data_) munmap(const_cast<uint8_t *>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
}

void MappedFile::read_at(void * dst, size_t offset, size_t bytes) const {
    if (offset > size_ || bytes > size_ - offset)
        fail(SPARK_ERR_INTERNAL, "read of [%zu, +%zu) outside '%s' (%zu bytes)", offset, bytes, path_.c_str(), size_);
    auto * out = static_cast<uint8_t *>(dst);
    while (bytes > 0) {
        const ssize_t n = ::pread(fd_, out, bytes, off_t(offset));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fail(SPARK_ERR_IO, "cannot read '%s' at offset %zu: %s", path_.c_str(), offset, std::strerror(errno));
        if (n == 0) fail(SPARK_ERR_IO, "cannot read '%s' at offset %zu: the file has become shorter", path_.c_str(), offset);
        out += n;
        offset += size_t(n);
        bytes -= size_t(n);
    }
}

void MappedFile::prefetch(size_t offset, size_t bytes) const {
    if (fd_ >= 0 && offset < size_) (void) posix_fadvise(fd_, off_t(offset), off_t(std::min(bytes, size_ - offset)), POSIX_FADV_WILLNEED);
}

std::string read_text_file(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(SPARK_ERR_IO, "cannot open '%s'", path.c_str());
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) fail(SPARK_ERR_IO, "cannot read '%s'", path.c_str());
    return ss.str();
}

bool file_exists(const std::string & path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_directory(const std::string & path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string path_join(const std::string & a, const std::string & b) {
    if (a.empty() || a.back() == '/') return a + b;
    return a + "/" + b;
}

}  // namespace spark::io
