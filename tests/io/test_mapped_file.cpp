// MappedFile's positioned reads (the CUDA weight loader reads the files behind the mappings with them).
#include "io_test_util.h"

#include "io/mapped_file.h"

#include <unistd.h>

using namespace spark;
using namespace spark::io;
using spark::test::TempDir;

TEST_CASE("mapped file: read_at returns the mapped bytes, whole, for any range") {
    TempDir              dir;
    std::vector<uint8_t> bytes(3 * 4096 + 17);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 131 + 7);
    test::write_file(dir / "f.bin", bytes);
    auto f = MappedFile::open(dir / "f.bin");
    REQUIRE(f->size() == bytes.size());
    CHECK(f->contains(f->data()));
    CHECK(f->contains(f->data() + bytes.size() - 1));
    CHECK_FALSE(f->contains(f->data() + bytes.size()));
    for (const auto & range : {std::pair<size_t, size_t>{0, bytes.size()}, {1, 4095}, {4095, 2}, {8000, bytes.size() - 8000}, {100, 0}}) {
        const size_t off = range.first, n = range.second;
        std::vector<uint8_t> out(n + 1, 0xEE);
        f->read_at(out.data(), off, n);
        CHECK(std::equal(out.begin(), out.begin() + long(n), bytes.begin() + long(off)));
        CHECK(out[n] == 0xEE);  // nothing written past the range
        f->prefetch(off, n);    // only a hint: must not fail
    }
    std::vector<uint8_t> out(16);
    CHECK_FAILS_WITH([&] { f->read_at(out.data(), bytes.size() - 8, 16); }, SPARK_ERR_INTERNAL, "outside");
}

TEST_CASE("mapped file: a file that shrinks after it was mapped is an I/O error, not a crash") {
    TempDir dir;
    test::write_file(dir / "f.bin", std::vector<uint8_t>(10000, 1));
    auto f = MappedFile::open(dir / "f.bin");
    REQUIRE(truncate((dir / "f.bin").c_str(), 100) == 0);
    std::vector<uint8_t> out(5000);
    f->read_at(out.data(), 0, 100);  // still there
    CHECK_FAILS_WITH([&] { f->read_at(out.data(), 50, 5000); }, SPARK_ERR_IO, "has become shorter");
}
