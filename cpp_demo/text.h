// Small text helpers shared by the parts of the demo: exception messages,
// descriptions of tensors, numbers, and the report's "label: text" rows.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace customconv_demo {

// The message of an exception, without the C++ backtrace c10::Error carries.
std::string message_of(const std::exception& e);

std::string describe_tensor(const torch::Tensor& t);
std::string describe_tensors(const std::vector<torch::Tensor>& tensors);
std::string format_number(double value, int precision = 3);

void print_row(const std::string& label, const std::string& text);

// "1 thread", "4 threads".
std::string count_of(int64_t n, const std::string& noun);

}  // namespace customconv_demo
