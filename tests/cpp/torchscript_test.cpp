// The TorchScript deployment path: the ops are visible to TorchScript, and a
// model scripted and saved by Python (tests/make_test_models.py) loads with
// torch::jit::load and runs in C++ (forward, backward, CUDA, several threads),
// matching the outputs and gradients PyTorch's reference computed in Python.
#include "test_support.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

namespace {

using namespace customconv_test;

// ---------------------------------------------------------------- registration

TEST(OpRegistrationTest, OpsAreVisibleToTorchScript) {
  const std::pair<const char*, const char*> ops[] = {
      {"customconv::conv2d",
       "customconv::conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, "
       "int[2] padding=0, int[2] dilation=1, int groups=1) -> Tensor"},
      {"customconv::im2col",
       "customconv::im2col(Tensor input, int[2] kernel_size, int[2] stride=1, int[2] padding=0, "
       "int[2] dilation=1) -> Tensor"},
      {"customconv::col2im",
       "customconv::col2im(Tensor columns, int[2] output_size, int[2] kernel_size, "
       "int[2] stride=1, int[2] padding=0, int[2] dilation=1) -> Tensor"},
      {"customconv::conv2d_grad_input",
       "customconv::conv2d_grad_input(Tensor grad_output, Tensor input, Tensor weight, "
       "int[2] stride, int[2] padding, int[2] dilation, int groups) -> Tensor"},
      {"customconv::conv2d_grad_weight",
       "customconv::conv2d_grad_weight(Tensor grad_output, Tensor input, Tensor weight, "
       "int[2] stride, int[2] padding, int[2] dilation, int groups) -> Tensor"},
      {"customconv::conv2d_grad_bias", "customconv::conv2d_grad_bias(Tensor grad_output) -> Tensor"},
  };
  for (const auto& [name, schema] : ops) {
    SCOPED_TRACE(name);
    const auto& found = torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString(name));
    ASSERT_EQ(found.size(), 1u);
    std::ostringstream s;
    s << found[0]->schema();
    EXPECT_EQ(s.str(), schema);
  }
}

// ---------------------------------------------------------------- the saved model

// A file written by tests/make_test_models.py into $CUSTOMCONV_TEST_DATA, or
// else into test-data beside this executable (where the build's
// make_test_models test writes it).
std::string test_data_file(const std::string& name) {
  const char* dir = std::getenv("CUSTOMCONV_TEST_DATA");
  if (dir != nullptr && *dir != '\0') return std::string(dir) + "/" + name;
  std::error_code error;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", error);
  const auto path = exe.parent_path() / "test-data" / name;
  if (error || !std::filesystem::exists(path)) {
    ADD_FAILURE() << "CUSTOMCONV_TEST_DATA is not set and " << path
                  << " does not exist: run the tests with ctest, or run "
                     "tests/make_test_models.py DIR and set CUSTOMCONV_TEST_DATA=DIR";
  }
  return path.string();
}

// The tensors of a list saved by Python's torch.save([t0, t1, ...]).
std::vector<at::Tensor> load_tensor_list(const std::string& name) {
  const std::string path = test_data_file(name);
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    ADD_FAILURE() << "cannot open " << path;
    return {};
  }
  const std::vector<char> bytes((std::istreambuf_iterator<char>(file)),
                                std::istreambuf_iterator<char>());
  const c10::IValue value = torch::jit::pickle_load(bytes);
  std::vector<at::Tensor> tensors;
  if (!value.isList()) {
    ADD_FAILURE() << path << " does not hold a list but " << value.tagKind();
    return tensors;
  }
  for (const auto& item : value.toListRef()) tensors.push_back(item.toTensor());
  return tensors;
}

std::vector<at::Tensor> as_tensors(const c10::IValue& output) {
  std::vector<at::Tensor> tensors;
  if (output.isTensor()) {
    tensors.push_back(output.toTensor());
  } else {
    for (const auto& item : output.toTupleRef().elements()) tensors.push_back(item.toTensor());
  }
  return tensors;
}

constexpr double kModelRtol = 1e-4, kModelAtol = 1e-5;

class TorchScriptModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_for_current_test();
    model = torch::jit::load(test_data_file("conv_model.pt"));
    inputs = load_tensor_list("conv_model_inputs.pt");
    expected = load_tensor_list("conv_model_expected.pt");
    ASSERT_EQ(inputs.size(), 1u);
    ASSERT_EQ(expected.size(), 2u);
  }

  void expect_matches_expected(const std::vector<at::Tensor>& outputs) {
    ASSERT_EQ(outputs.size(), expected.size());
    EXPECT_TRUE(all_close(outputs[0], expected[0], kModelRtol, kModelAtol)) << "features";
    EXPECT_TRUE(all_close(outputs[1], expected[1], kModelRtol, kModelAtol)) << "columns";
  }

  torch::jit::Module model;
  std::vector<at::Tensor> inputs, expected;
};

TEST_F(TorchScriptModelTest, TorchSaveFilesReadBackWithPickleLoad) {
  EXPECT_EQ(inputs[0].sizes(), (std::vector<int64_t>{2, 3, 11, 9}));
  EXPECT_EQ(inputs[0].scalar_type(), at::kFloat);
  EXPECT_GT(inputs[0].abs().sum().item<double>(), 0.0);
  EXPECT_EQ(expected[0].dim(), 4);
  EXPECT_EQ(expected[1].dim(), 3);
}

TEST_F(TorchScriptModelTest, ScriptedCodeCallsTheCustomconvOps) {
  EXPECT_NE(model.get_method("forward").graph()->toString().find("customconv::im2col"),
            std::string::npos);
  for (const char* conv : {"conv1", "conv2"}) {
    const auto sub = model.attr(conv).toModule();
    EXPECT_NE(sub.get_method("_conv_forward").graph()->toString().find("customconv::conv2d"),
              std::string::npos)
        << conv;
  }
}

TEST_F(TorchScriptModelTest, ForwardMatchesPythonReference) {
  expect_matches_expected(as_tensors(model.forward({inputs[0]})));
}

TEST_F(TorchScriptModelTest, ForwardMatchesUnderInferenceMode) {
  c10::InferenceMode guard;
  model.eval();
  expect_matches_expected(as_tensors(model.forward({inputs[0]})));
}

TEST_F(TorchScriptModelTest, BackwardInCppMatchesReferenceGradients) {
  const auto backward = load_tensor_list("conv_model_backward.pt");
  ASSERT_EQ(backward.size(), 5u);
  const at::Tensor x = inputs[0].clone().requires_grad_();
  const auto outputs = as_tensors(model.forward({x}));
  ASSERT_EQ(outputs.size(), 2u);
  const at::Tensor w1 = model.attr("conv1").toModule().attr("weight").toTensor();
  const at::Tensor w2 = model.attr("conv2").toModule().attr("weight").toTensor();
  ASSERT_TRUE(w1.requires_grad());
  ASSERT_TRUE(w2.requires_grad());
  const auto grads = torch::autograd::grad(outputs, {x, w1, w2}, {backward[0], backward[1]});
  EXPECT_TRUE(all_close(grads[0], backward[2], kModelRtol, kModelAtol)) << "grad input";
  EXPECT_TRUE(all_close(grads[1], backward[3], kModelRtol, kModelAtol)) << "grad conv1.weight";
  EXPECT_TRUE(all_close(grads[2], backward[4], kModelRtol, kModelAtol)) << "grad conv2.weight";
}

TEST_F(TorchScriptModelTest, ForwardFromSeveralThreadsAtOnceMatches) {
  c10::InferenceMode guard;
  constexpr int kThreads = 4, kIters = 5;
  std::atomic<int> mismatches{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      c10::InferenceMode thread_guard;
      for (int i = 0; i < kIters; ++i) {
        try {
          const auto out = as_tensors(model.forward({inputs[0]}));
          if (out.size() != 2 || !all_close(out[0], expected[0], kModelRtol, kModelAtol) ||
              !all_close(out[1], expected[1], kModelRtol, kModelAtol)) {
            ++mismatches;
          }
        } catch (const std::exception&) {
          ++errors;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(errors.load(), 0);
}

TEST_F(TorchScriptModelTest, BadInputGivesAnErrorNamingTheArgument) {
  // One channel too many for conv1.
  const at::Tensor wrong = torch::randn({2, 4, 11, 9});
  EXPECT_TRUE(throws_exception_containing([&] { model.forward({wrong}); }, "channels"));
  expect_matches_expected(as_tensors(model.forward({inputs[0]})));
}

TEST_F(TorchScriptModelTest, RunsOnCudaAndMatchesPythonReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA, 0);
  model.to(cuda);
  const auto outputs = as_tensors(model.forward({inputs[0].to(cuda)}));
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_TRUE(outputs[0].is_cuda());
  EXPECT_TRUE(outputs[1].is_cuda());
  expect_matches_expected(outputs);

  const auto backward = load_tensor_list("conv_model_backward.pt");
  ASSERT_EQ(backward.size(), 5u);
  const at::Tensor x = inputs[0].to(cuda).requires_grad_();
  const auto grads = torch::autograd::grad(as_tensors(model.forward({x})), {x},
                                           {backward[0].to(cuda), backward[1].to(cuda)});
  EXPECT_TRUE(all_close(grads[0], backward[2], kModelRtol, kModelAtol)) << "grad input";

  // A CPU input for a CUDA model is refused clearly, and the model still works after.
  EXPECT_TRUE(throws_exception_containing([&] { model.forward({inputs[0]}); }, "device"));
  expect_matches_expected(as_tensors(model.forward({inputs[0].to(cuda)})));
}

}  // namespace
