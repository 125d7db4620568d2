// A downstream program linked to an installed customconv: checks the version,
// calls an op through the public C++ API, then loads a scripted model that uses
// the ops and compares its outputs with the expected ones.
//
//   consumer MODEL.pt INPUTS.pt EXPECTED.pt
//
// INPUTS.pt and EXPECTED.pt are lists of tensors written by torch.save.
#include <ATen/ATen.h>
#include <customconv/customconv.h>
#include <torch/script.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

namespace {

std::vector<at::Tensor> load_tensors(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw std::runtime_error("cannot open " + path);
  }
  const std::vector<char> bytes{std::istreambuf_iterator<char>(file), {}};
  const torch::IValue list = torch::jit::pickle_load(bytes);
  std::vector<at::Tensor> tensors;
  for (const auto& value : list.toListRef()) {
    tensors.push_back(value.toTensor());
  }
  return tensors;
}

bool check(bool ok, const std::string& what) {
  std::cout << (ok ? "ok:   " : "FAIL: ") << what << '\n';
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: consumer MODEL.pt INPUTS.pt EXPECTED.pt\n";
    return 2;
  }
  bool ok = check(customconv::version() == CUSTOMCONV_PACKAGE_VERSION,
                  "customconv::version() " + customconv::version() +
                      " is the CMake package's version " CUSTOMCONV_PACKAGE_VERSION);

  at::manual_seed(0);
  const auto x = at::randn({2, 3, 9, 8}, at::kDouble);
  const auto w = at::randn({4, 3, 3, 3}, at::kDouble);
  ok &= check(at::allclose(customconv::conv2d(x, w, std::nullopt, 2, 1), at::conv2d(x, w, {}, 2, 1)),
              "customconv::conv2d equals at::conv2d");

  torch::jit::Module model = torch::jit::load(argv[1]);
  model.eval();
  std::vector<torch::IValue> inputs;
  for (const auto& t : load_tensors(argv[2])) {
    inputs.emplace_back(t);
  }
  const auto expected = load_tensors(argv[3]);
  const torch::IValue output = model.forward(inputs);
  std::vector<at::Tensor> outputs;
  if (output.isTensor()) {
    outputs.push_back(output.toTensor());
  } else {
    for (const auto& t : output.toTupleRef().elements()) {
      outputs.push_back(t.toTensor());
    }
  }
  ok &= check(outputs.size() == expected.size(), "the model returns " +
                                                     std::to_string(expected.size()) + " outputs");
  for (size_t i = 0; i < outputs.size() && i < expected.size(); ++i) {
    ok &= check(at::allclose(outputs[i], expected[i], 1e-4, 1e-5),
                "output " + std::to_string(i) + " matches the expected one");
  }
  return ok ? 0 : 1;
}
