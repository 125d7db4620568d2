// The demo's command line: the options, the errors that stop the demo and the
// exit statuses, parsing the arguments, the usage text, and checking the files.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace customconv_demo {

constexpr int kExitOk = 0;
constexpr int kExitMismatch = 1;
constexpr int kExitUsage = 2;
constexpr int kExitError = 3;

extern const char* const kSynopsis;
extern const char* const kDetails;

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

// Accepts "--name value" and "--name=value".
Options parse_args(int argc, char** argv);

void require_files(const Options& options);

}  // namespace customconv_demo
