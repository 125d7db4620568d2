// FastDivide (ops/common/fast_divide.h), the division the Hopper forward's
// index arithmetic makes, against the plain division: every divisor up to
// 4096 and a spread of larger ones, on small numerators, random ones and those
// next to multiples of the divisor and to 2^31.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "ops/common/fast_divide.h"

namespace {

using customconv::FastDivide;

void expect_divides(int d, const std::vector<int>& xs) {
  const FastDivide f = FastDivide::of(d);
  for (const int x : xs) {
    ASSERT_EQ(f.div(x), x / d) << x << " / " << d;
  }
}

std::vector<int> numerators(int d, std::mt19937& rng) {
  std::vector<int> xs;
  for (int x = 0; x < 300; ++x) xs.push_back(x);
  for (int k : {1, 2, 3, 7, 1000, 65536}) {
    const int64_t m = int64_t(k) * d;
    for (int64_t x = m - 2; x <= m + 2; ++x) {
      if (x >= 0 && x <= INT32_MAX) xs.push_back(int(x));
    }
  }
  for (int x = INT32_MAX; x > INT32_MAX - 5; --x) xs.push_back(x);
  const int64_t top = (int64_t(INT32_MAX) / d) * d;  // the largest multiple
  for (int64_t x = top - 1; x <= top + 1 && x <= INT32_MAX; ++x) xs.push_back(int(x));
  std::uniform_int_distribution<int> any(0, INT32_MAX);
  for (int i = 0; i < 200; ++i) xs.push_back(any(rng));
  return xs;
}

TEST(FastDivide, MatchesDivisionForSmallDivisors) {
  std::mt19937 rng(std::random_device{}());
  for (int d = 1; d <= 4096; ++d) expect_divides(d, numerators(d, rng));
}

TEST(FastDivide, MatchesDivisionForLargeDivisors) {
  std::mt19937 rng(std::random_device{}());
  std::vector<int> ds = {65535, 65536, 65537, 100003, 1 << 20, (1 << 20) + 1, 12345678,
                         (1 << 30) - 1, 1 << 30, (1 << 30) + 1, INT32_MAX - 1, INT32_MAX};
  std::uniform_int_distribution<int> any(1, INT32_MAX);
  for (int i = 0; i < 200; ++i) ds.push_back(any(rng));
  for (const int d : ds) expect_divides(d, numerators(d, rng));
}

TEST(FastDivide, AnEmptyExtentDividesByOne) {
  for (const int d : {0, -1, -7}) {
    const FastDivide f = FastDivide::of(d);
    EXPECT_EQ(f.divisor, 1);
    EXPECT_EQ(f.div(12345), 12345);
  }
}

}  // namespace
