// Times every candidate tile configuration of the implicit-GEMM engine's three
// passes (tile_sweep.h) on ResNet-50's layers at N=32, channels_last, float16
// and float32 (TF32), next to cuDNN's kernel for the same pass in the same
// run, and checks each candidate's result against cuDNN's.
//
//   tile_sweep [--out results.csv] [--batch 32] [--calls 20]
//
// It prints, per layer and pass: cuDNN's time, the configuration the engine
// picks today, and the fastest candidate; then geometric means. The CSV holds
// every measurement. Built with -DCUSTOMCONV_BUILD_TILE_SWEEP=ON on a CUDA build.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bench/tune/tile_sweep.h"

namespace cc = customconv;
using cc::implicit_gemm::ConvProblem;
using cc::tile_sweep::Candidate;

namespace {

struct Layer {
  int c, h, k, ks, stride;
};
// ResNet-50's layers after the stem: (C, H, K, kernel, stride).
const Layer kLayers[] = {
    {64, 56, 64, 1, 1},     {64, 56, 64, 3, 1},     {64, 56, 256, 1, 1},   {256, 56, 64, 1, 1},
    {256, 56, 128, 1, 1},   {128, 56, 128, 3, 2},   {128, 28, 512, 1, 1},  {256, 56, 512, 1, 2},
    {512, 28, 128, 1, 1},   {128, 28, 128, 3, 1},   {512, 28, 256, 1, 1},  {256, 28, 256, 3, 2},
    {256, 14, 1024, 1, 1},  {512, 28, 1024, 1, 2},  {1024, 14, 256, 1, 1}, {256, 14, 256, 3, 1},
    {1024, 14, 512, 1, 1},  {512, 14, 512, 3, 2},   {512, 7, 2048, 1, 1},  {1024, 14, 2048, 1, 2},
    {2048, 7, 512, 1, 1},   {512, 7, 512, 3, 1},
};

int g_calls = 20;

// Median over 5 rounds of the time per call of `g_calls` calls queued back to back.
template <typename F>
double time_us(F&& f) {
  for (int i = 0; i < 3; ++i) f();
  cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> rounds;
  for (int r = 0; r < 5; ++r) {
    cudaEventRecord(a, stream);
    for (int i = 0; i < g_calls; ++i) f();
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    rounds.push_back(1000.0 * ms / g_calls);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

double rel_err(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor w = want.to(at::kFloat), g = got.to(at::kFloat);
  return ((g - w).abs().max() / w.abs().max().clamp_min(1e-12)).item<double>();
}

struct Row {
  std::string dtype, layer, pass, cand;
  int split;
  double us, cudnn_us, err;
};

std::string layer_name(const Layer& l) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "C%d %dx%d K%d k%d s%d", l.c, l.h, l.h, l.k, l.ks, l.stride);
  return buf;
}

int sms() {
  int v = 0;
  cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0);
  return v;
}

// The weight gradient's slices as the engine picks them (implicit_gemm.cpp), for a tile.
int wgrad_split(const ConvProblem& pr, int tm, int tn) {
  const int64_t tiles = int64_t((pr.k + tm - 1) / tm) * ((pr.r * pr.s * pr.c + tn - 1) / tn);
  const int64_t wanted = (2 * int64_t(sms()) + tiles - 1) / tiles;
  const int64_t by_length = int64_t(pr.n) * pr.p * pr.q / 1024;
  const int64_t by_memory = (int64_t(48) << 20) / (int64_t(pr.k) * pr.r * pr.s * pr.c * 4);
  return int(std::max<int64_t>(1, std::min({wanted, by_length, by_memory, int64_t(256)})));
}

// The forward's slices as the engine picks them (implicit_gemm.cpp).
int fprop_split(const ConvProblem& pr) {
  if (pr.k <= 64) return 1;
  const int64_t tiles = ((int64_t(pr.n) * pr.p * pr.q + 127) / 128) * ((pr.k + 127) / 128);
  if (2 * tiles > sms()) return 1;
  int split = int(std::min<int64_t>((2 * sms() + tiles - 1) / tiles, pr.c / 128));
  while (split > 1 && pr.c % (split * 64) != 0) --split;
  return std::max(split, 1);
}

void sweep(at::ScalarType dtype, int batch, std::vector<Row>& rows) {
  const bool f16 = dtype == at::kHalf;
  const std::string dname = f16 ? "float16" : "float32";
  auto fprops = f16 ? cc::tile_sweep::fprop_f16() : cc::tile_sweep::fprop_f32();
  const auto dgrads = f16 ? cc::tile_sweep::dgrad_f16() : cc::tile_sweep::dgrad_f32();
  auto wgrads = f16 ? cc::tile_sweep::wgrad_f16() : cc::tile_sweep::wgrad_f32();
  if (f16) {
    for (const Candidate& c : cc::tile_sweep::hopper_fprop_f16()) fprops.push_back(c);
    for (const Candidate& c : cc::tile_sweep::hopper_wgrad_f16()) wgrads.push_back(c);
  }
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
  const auto cl = at::MemoryFormat::ChannelsLast;
  for (const Layer& l : kLayers) {
    const int pad = l.ks / 2, p = (l.h + 2 * pad - l.ks) / l.stride + 1;
    const at::Tensor x = at::randn({batch, l.c, l.h, l.h}, opts).contiguous(cl);
    const at::Tensor w = (at::randn({l.k, l.c, l.ks, l.ks}, opts) / std::sqrt(double(l.c * l.ks * l.ks))).contiguous(cl);
    const at::Tensor go = at::randn({batch, l.k, p, p}, opts).contiguous(cl);
    ConvProblem pr{};
    pr.n = batch, pr.h = l.h, pr.w = l.h, pr.c = l.c, pr.k = l.k, pr.r = l.ks, pr.s = l.ks, pr.p = p, pr.q = p;
    pr.pad_h = pr.pad_w = pad, pr.stride_h = pr.stride_w = l.stride, pr.dilation_h = pr.dilation_w = 1;
    pr.device = 0;
    pr.stream = at::cuda::getCurrentCUDAStream().stream();
    const std::string lname = layer_name(l);
    const std::vector<int64_t> st{l.stride, l.stride}, pd{pad, pad}, dl{1, 1}, op{0, 0};
    auto add = [&](const char* pass, const std::string& cand, int split, double us, double ref, double err) {
      rows.push_back({dname, lname, pass, cand, split, us, ref, err});
      std::printf("%s | %s | %s | %s | split %d | %.1f us | cuDNN %.1f | err %.1e\n", dname.c_str(),
                  lname.c_str(), pass, cand.c_str(), split, us, ref, err);
      std::fflush(stdout);
    };
    // forward
    {
      at::Tensor ref;
      const double ref_us = time_us([&] { ref = at::convolution(x, w, {}, st, pd, dl, false, op, 1); });
      at::Tensor out = at::empty({batch, l.k, p, p}, opts.memory_format(cl));
      pr.input = x.data_ptr(), pr.weight = w.data_ptr(), pr.output = out.data_ptr(), pr.bias = nullptr;
      for (const Candidate& c : fprops) {
        std::vector<int> splits{1};
        if (c.split) {
          for (int sk : {2, 3, 4, 6, 8}) {
            if (l.c % (sk * c.tile_k) == 0) splits.push_back(sk);
          }
        }
        for (int sk : splits) {
          at::Tensor ws;
          pr.split_k = sk;
          pr.workspace = nullptr;
          if (sk > 1) {
            ws = at::empty({int64_t(sk) * out.numel()}, opts.dtype(at::kFloat));
            pr.workspace = ws.data_ptr();
          }
          const cc::tile_sweep::Launch launch = sk > 1 ? c.split : c.plain;
          if (!launch(pr)) continue;
          const double us = time_us([&] { launch(pr); });
          add("fprop", c.name, sk, us, ref_us, rel_err(out, ref));
        }
      }
      pr.split_k = 1, pr.workspace = nullptr;
      add("fprop", "engine-split", fprop_split(pr), 0, ref_us, 0);
    }
    // input gradient
    {
      at::Tensor ref;
      const double ref_us = time_us([&] {
        ref = std::get<0>(at::convolution_backward(go, x, w, std::nullopt, st, pd, dl, false, op, 1,
                                                   {true, false, false}));
      });
      at::Tensor gi = at::empty({batch, l.c, l.h, l.h}, opts.memory_format(cl));
      pr.input = gi.data_ptr(), pr.weight = w.data_ptr(), pr.output = go.data_ptr();
      for (const Candidate& c : dgrads) {
        const cc::tile_sweep::Launch launch = l.stride == 1 ? c.plain : c.split;
        if (!launch(pr)) continue;
        const double us = time_us([&] { launch(pr); });
        add("dgrad", c.name, 1, us, ref_us, rel_err(gi, ref));
      }
    }
    // weight gradient (the slices' planes summed into the result, as the engine does)
    {
      at::Tensor ref;
      const double ref_us = time_us([&] {
        ref = std::get<1>(at::convolution_backward(go, x, w, std::nullopt, st, pd, dl, false, op, 1,
                                                   {false, true, false}));
      });
      pr.input = x.data_ptr(), pr.output = go.data_ptr();
      for (const Candidate& c : wgrads) {
        const int s0 = wgrad_split(pr, c.tile_m, c.tile_n);
        std::vector<int> splits{s0};
        for (int sk : {s0 / 2, s0 * 2, s0 * 4}) {
          if (sk >= 1 && sk <= 256 && int64_t(sk) * 256 <= int64_t(batch) * p * p) splits.push_back(sk);
        }
        if (std::strncmp(c.name, "sm90", 4) == 0) {  // slices of whole images
          splits.clear();
          for (int sk = 1; sk <= batch; sk *= 2) {
            if (batch % sk == 0) splits.push_back(sk);
          }
        }
        for (int sk : splits) {
          at::Tensor planes = at::empty({sk, l.k, l.ks, l.ks, l.c}, opts.dtype(at::kFloat));
          pr.split_k = sk;
          pr.weight = planes.data_ptr();
          at::Tensor gw;
          bool ok = true;
          const double us = time_us([&] {
            ok = ok && c.plain(pr);
            gw = at::sum(planes, {0}, false, dtype);
          });
          if (!ok) continue;
          add("wgrad", c.name, sk, us, ref_us, rel_err(gw.permute({0, 3, 1, 2}), ref));
        }
      }
      pr.split_k = 1;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string out = "tile_sweep.csv";
  int batch = 32;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--out")) out = argv[i + 1];
    if (!std::strcmp(argv[i], "--batch")) batch = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--calls")) g_calls = std::atoi(argv[i + 1]);
  }
  at::globalContext().setAllowTF32CuDNN(true);
  std::vector<Row> rows;
  for (auto dtype : {at::kHalf, at::kFloat}) sweep(dtype, batch, rows);
  FILE* f = std::fopen(out.c_str(), "w");
  std::fprintf(f, "dtype,layer,pass,candidate,split,us,cudnn_us,rel_err\n");
  for (const Row& r : rows) {
    std::fprintf(f, "%s,%s,%s,%s,%d,%.2f,%.2f,%.2e\n", r.dtype.c_str(), r.layer.c_str(), r.pass.c_str(),
                 r.cand.c_str(), r.split, r.us, r.cudnn_us, r.err);
  }
  std::fclose(f);
  std::printf("wrote %s (%zu rows)\n", out.c_str(), rows.size());
  return 0;
}
