// Loading the model (class Model: TorchScript .pt or AOTInductor .pt2), reading
// the inputs and other files written by torch.save, and checking the --device.
#pragma once

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/script.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace customconv_demo {

std::vector<torch::Tensor> tensors_of(const torch::IValue& value, const std::string& what);

torch::IValue load_pickled(const std::string& path);

// The model's arguments: the file holds a list (or tuple) of them, or one tensor.
// Tensors are moved to the device; other values are passed as they are.
std::vector<torch::IValue> load_inputs(const std::string& path, torch::Device device);

std::vector<torch::Tensor> tensor_inputs(const std::vector<torch::IValue>& inputs);

// A loaded model: TorchScript (.pt) or an AOTInductor package (.pt2, by the
// file's extension). forward() may be called from several threads at once.
class Model {
 public:
  Model(const std::string& path, torch::Device device, int64_t threads);

  static const char* kind(const std::string& path);

  // A package takes tensors only and returns a list of them.
  torch::IValue forward(const std::vector<torch::IValue>& inputs);

 private:
  // One runner per serving thread, so that requests do not wait for each other.
  void load_package(const std::string& path, torch::Device device, int64_t threads);

  std::optional<torch::jit::Module> script_;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> package_;
};

void require_device(torch::Device device);

}  // namespace customconv_demo
