#include "devices/cpu/element_io.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>

#include "gtest/gtest.h"

namespace opserver::cpu {
namespace {

// Every offset within a byte and every count up to 2048-bit SVE's 128
// 16-bit lanes (and past it), from a buffer holding exactly the bytes that
// cover the bits: an over-read is a heap overflow under ASan.
TEST(ExtractMaskBits, RepacksAnyRunOfBitsReadingOnlyItsBytes) {
  std::mt19937 rng(3);
  for (uint64_t pos = 0; pos < 24; ++pos) {
    for (size_t count = 1; count <= 136; ++count) {
      const size_t n = (pos + count + 7) / 8;
      std::unique_ptr<uint8_t[]> bits(new uint8_t[n]);
      for (size_t b = 0; b < n; ++b) bits[b] = static_cast<uint8_t>(rng());
      uint8_t out[18];
      std::memset(out, 0xA5, sizeof(out));
      ExtractMaskBits(bits.get(), pos, count, out);
      const size_t out_bytes = (count + 7) / 8;
      for (size_t i = 0; i < out_bytes * 8; ++i) {
        const bool want = i < count && MaskBit(bits.get(), pos + i);
        ASSERT_EQ(MaskBit(out, i), want)
            << "pos=" << pos << " count=" << count << " bit " << i;
      }
      // Nothing written past the bytes that hold the bits.
      for (size_t b = out_bytes; b < sizeof(out); ++b) {
        ASSERT_EQ(out[b], 0xA5) << "pos=" << pos << " count=" << count;
      }
    }
  }
}

}  // namespace
}  // namespace opserver::cpu
