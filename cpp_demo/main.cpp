// customconv_demo: runs a TorchScript model or an AOTInductor package that uses
// the customconv ops from plain C++ (libtorch, no Python), the way an inference
// server would: the model is loaded once, then requests run on several threads at once. Every
// output is compared with the expected one; latency percentiles and throughput are printed.
//
// Run with --help for the options. Exit status: 0 all outputs match, 1 an output
// differs from the expected one, 2 bad arguments, 3 any other error.
#include <ATen/Parallel.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/cuda.h>
#include <torch/script.h>
#include <torch/serialize.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "customconv/customconv.h"  // links the library, which registers the ops

#ifndef CUSTOMCONV_DEMO_DIR
#error "CUSTOMCONV_DEMO_DIR (the folder of the default model) must be defined by the build"
#endif

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kExitOk = 0;
constexpr int kExitMismatch = 1;
constexpr int kExitUsage = 2;
constexpr int kExitError = 3;

constexpr int64_t kMaxIters = 100'000'000;
constexpr int64_t kMaxThreads = 1024;

const char* const kSynopsis =
    "usage: customconv_demo [--model M.pt|M.pt2 --inputs IN.pt] [--expected OUT.pt]\n"
    "                       [--device cpu|cuda[:N]] [--iters N] [--threads T]\n"
    "                       [--rtol R] [--atol A]\n"
    "       customconv_demo --help\n";

const char* const kDetails =
    "\n"
    "Runs a model that uses customconv ops, as an inference server would:\n"
    "N requests in total, served by T threads at once. Every output is compared with\n"
    "the expected outputs (allclose: |out - expected| <= atol + rtol * |expected|).\n"
    "\n"
    "  --model M.pt       TorchScript model (torch.jit.save / ScriptModule.save)\n"
    "  --model M.pt2      or AOTInductor package (torch._inductor.aoti_compile_and_package),\n"
    "                     compiled for the --device's type\n"
    "  --inputs IN.pt     its inputs: torch.save([t0, t1, ...]) (or one tensor)\n"
    "  --expected OUT.pt  its outputs: torch.save(tensor) or torch.save((t0, t1, ...));\n"
    "                     without it, every run is compared with the warm-up run\n"
    "  --device D         cpu (default), cuda or cuda:N\n"
    "  --iters N          requests in total, after one warm-up request (default 20)\n"
    "  --threads T        threads serving requests concurrently (default 1)\n"
    "  --rtol R, --atol A tolerances (default 1e-4 on cpu, 1e-3 on cuda)\n"
    "\n"
    "Without --model and --inputs, runs the default model in\n"
    "  " CUSTOMCONV_DEMO_DIR
    "\n"
    "(model.pt, inputs.pt, expected.pt), made by `make demo`.\n"
    "\n"
    "Exit status: 0 all outputs match, 1 an output differs from the expected one,\n"
    "2 bad arguments, 3 any other error.\n";

// Bad command line: reported with the usage text, exit status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Anything else that stops the demo (missing file, no CUDA, bad file contents).
struct DemoError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Tolerance {
  double rtol = 0;
  double atol = 0;
};

struct Options {
  bool help = false;
  bool default_model = false;  // the files come from CUSTOMCONV_DEMO_DIR
  std::string model;
  std::string inputs;
  std::optional<std::string> expected;
  torch::Device device{torch::kCPU};
  int64_t iters = 20;
  int64_t threads = 1;
  std::optional<double> rtol;
  std::optional<double> atol;
};

// ---------------------------------------------------------------- small helpers

// The message of an exception, without the C++ backtrace c10::Error carries.
std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

std::string describe_tensor(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.sizes() << ' ' << t.scalar_type();
  return out.str();
}

std::string describe_tensors(const std::vector<torch::Tensor>& tensors) {
  std::ostringstream out;
  out << tensors.size() << (tensors.size() == 1 ? " tensor" : " tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    out << (i == 0 ? ": " : ", ") << describe_tensor(tensors[i]);
  }
  return out.str();
}

// The larger of two errors; NaN (an output that is NaN where the expected one is
// not) wins, so that it shows in the report.
double max_error(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  return std::max(a, b);
}

std::string format_number(double value, int precision = 3) {
  if (std::isnan(value)) {
    return "nan";  // not "-nan"
  }
  std::ostringstream out;
  out << std::setprecision(precision) << value;
  return out.str();
}

std::string format_ms(double ms) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(3) << ms << " ms";
  return out.str();
}

// ---------------------------------------------------------------- arguments

int64_t parse_count(const std::string& option, const std::string& value, int64_t max) {
  int64_t result = 0;
  const char* first = value.data();
  const char* last = value.data() + value.size();
  const auto [end, error] = std::from_chars(first, last, result);
  if (value.empty() || error != std::errc() || end != last || result < 1 || result > max) {
    throw UsageError(option + " must be an integer from 1 to " + std::to_string(max) + ", got '" +
                     value + "'");
  }
  return result;
}

double parse_tolerance(const std::string& option, const std::string& value) {
  char* end = nullptr;
  errno = 0;
  const double result = std::strtod(value.c_str(), &end);
  if (value.empty() || end != value.c_str() + value.size() || errno != 0 ||
      !std::isfinite(result) || result < 0) {
    throw UsageError(option + " must be a finite number >= 0, got '" + value + "'");
  }
  return result;
}

torch::Device parse_device(const std::string& value) {
  std::optional<torch::Device> device;
  try {
    device.emplace(value);
  } catch (const c10::Error&) {
    // reported below
  }
  if (!device || !(device->is_cpu() || device->is_cuda()) ||
      (device->is_cpu() && device->has_index())) {
    throw UsageError("--device must be cpu, cuda or cuda:N, got '" + value + "'");
  }
  if (device->is_cuda() && !device->has_index()) {
    return torch::Device(torch::kCUDA, 0);
  }
  return *device;
}

bool is_option(const std::string& name) {
  static const char* const kOptions[] = {"--model", "--inputs",  "--expected", "--device",
                                         "--iters", "--threads", "--rtol",     "--atol"};
  return std::find(std::begin(kOptions), std::end(kOptions), name) != std::end(kOptions);
}

void set_option(Options& options, const std::string& name, const std::string& value) {
  if (name == "--model") {
    options.model = value;
  } else if (name == "--inputs") {
    options.inputs = value;
  } else if (name == "--expected") {
    options.expected = value;
  } else if (name == "--device") {
    options.device = parse_device(value);
  } else if (name == "--iters") {
    options.iters = parse_count(name, value, kMaxIters);
  } else if (name == "--threads") {
    options.threads = parse_count(name, value, kMaxThreads);
  } else if (name == "--rtol") {
    options.rtol = parse_tolerance(name, value);
  } else if (name == "--atol") {
    options.atol = parse_tolerance(name, value);
  } else {
    throw UsageError("unknown option '" + name + "'");
  }
}

// Without --model and --inputs: the default model's files (and its expected
// outputs unless --expected says otherwise).
void use_default_model_unless_given(Options& options) {
  if (options.model.empty() && options.inputs.empty()) {
    const fs::path dir = CUSTOMCONV_DEMO_DIR;
    options.default_model = true;
    options.model = (dir / "model.pt").string();
    options.inputs = (dir / "inputs.pt").string();
    if (!options.expected) {
      options.expected = (dir / "expected.pt").string();
    }
  } else if (options.model.empty() || options.inputs.empty()) {
    throw UsageError(
        "--model and --inputs go together (give both, or neither for the default model)");
  }
}

// Accepts "--name value" and "--name=value".
Options parse_args(int argc, char** argv) {
  Options options;
  const std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i];
    if (name == "--help" || name == "-h") {
      options.help = true;
      return options;
    }
    if (name.rfind("--", 0) != 0) {
      throw UsageError("unexpected argument '" + name + "'");
    }
    std::optional<std::string> value;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    } else if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      value = args[++i];
    }
    if (!is_option(name)) {
      throw UsageError("unknown option '" + name + "'");
    }
    if (!value || value->empty()) {
      throw UsageError(name + " needs a value");
    }
    set_option(options, name, *value);
  }
  use_default_model_unless_given(options);
  const double default_tolerance = options.device.is_cuda() ? 1e-3 : 1e-4;
  options.rtol = options.rtol.value_or(default_tolerance);
  options.atol = options.atol.value_or(default_tolerance);
  return options;
}

// ---------------------------------------------------------------- files

// The command that writes the default model (the library sits beside the demo
// folder, in the build folder).
std::string default_model_command() {
  const fs::path dir = CUSTOMCONV_DEMO_DIR;
  return "CUSTOMCONV_LIBRARY=" + (dir.parent_path() / "libcustomconv.so").string() +
         " python3 cpp_demo/make_model.py --out " + dir.string();
}

void require_files(const Options& options) {
  std::vector<std::pair<std::string, std::string>> files = {{"--model", options.model},
                                                            {"--inputs", options.inputs}};
  if (options.expected) {
    files.emplace_back("--expected", *options.expected);
  }
  const fs::path default_dir = CUSTOMCONV_DEMO_DIR;
  for (const auto& [option, path] : files) {
    std::error_code error;
    if (fs::is_regular_file(path, error)) {
      continue;
    }
    if (options.default_model && fs::path(path).parent_path() == default_dir) {
      throw DemoError("the default model is not there (no " + path +
                      "); make it with `make demo`, or in the source tree with\n  " +
                      default_model_command() + "\nor give --model and --inputs");
    }
    throw DemoError(std::string(option) + ": no such file: " + path);
  }
}

std::vector<char> read_file_bytes(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw DemoError("cannot open " + path);
  }
  std::vector<char> bytes{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  if (file.bad()) {
    throw DemoError("cannot read " + path);
  }
  return bytes;
}

// A tensor, or a tuple/list of them (nested or not), as a flat list of tensors.
void append_tensors(const torch::IValue& value, const std::string& what,
                    std::vector<torch::Tensor>& tensors) {
  if (value.isTensor()) {
    tensors.push_back(value.toTensor());
  } else if (value.isTuple()) {
    for (const auto& element : value.toTupleRef().elements()) {
      append_tensors(element, what, tensors);
    }
  } else if (value.isList()) {
    for (const auto& element : value.toListRef()) {
      append_tensors(element, what, tensors);
    }
  } else {
    throw DemoError(what + " holds a " + value.tagKind() +
                    "; expected a tensor or a tuple or list of tensors");
  }
}

std::vector<torch::Tensor> tensors_of(const torch::IValue& value, const std::string& what) {
  std::vector<torch::Tensor> tensors;
  append_tensors(value, what, tensors);
  return tensors;
}

torch::IValue load_pickled(const std::string& path) {
  try {
    return torch::pickle_load(read_file_bytes(path));
  } catch (const c10::Error& e) {
    throw DemoError("cannot read " + path +
                    " (expected a file written by torch.save): " + e.what_without_backtrace());
  }
}

// The model's arguments: the file holds a list (or tuple) of them, or one tensor.
// Tensors are moved to the device; other values are passed as they are.
std::vector<torch::IValue> load_inputs(const std::string& path, torch::Device device) {
  const torch::IValue value = load_pickled(path);
  std::vector<torch::IValue> inputs;
  if (value.isList()) {
    const auto list = value.toListRef();
    inputs.assign(list.begin(), list.end());
  } else if (value.isTuple()) {
    const auto& elements = value.toTupleRef().elements();
    inputs.assign(elements.begin(), elements.end());
  } else {
    inputs.push_back(value);
  }
  for (auto& input : inputs) {
    if (input.isTensor()) {
      input = input.toTensor().to(device);
    }
  }
  return inputs;
}

std::vector<torch::Tensor> tensor_inputs(const std::vector<torch::IValue>& inputs) {
  std::vector<torch::Tensor> tensors;
  for (const auto& input : inputs) {
    if (input.isTensor()) {
      tensors.push_back(input.toTensor());
    }
  }
  return tensors;
}

bool is_package(const std::string& path) { return fs::path(path).extension() == ".pt2"; }

// A loaded model: TorchScript (.pt) or an AOTInductor package (.pt2, by the
// file's extension). forward() may be called from several threads at once.
class Model {
 public:
  Model(const std::string& path, torch::Device device, int64_t threads) {
    try {
      if (is_package(path)) {
        load_package(path, device, threads);
      } else {
        script_.emplace(torch::jit::load(path, device));
        script_->eval();
      }
    } catch (const c10::Error& e) {
      throw DemoError(std::string("cannot load the ") + kind(path) + " " + path + ": " +
                      e.what_without_backtrace());
    }
  }

  static const char* kind(const std::string& path) {
    return is_package(path) ? "AOTInductor package" : "TorchScript model";
  }

  // A package takes tensors only and returns a list of them.
  torch::IValue forward(const std::vector<torch::IValue>& inputs) {
    if (script_) {
      return script_->forward(inputs);
    }
    std::vector<torch::Tensor> tensors;
    tensors.reserve(inputs.size());
    for (const auto& input : inputs) {
      if (!input.isTensor()) {
        throw DemoError("an AOTInductor package takes tensors only; an input is a " +
                        input.tagKind());
      }
      tensors.push_back(input.toTensor());
    }
    return package_->run(tensors);
  }

 private:
  // One runner per serving thread, so that requests do not wait for each other.
  void load_package(const std::string& path, torch::Device device, int64_t threads) {
    package_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
        path, "model", /*run_single_threaded=*/false, static_cast<size_t>(threads),
        device.is_cuda() ? device.index() : -1);
    const auto metadata = package_->get_metadata();
    const auto compiled_for = metadata.find("AOTI_DEVICE_KEY");
    if (compiled_for != metadata.end() &&
        compiled_for->second != c10::DeviceTypeName(device.type(), true)) {
      throw DemoError(path + " was compiled for " + compiled_for->second + ", not for --device " +
                      device.str());
    }
  }

  std::optional<torch::jit::Module> script_;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> package_;
};

void require_device(torch::Device device) {
  if (!device.is_cuda()) {
    return;
  }
  if (!torch::cuda::is_available()) {
    throw DemoError(
        "--device cuda: CUDA is not available here (no GPU or driver found, or libtorch was "
        "built without CUDA)");
  }
  const auto count = static_cast<int64_t>(torch::cuda::device_count());
  if (device.index() >= count) {
    throw DemoError("--device " + device.str() + ": this machine has " + std::to_string(count) +
                    (count == 1 ? " CUDA device" : " CUDA devices"));
  }
}

// ---------------------------------------------------------------- comparing

struct Comparison {
  bool match = true;
  double max_abs_error = 0;
  std::string problem;  // why it does not match
};

// allclose, as torch.allclose(output, expected, rtol, atol) (equal infinities
// match, NaN never does), plus the largest absolute difference.
Comparison compare_tensor(const torch::Tensor& output, const torch::Tensor& expected,
                          Tolerance tolerance) {
  if (output.sizes() != expected.sizes() || output.scalar_type() != expected.scalar_type()) {
    return {false, 0, "is " + describe_tensor(output) + ", expected " + describe_tensor(expected)};
  }
  if (output.numel() == 0) {
    return {};
  }
  const auto out = output.to(torch::kCPU, torch::kDouble);
  const auto exp = expected.to(torch::kCPU, torch::kDouble);
  auto difference = (out - exp).abs();
  difference.masked_fill_(out == exp, 0);
  const bool close = difference.le(exp.abs() * tolerance.rtol + tolerance.atol).all().item<bool>();
  const double max_abs_error = difference.max().item<double>();
  if (close) {
    return {true, max_abs_error, ""};
  }
  return {false, max_abs_error, "differs: max abs error " + format_number(max_abs_error)};
}

Comparison compare_outputs(const torch::IValue& output, const std::vector<torch::Tensor>& expected,
                           Tolerance tolerance) {
  const auto outputs = tensors_of(output, "the model's output");
  if (outputs.size() != expected.size()) {
    return {false, 0,
            "the model returned " + describe_tensors(outputs) + ", expected " +
                describe_tensors(expected)};
  }
  Comparison all;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Comparison one = compare_tensor(outputs[i], expected[i], tolerance);
    all.max_abs_error = max_error(all.max_abs_error, one.max_abs_error);
    if (!one.match && all.match) {
      all.match = false;
      all.problem = "output " + std::to_string(i) + " of " + std::to_string(outputs.size()) + " " +
                    one.problem;
    }
  }
  return all;
}

// ---------------------------------------------------------------- serving

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

// A serving thread: takes requests until all N are taken (or a thread failed).
// Never throws: an exception is reported and stops the other threads.
void serve_requests(Server& server, int64_t thread_index, ThreadReport& report) noexcept {
  try {
    c10::InferenceMode inference_mode;
    const RequestStream stream(server.device);
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
}

struct ServingResult {
  std::vector<ThreadReport> reports;  // one per thread
  double wall_seconds = 0;
};

// Serves all requests on `threads` threads at once.
ServingResult serve_concurrently(Server& server, int64_t threads) {
  std::vector<ThreadReport> reports(static_cast<size_t>(threads));
  std::vector<std::thread> workers;
  workers.reserve(reports.size());
  const auto start = Clock::now();
  try {
    for (int64_t i = 0; i < threads; ++i) {
      workers.emplace_back(serve_requests, std::ref(server), i,
                           std::ref(reports[static_cast<size_t>(i)]));
    }
  } catch (...) {  // a thread could not start: stop and join those that did
    server.stop.store(true);
    for (auto& worker : workers) {
      worker.join();
    }
    throw;
  }
  for (auto& worker : workers) {
    worker.join();
  }
  const std::chrono::duration<double> wall = Clock::now() - start;
  return {std::move(reports), wall.count()};
}

// The untimed first request, on this thread: its output is the reference when
// there is no expected file, and it is checked like the others when there is.
torch::IValue warm_up(Model& model, const std::vector<torch::IValue>& inputs,
                      torch::Device device) {
  c10::InferenceMode inference_mode;
  const RequestStream stream(device);
  try {
    return run_request(model, inputs, stream);
  } catch (const std::exception& e) {
    throw DemoError("the first (warm-up) request failed: " + message_of(e));
  }
}

std::vector<torch::Tensor> cpu_copies(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> copies;
  copies.reserve(tensors.size());
  for (const auto& t : tensors) {
    copies.push_back(t.to(torch::kCPU));
  }
  return copies;
}

// ---------------------------------------------------------------- report

// Nearest-rank percentile of sorted values.
double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) {
    return 0;
  }
  const auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

struct Summary {
  std::vector<double> latencies_ms;  // sorted
  int64_t checked = 0;
  int64_t mismatches = 0;
  double max_abs_error = 0;
  std::string first_mismatch;
  std::vector<std::string> errors;
  double wall_seconds = 0;
};

void add_report(const ThreadReport& report, Summary& summary) {
  summary.latencies_ms.insert(summary.latencies_ms.end(), report.latencies_ms.begin(),
                              report.latencies_ms.end());
  summary.checked += report.checked;
  summary.max_abs_error = max_error(summary.max_abs_error, report.max_abs_error);
  if (report.mismatches > 0 && summary.mismatches == 0) {
    summary.first_mismatch = report.first_mismatch;
  }
  summary.mismatches += report.mismatches;
}

Summary summarize(const ThreadReport& warm_up_report, const ServingResult& serving) {
  Summary summary;
  add_report(warm_up_report, summary);
  for (size_t i = 0; i < serving.reports.size(); ++i) {
    const ThreadReport& report = serving.reports[i];
    add_report(report, summary);
    if (!report.error.empty()) {
      summary.errors.push_back("thread " + std::to_string(i) + ": " + report.error);
    }
  }
  std::sort(summary.latencies_ms.begin(), summary.latencies_ms.end());
  summary.wall_seconds = serving.wall_seconds;
  return summary;
}

void print_row(const std::string& label, const std::string& text) {
  std::cout << std::left << std::setw(12) << (label + ":") << text << '\n';
}

// "1 thread", "4 threads".
std::string count_of(int64_t n, const std::string& noun) {
  return std::to_string(n) + ' ' + noun + (n == 1 ? "" : "s");
}

void print_summary(const Summary& summary, const Options& options, int64_t threads,
                   size_t outputs) {
  std::ostringstream requests;
  requests << summary.latencies_ms.size() << " of " << options.iters << " on "
           << count_of(threads, "thread") << ", after 1 untimed warm-up request";
  print_row("requests", requests.str());

  std::ostringstream checked;
  checked << count_of(summary.checked, "run") << " x "
          << count_of(static_cast<int64_t>(outputs), "output") << " (rtol "
          << format_number(*options.rtol) << ", atol " << format_number(*options.atol)
          << "), max abs error " << format_number(summary.max_abs_error);
  print_row("checked", checked.str());

  const auto& latencies = summary.latencies_ms;
  if (!latencies.empty() && summary.wall_seconds > 0) {
    print_row("latency", "p50 " + format_ms(percentile(latencies, 50)) + ", p90 " +
                             format_ms(percentile(latencies, 90)) + ", p99 " +
                             format_ms(percentile(latencies, 99)));
    const double throughput = static_cast<double>(latencies.size()) / summary.wall_seconds;
    print_row("throughput", format_number(throughput, 4) + " requests/s");
  }
}

int print_result(const Summary& summary) {
  for (const auto& error : summary.errors) {
    std::cout.flush();
    std::cerr << "customconv_demo: error: " << error << '\n';
  }
  if (!summary.errors.empty()) {
    print_row("result", "ERROR");
    return kExitError;
  }
  if (summary.mismatches > 0) {
    print_row("result", "MISMATCH in " + std::to_string(summary.mismatches) + " of " +
                            count_of(summary.checked, "run") +
                            "; first: " + summary.first_mismatch);
    return kExitMismatch;
  }
  print_row("result", "OK, every output matches");
  return kExitOk;
}

// ---------------------------------------------------------------- the demo

// The outputs every request is compared with: the expected file's, or else the
// warm-up request's (then the check is that all requests agree).
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

int main(int argc, char** argv) {
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
