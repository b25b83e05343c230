// The huge-page allocator: large blocks aligned to a huge page and, on Linux with transparent
// huge pages, marked for them (the mapping's "hg" flag in /proc/self/smaps); small blocks as usual.
#include "common/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace tandem {
namespace {

// The VmFlags line of the mapping that holds `p` ("" when none is found).
std::string VmFlagsOf(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= at && at < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

TEST(HugePagesTest, LargeBlocksAreAlignedAndMarked) {
  std::vector<float, HugePageAllocator<float>> big(3 * kHugePageBytes / sizeof(float) + 5, 1.5f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % kHugePageBytes, 0u);
  big.back() = 2.5f;
  EXPECT_EQ(big.front(), 1.5f);
  EXPECT_EQ(big.back(), 2.5f);
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good()) {
    GTEST_SKIP() << "no transparent huge pages on this system";
  }
  const std::string flags = VmFlagsOf(big.data());
  ASSERT_FALSE(flags.empty()) << "no mapping holds the block";
  EXPECT_NE((flags + " ").find(" hg "), std::string::npos) << flags;
}

TEST(HugePagesTest, SmallBlocksAndCopies) {
  std::vector<uint16_t, HugePageAllocator<uint16_t>> small(100, 7);
  small.push_back(9);
  EXPECT_EQ(small.size(), 101u);
  EXPECT_EQ(small[0], 7);
  EXPECT_EQ(small[100], 9);
  std::vector<uint16_t, HugePageAllocator<uint16_t>> copy = small;
  EXPECT_EQ(copy, small);
  std::vector<uint16_t, HugePageAllocator<uint16_t>> moved = std::move(copy);
  EXPECT_EQ(moved, small);
}

}  // namespace
}  // namespace tandem
