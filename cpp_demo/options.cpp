// The demo's command line: parsing the arguments, the usage text, the default
// model, and checking that the files are there.
#include "options.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <system_error>
#include <utility>
#include <vector>

#ifndef CUSTOMCONV_DEMO_DIR
#error "CUSTOMCONV_DEMO_DIR (the folder of the default model) must be defined by the build"
#endif

namespace customconv_demo {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxIters = 100'000'000;
constexpr int64_t kMaxThreads = 1024;

}  // namespace

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
    "  --iters N          requests in total, after 3 warm-up requests (default 20)\n"
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

// ---------------------------------------------------------------- arguments

namespace {

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

}  // namespace

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

namespace {

// The command that writes the default model (the library sits beside the demo
// folder, in the build folder).
std::string default_model_command() {
  const fs::path dir = CUSTOMCONV_DEMO_DIR;
  return "CUSTOMCONV_LIBRARY=" + (dir.parent_path() / "libcustomconv.so").string() +
         " python3 cpp_demo/make_model.py --out " + dir.string();
}

}  // namespace

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

}  // namespace customconv_demo
