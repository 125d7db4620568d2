// customconv_demo: runs a TorchScript model or an AOTInductor package that uses
// the customconv ops from plain C++ (libtorch, no Python), the way an inference
// server would: the model is loaded once, then requests run on several threads at once. Every
// output is compared with the expected one; latency percentiles and throughput are printed.
//
// Run with --help for the options. Exit status: 0 all outputs match, 1 an output
// differs from the expected one, 2 bad arguments, 3 any other error.
//
// The parts: options (the command line), model (loading the model and its
// inputs), compare (checking outputs), serving (the warm-up request and the
// serving threads), report (latency, throughput, result), text (small helpers).
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <iostream>
#include <vector>

#include "compare.h"
#include "customconv/customconv.h"  // links the library, which registers the ops
#include "model.h"
#include "options.h"
#include "report.h"
#include "serving.h"
#include "text.h"

namespace customconv_demo {

namespace {

// ---------------------------------------------------------------- the demo

int run_demo(const Options& options) {
  require_files(options);
  require_device(options.device);
  const Tolerance tolerance{*options.rtol, *options.atol};

  print_row("customconv", customconv::version() + " (libtorch " TORCH_VERSION ")");
  print_row("model",
            options.model + " (" +
                (options.default_model ? "the default model" : Model::kind(options.model)) + ")");
  Model model(options.model, options.device, std::min(options.threads, options.iters));
  const std::vector<torch::IValue> inputs = load_inputs(options.inputs, options.device);
  print_row("inputs", options.inputs + ": " + describe_tensors(tensor_inputs(inputs)));
  if (options.device.is_cuda()) {
    torch::cuda::synchronize(options.device.index());  // the model and inputs are on the device
  }
  print_row("device",
            options.device.str() + " (" + count_of(at::get_num_threads(), "intra-op thread") + ")");

  const torch::IValue warm_up_output = warm_up(model, inputs, options.device);
  const std::vector<torch::Tensor> expected = reference_outputs(options, warm_up_output);
  ThreadReport warm_up_report;
  if (options.expected) {
    record_comparison(compare_outputs(warm_up_output, expected, tolerance), "warm-up request",
                      warm_up_report);
  }

  const int64_t threads = std::min(options.threads, options.iters);
  Server server{model, inputs, expected, options.device, tolerance, options.iters};
  const Summary summary = summarize(warm_up_report, serve_concurrently(server, threads));
  print_summary(summary, options, threads, expected.size());
  return print_result(summary);
}

}  // namespace

}  // namespace customconv_demo

int main(int argc, char** argv) {
  using namespace customconv_demo;
  Options options;
  try {
    options = parse_args(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "customconv_demo: " << e.what() << "\n\n"
              << kSynopsis << "Run customconv_demo --help for details.\n";
    return kExitUsage;
  }
  if (options.help) {
    std::cout << kSynopsis << kDetails;
    return kExitOk;
  }
  try {
    return run_demo(options);
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "customconv_demo: error: " << message_of(e) << '\n';
  } catch (...) {
    std::cout.flush();
    std::cerr << "customconv_demo: error: unknown exception\n";
  }
  return kExitError;
}
