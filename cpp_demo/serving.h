// Serving requests as an inference server would: the untimed warm-up request,
// the reference outputs, and N requests on several threads at once.
#pragma once

#include <torch/script.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "compare.h"
#include "model.h"
#include "options.h"

namespace customconv_demo {

// Where the serving threads wait for each other once each has run its own
// untimed warm-up request, so that the clock starts on all of them at once.
// A thread's first request pays for what the runtime sets up per thread
// (on CUDA, the libraries' handles and their plans: seconds for some
// scripted models), which a server pays once, at start, not per request.
class StartLine {
 public:
  explicit StartLine(int64_t threads) : waiting_(threads) {}
  // Arrives, and waits until every thread has arrived or `stop` is set;
  // false where it was stopped.
  bool arrive_and_wait(const std::atomic<bool>& stop);
  // Wakes the waiting threads (after `stop` was set).
  void release();
  std::chrono::steady_clock::time_point start() const { return start_; }

 private:
  std::mutex mutex_;
  std::condition_variable all_there_;
  int64_t waiting_;
  std::chrono::steady_clock::time_point start_{};
};

// What the threads share; the model is only read (TorchScript modules and
// AOTInductor packages may run concurrently).
struct Server {
  Model& model;
  const std::vector<torch::IValue>& inputs;
  const std::vector<torch::Tensor>& expected;
  torch::Device device;
  Tolerance tolerance;
  int64_t iters;
  std::atomic<int64_t> next_request{0};
  std::atomic<bool> stop{false};  // set when a thread fails
};

// What one thread saw.
struct ThreadReport {
  std::vector<double> latencies_ms;
  int64_t checked = 0;
  int64_t mismatches = 0;
  double max_abs_error = 0;
  std::string first_mismatch;
  std::string error;  // the exception that stopped the thread
};

void record_comparison(const Comparison& comparison, const std::string& request,
                       ThreadReport& report);

struct ServingResult {
  std::vector<ThreadReport> reports;  // one per thread
  double wall_seconds = 0;
};

// Serves all requests on `threads` threads at once, each thread first running
// one untimed warm-up request of its own; the wall time runs from when all of
// them are warm.
ServingResult serve_concurrently(Server& server, int64_t threads);

// The untimed warm-up requests, on this thread (TorchScript's profiling
// executor optimizes a graph after its first runs, so the timed requests see
// the optimized graph). The first one's output is returned: it is the
// reference when there is no expected file, and it is checked like the others
// when there is.
constexpr int kWarmUpRequests = 3;
torch::IValue warm_up(Model& model, const std::vector<torch::IValue>& inputs, torch::Device device);

// The outputs every request is compared with: the expected file's, or else the
// warm-up request's (then the check is that all requests agree).
std::vector<torch::Tensor> reference_outputs(const Options& options,
                                             const torch::IValue& warm_up_output);

}  // namespace customconv_demo
