// The report: what the threads saw, summed up (Summary), printed as latency
// percentiles, throughput and the result, which gives the exit status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "options.h"
#include "serving.h"

namespace customconv_demo {

struct Summary {
  std::vector<double> latencies_ms;  // sorted
  int64_t checked = 0;
  int64_t mismatches = 0;
  double max_abs_error = 0;
  std::string first_mismatch;
  std::vector<std::string> errors;
  double wall_seconds = 0;
};

Summary summarize(const ThreadReport& warm_up_report, const ServingResult& serving);

void print_summary(const Summary& summary, const Options& options, int64_t threads, size_t outputs);

int print_result(const Summary& summary);

}  // namespace customconv_demo
