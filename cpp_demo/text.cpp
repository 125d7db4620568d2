// Small text helpers shared by the parts of the demo.
#include "text.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace customconv_demo {

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

std::string format_number(double value, int precision) {
  if (std::isnan(value)) {
    return "nan";  // not "-nan"
  }
  std::ostringstream out;
  out << std::setprecision(precision) << value;
  return out.str();
}

void print_row(const std::string& label, const std::string& text) {
  std::cout << std::left << std::setw(12) << (label + ":") << text << '\n';
}

std::string count_of(int64_t n, const std::string& noun) {
  return std::to_string(n) + ' ' + noun + (n == 1 ? "" : "s");
}

}  // namespace customconv_demo
