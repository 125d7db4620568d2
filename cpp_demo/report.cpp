// The report: summing up what the threads saw, and printing it.
#include "report.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "compare.h"
#include "serving.h"
#include "text.h"

namespace customconv_demo {

namespace {

std::string format_ms(double ms) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(3) << ms << " ms";
  return out.str();
}

// Nearest-rank percentile of sorted values.
double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) {
    return 0;
  }
  const auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

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

}  // namespace

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

void print_summary(const Summary& summary, const Options& options, int64_t threads,
                   size_t outputs) {
  std::ostringstream requests;
  requests << summary.latencies_ms.size() << " of " << options.iters << " on "
           << count_of(threads, "thread") << ", after " << kWarmUpRequests
           << " untimed warm-up requests and one more on each thread";
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

}  // namespace customconv_demo
