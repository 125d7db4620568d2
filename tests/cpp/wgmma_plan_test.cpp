// The Hopper forward's plan (ops/conv2d/implicit_gemm.h, wgmma_plan.h): host
// arithmetic only, so it is checked here on any machine. The layers are
// ResNet-50's and the tail test's (tests/python/test_conv2d_hopper_forward.py)
// on a device of 132 multiprocessors (an H100 or H200), where the GPU tests
// rely on these decisions.
#include <gtest/gtest.h>

#include "ops/conv2d/implicit_gemm.h"

namespace {

using customconv::implicit_gemm::ConvProblem;
using customconv::implicit_gemm::half_rounds;
using customconv::implicit_gemm::kMinTailSteps;
using customconv::implicit_gemm::tail_tiles;
using customconv::implicit_gemm::tail_workspace_bytes;
using customconv::implicit_gemm::WgmmaPlan;
using customconv::implicit_gemm::wgmma_fprop_plan;

constexpr int kSms = 132;

// A square layer: N images of c channels, size x size, k output channels, a
// kernel x kernel window, padding kernel / 2.
ConvProblem layer(int n, int c, int size, int k, int kernel, int stride) {
  ConvProblem pr{};
  pr.n = n, pr.h = size, pr.w = size, pr.c = c, pr.k = k, pr.r = kernel, pr.s = kernel;
  pr.pad_h = pr.pad_w = kernel / 2, pr.stride_h = pr.stride_w = stride;
  pr.dilation_h = pr.dilation_w = 1;
  pr.p = (size + 2 * pr.pad_h - kernel) / stride + 1, pr.q = pr.p;
  pr.multiprocessors = kSms;
  return pr;
}

TEST(WgmmaPlanTest, TailTakesALastRoundOfAtMostHalfTheBlocksWithLongReductions) {
  EXPECT_EQ(tail_tiles(196, kSms, 36), 64);  // 64 of 132 blocks in the last round
  EXPECT_EQ(tail_tiles(192, kSms, 72), 60);
  EXPECT_EQ(tail_tiles(336, 2 * kSms, 36), 72);  // 64-wide tiles, two blocks a multiprocessor
  EXPECT_EQ(tail_tiles(196, kSms, 18), 0);       // halves too short to pay for meeting
  EXPECT_EQ(tail_tiles(196, kSms, kMinTailSteps - 1), 0);
  EXPECT_EQ(tail_tiles(224, kSms, 36), 0);  // the last round fills 92 of 132
  EXPECT_EQ(tail_tiles(128, kSms, 72), 0);  // one round
  EXPECT_EQ(tail_tiles(264, kSms, 72), 0);  // whole rounds
}

TEST(WgmmaPlanTest, HalfRoundsCountALastRoundInHalvesAsHalf) {
  EXPECT_EQ(half_rounds(196, kSms, 36), 3);
  EXPECT_EQ(half_rounds(196, kSms, 18), 4);
  EXPECT_EQ(half_rounds(224, kSms, 36), 4);
  EXPECT_EQ(half_rounds(132, kSms, 36), 2);
  EXPECT_EQ(half_rounds(98, kSms, 36), 2);
}

TEST(WgmmaPlanTest, WorkspaceHoldsFlagsAndEveryPartOfEveryTailTile) {
  // Per tile: two 16-byte flag slots, two parts of 128 threads x 64 float32 sums.
  EXPECT_EQ(tail_workspace_bytes(64, 128), 64 * (32 + 2 * 128 * 64 * 4));
  EXPECT_EQ(tail_workspace_bytes(72, 64), 72 * (32 + 2 * 128 * 32 * 4));
}

TEST(WgmmaPlanTest, ResNetsFloat32HundredTwentyEightChannelLayerTakesRowsAndTheTail) {
  // 36 steps of 32 channels: rows of positions (196 tiles, a round and a half)
  // rather than boxes (224, two rounds); the pingpong kernel.
  const WgmmaPlan plan = wgmma_fprop_plan(layer(32, 128, 28, 128, 3, 1), 4);
  ASSERT_TRUE(plan.take);
  EXPECT_TRUE(plan.im2col);
  EXPECT_EQ(plan.tail, 64);
  EXPECT_TRUE(plan.pingpong);
  EXPECT_EQ(plan.split, 1);
}

TEST(WgmmaPlanTest, ResNets16BitHundredTwentyEightChannelLayerKeepsBoxesWhole) {
  // 18 steps of 64 channels: too short for the tail, so the boxes stay.
  const WgmmaPlan plan = wgmma_fprop_plan(layer(32, 128, 28, 128, 3, 1), 2);
  ASSERT_TRUE(plan.take);
  EXPECT_FALSE(plan.im2col);
  EXPECT_EQ(plan.tail, 0);
  EXPECT_FALSE(plan.pingpong);
}

TEST(WgmmaPlanTest, TailTestLayersTakeTheTail) {
  // 256 channels at 14x14, N=48: 192 boxes of 98 positions, 60 in halves.
  for (int element_size : {2, 4}) {
    const WgmmaPlan plan = wgmma_fprop_plan(layer(48, 256, 14, 256, 3, 1), element_size);
    ASSERT_TRUE(plan.take) << element_size;
    EXPECT_FALSE(plan.im2col) << element_size;
    EXPECT_EQ(plan.tail, 60) << element_size;
  }
  // 256 -> 64 channels at 28x28, N=48: 64-wide tiles, 336 boxes over 264 blocks.
  for (int element_size : {2, 4}) {
    const WgmmaPlan plan = wgmma_fprop_plan(layer(48, 256, 28, 64, 3, 1), element_size);
    ASSERT_TRUE(plan.take) << element_size;
    EXPECT_EQ(plan.cols, 64) << element_size;
    EXPECT_EQ(plan.tail, 72) << element_size;
  }
}

TEST(WgmmaPlanTest, SplitReductionsTakeNoTail) {
  // 512 channels at 7x7, N=32 in float32: 64 boxes, the reduction split in two.
  const WgmmaPlan plan = wgmma_fprop_plan(layer(32, 512, 7, 512, 3, 1), 4);
  ASSERT_TRUE(plan.take);
  EXPECT_EQ(plan.split, 2);
  EXPECT_EQ(plan.tail, 0);
}

}  // namespace
