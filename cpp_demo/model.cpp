// Loading the model and reading the files written by torch.save.
#include "model.h"

#include <torch/cuda.h>
#include <torch/serialize.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "options.h"

namespace customconv_demo {

namespace {

namespace fs = std::filesystem;

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

}  // namespace

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

namespace {

bool is_package(const std::string& path) { return fs::path(path).extension() == ".pt2"; }

}  // namespace

Model::Model(const std::string& path, torch::Device device, int64_t threads) {
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

const char* Model::kind(const std::string& path) {
  return is_package(path) ? "AOTInductor package" : "TorchScript model";
}

torch::IValue Model::forward(const std::vector<torch::IValue>& inputs) {
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

void Model::load_package(const std::string& path, torch::Device device, int64_t threads) {
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

}  // namespace customconv_demo
