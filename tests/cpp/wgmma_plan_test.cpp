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
  // Per tile: four 16-byte flag slots, a part of 128 threads x kN / 2 float32
  // sums for each 64 rows.
  EXPECT_EQ(tail_workspace_bytes(64, 128, 128), 64 * (64 + 2 * 128 * 64 * 4));
  EXPECT_EQ(tail_workspace_bytes(72, 64, 128), 72 * (64 + 2 * 128 * 32 * 4));
  EXPECT_EQ(tail_workspace_bytes(10, 128, 192), 10 * (64 + 3 * 128 * 64 * 4));
}

// What the plan decides for a layer and element size.
struct Expected {
  const char* name;
  ConvProblem problem;
  int element_size;
  bool im2col;
  int tail, split, cols;
  bool pingpong;
  int rows;
};

TEST(WgmmaPlanTest, LayersTheGpuTestsRelyOn) {
  const Expected cases[] = {
      // ResNet-50's 128-channel 3x3 layer in float32 (36 steps of 32 channels):
      // rows of positions (196 tiles, a round and a half) rather than boxes
      // (224, two rounds), 64 of them in halves, on the pingpong kernel.
      {"resnet 128ch float32", layer(32, 128, 28, 128, 3, 1), 4, true, 64, 1, 128, true, 128},
      // In 16-bit (18 steps of 64), too short for the tail: 131 rows of 192
      // positions (one round) rather than 224 boxes or 196 rows of 128 (two).
      {"resnet 128ch 16-bit", layer(32, 128, 28, 128, 3, 1), 2, true, 0, 1, 128, false, 192},
      {"resnet 128ch s2 16-bit", layer(32, 128, 56, 128, 3, 2), 2, true, 0, 1, 128, false, 192},
      // 256 -> 128 channels at 28x28, N=48 (36 steps): 196 tiles of 192 rows,
      // the last round's 64 in halves (the 192-row test's tail layer).
      {"256->128ch 28x28 16-bit", layer(48, 256, 28, 128, 3, 1), 2, true, 64, 1, 128, false, 192},
      // 256 channels at 14x14, N=32: 128 boxes of 128 rows, one round, stay.
      {"resnet 256ch 16-bit", layer(32, 256, 14, 256, 3, 1), 2, false, 0, 1, 128, false, 128},
      // The tail test's 256 channels at 14x14, N=48: 192 boxes, 60 in halves.
      {"256ch 14x14 16-bit", layer(48, 256, 14, 256, 3, 1), 2, false, 60, 1, 128, false, 128},
      {"256ch 14x14 float32", layer(48, 256, 14, 256, 3, 1), 4, false, 60, 1, 128, true, 128},
      // 256 -> 64 channels at 28x28, N=48: 64-wide tiles, 336 boxes over 264 blocks.
      {"256->64ch 16-bit", layer(48, 256, 28, 64, 3, 1), 2, false, 72, 1, 64, false, 128},
      {"256->64ch float32", layer(48, 256, 28, 64, 3, 1), 4, false, 72, 1, 64, false, 128},
      // 512 channels at 7x7, N=32, float32: 64 boxes, the reduction split in two, no tail.
      {"512ch 7x7 float32", layer(32, 512, 7, 512, 3, 1), 4, false, 0, 2, 128, false, 128},
  };
  // ResNet-50's RGB stem in 16-bit as the engine packs it (space_to_depth.h):
  // 4x1 taps of 64 channels over an overlapping view of the phases, whose
  // pixels are 16 elements apart; read through its strides (32 bytes).
  ConvProblem stem = layer(32, 64, 112, 64, 1, 1);
  stem.h = 115, stem.r = 4, stem.pad_h = stem.pad_w = 0;
  stem.input_strides[0] = 16, stem.input_strides[1] = 115 * 16, stem.input_strides[2] = 115 * 115 * 16;
  const WgmmaPlan packed = wgmma_fprop_plan(stem, 2);
  EXPECT_TRUE(packed.take && packed.im2col && packed.cols == 64 && packed.rows == 128);
  stem.input_strides[0] = 4;  // 8 bytes: not a stride TMA takes
  EXPECT_FALSE(wgmma_fprop_plan(stem, 2).take);
  for (const Expected& e : cases) {
    const WgmmaPlan plan = wgmma_fprop_plan(e.problem, e.element_size);
    ASSERT_TRUE(plan.take) << e.name;
    EXPECT_EQ(plan.im2col, e.im2col) << e.name;
    EXPECT_EQ(plan.tail, e.tail) << e.name;
    EXPECT_EQ(plan.split, e.split) << e.name;
    EXPECT_EQ(plan.cols, e.cols) << e.name;
    EXPECT_EQ(plan.pingpong, e.pingpong) << e.name;
    EXPECT_EQ(plan.rows, e.rows) << e.name;
  }
}

}  // namespace
