// Serving requests: the warm-up request, the reference outputs, and the
// serving threads.
#include "serving.h"

#include <c10/core/InferenceMode.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <chrono>
#include <exception>
#include <functional>
#include <optional>
#include <thread>
#include <utility>

#include "text.h"

namespace customconv_demo {

namespace {

using Clock = std::chrono::steady_clock;

// Makes the calling thread run on a CUDA stream of its own (from the pool), so
// that concurrent requests do not queue behind each other on one stream. On the
// CPU it does nothing.
class RequestStream {
 public:
  explicit RequestStream(torch::Device device) {
    if (device.is_cuda()) {
      guard_.emplace(c10::impl::getDeviceGuardImpl(device.type())->getStreamFromGlobalPool(device));
    }
  }

  // Waits for the work queued by this thread.
  void synchronize() const {
    if (guard_) {
      guard_->current_stream().synchronize();
    }
  }

 private:
  std::optional<c10::StreamGuard> guard_;
};

// One request: runs the model and waits until its results are there.
torch::IValue run_request(Model& model, const std::vector<torch::IValue>& inputs,
                          const RequestStream& stream) {
  torch::IValue output = model.forward(inputs);
  stream.synchronize();
  return output;
}

}  // namespace

void record_comparison(const Comparison& comparison, const std::string& request,
                       ThreadReport& report) {
  ++report.checked;
  report.max_abs_error = max_error(report.max_abs_error, comparison.max_abs_error);
  if (!comparison.match) {
    if (report.mismatches == 0) {
      report.first_mismatch = request + ": " + comparison.problem;
    }
    ++report.mismatches;
  }
}

namespace {

// A serving thread: takes requests until all N are taken (or a thread failed).
// Never throws: an exception is reported and stops the other threads.
void serve_requests(Server& server, StartLine& start_line, int64_t thread_index,
                    ThreadReport& report) noexcept {
  bool arrived = false;
  try {
    c10::InferenceMode inference_mode;
    const RequestStream stream(server.device);
    record_comparison(
        compare_outputs(run_request(server.model, server.inputs, stream), server.expected,
                        server.tolerance),
        "warm-up request (thread " + std::to_string(thread_index) + ")", report);
    arrived = true;
    if (!start_line.arrive_and_wait(server.stop)) {
      return;
    }
    while (!server.stop.load()) {
      const int64_t request = server.next_request.fetch_add(1);
      if (request >= server.iters) {
        break;
      }
      const auto start = Clock::now();
      const torch::IValue output = run_request(server.model, server.inputs, stream);
      const std::chrono::duration<double, std::milli> latency = Clock::now() - start;
      report.latencies_ms.push_back(latency.count());
      record_comparison(
          compare_outputs(output, server.expected, server.tolerance),
          "request " + std::to_string(request) + " (thread " + std::to_string(thread_index) + ")",
          report);
    }
  } catch (const std::exception& e) {
    report.error = message_of(e);
    server.stop.store(true);
  } catch (...) {
    report.error = "unknown exception";
    server.stop.store(true);
  }
  if (!arrived) {
    start_line.release();  // the others stop waiting for this thread
  }
}

}  // namespace

bool StartLine::arrive_and_wait(const std::atomic<bool>& stop) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (--waiting_ == 0) {
    start_ = Clock::now();
    all_there_.notify_all();
    return true;
  }
  all_there_.wait(lock, [&] { return waiting_ == 0 || stop.load(); });
  return waiting_ == 0;
}

void StartLine::release() {
  const std::lock_guard<std::mutex> lock(mutex_);
  all_there_.notify_all();
}

ServingResult serve_concurrently(Server& server, int64_t threads) {
  std::vector<ThreadReport> reports(static_cast<size_t>(threads));
  std::vector<std::thread> workers;
  workers.reserve(reports.size());
  StartLine start_line(threads);
  try {
    for (int64_t i = 0; i < threads; ++i) {
      workers.emplace_back(serve_requests, std::ref(server), std::ref(start_line), i,
                           std::ref(reports[static_cast<size_t>(i)]));
    }
  } catch (...) {  // a thread could not start: stop and join those that did
    server.stop.store(true);
    start_line.release();
    for (auto& worker : workers) {
      worker.join();
    }
    throw;
  }
  for (auto& worker : workers) {
    worker.join();
  }
  const std::chrono::duration<double> wall = Clock::now() - start_line.start();
  return {std::move(reports), server.stop.load() ? 0.0 : wall.count()};
}

torch::IValue warm_up(Model& model, const std::vector<torch::IValue>& inputs,
                      torch::Device device) {
  c10::InferenceMode inference_mode;
  const RequestStream stream(device);
  torch::IValue first;
  try {
    first = run_request(model, inputs, stream);
  } catch (const std::exception& e) {
    throw DemoError("the first (warm-up) request failed: " + message_of(e));
  }
  // TorchScript's profiling executor records the first runs of a graph and
  // optimizes it on a later one; the timed requests should see that graph.
  for (int i = 1; i < kWarmUpRequests; ++i) {
    try {
      run_request(model, inputs, stream);
    } catch (const std::exception& e) {
      throw DemoError("warm-up request " + std::to_string(i + 1) + " failed: " + message_of(e));
    }
  }
  return first;
}

namespace {

std::vector<torch::Tensor> cpu_copies(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> copies;
  copies.reserve(tensors.size());
  for (const auto& t : tensors) {
    copies.push_back(t.to(torch::kCPU));
  }
  return copies;
}

}  // namespace

std::vector<torch::Tensor> reference_outputs(const Options& options,
                                             const torch::IValue& warm_up_output) {
  if (options.expected) {
    auto expected = tensors_of(load_pickled(*options.expected), *options.expected);
    print_row("expected", *options.expected + ": " + describe_tensors(expected));
    return expected;
  }
  print_row("expected", "no --expected file: every request is compared with the warm-up one");
  return cpu_copies(tensors_of(warm_up_output, "the model's output"));
}

}  // namespace customconv_demo
