// A 64-bit non-cryptographic hash for checksums and identities (saved sequence states, model
// fingerprints): detects corruption and mix-ups, not tampering. Words of 8 bytes are mixed with a
// multiply-rotate step (xxHash's round), several GB/s on one core.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace spark {

class Hash64 {
public:
    Hash64 & bytes(const void * data, size_t n) {
        const auto * p = static_cast<const uint8_t *>(data);
        for (; n >= 8; p += 8, n -= 8) {
            uint64_t w;
            std::memcpy(&w, p, 8);
            round(w);
        }
        if (n) {
            uint64_t w = 0;
            std::memcpy(&w, p, n);
            round(w ^ (uint64_t(n) << 56));
        }
        return *this;
    }
    template <typename T> Hash64 & value(const T & v) { return bytes(&v, sizeof v); }
    Hash64 & text(std::string_view s) { return value(uint64_t(s.size())).bytes(s.data(), s.size()); }

    uint64_t digest() const {
        uint64_t h = state_ ^ (state_ >> 33);
        h *= kPrime2;
        h ^= h >> 29;
        h *= kPrime3;
        return h ^ (h >> 32);
    }

private:
    static constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ull, kPrime2 = 0xC2B2AE3D27D4EB4Full, kPrime3 = 0x165667B19E3779F9ull;
    void round(uint64_t w) {
        state_ ^= ((w * kPrime2) << 31 | (w * kPrime2) >> 33) * kPrime1;
        state_ = (state_ << 27 | state_ >> 37) * kPrime1 + kPrime3;
    }
    uint64_t state_ = 0x27D4EB2F165667C5ull;
};

}  // namespace spark
