// Autograd kernels registered at the Autograd key, so backward works from
// Python and from pure C++ alike: conv2d's and depthwise_conv2d's backward
// nodes written as PyTorch's generated autograd code writes its own (a Node
// subclass holding SavedVariables, below), the other ops' as
// torch::autograd::Function subclasses. The forward runs below autograd
// through the dispatcher; the backward calls the backward ops, also through
// the dispatcher.
#include <torch/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <array>
#include <vector>

#include "customconv/customconv.h"
#include "ops/common/epilogue.h"
#include "ops/common/trilinear_shapes.h"

namespace customconv {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::vector<int64_t> as_pair(c10::IntArrayRef v) {
  return v.size() == 1 ? std::vector<int64_t>{v[0], v[0]} : v.vec();
}

// stride, padding and dilation of a convolution, kept for its backward (in a
// Function's saved data: one entry of six values, one map insertion and one
// lookup a node).
struct SavedWindow {
  std::array<int64_t, 6> v;
  c10::IntArrayRef stride() const { return {v.data(), 2}; }
  c10::IntArrayRef padding() const { return {v.data() + 2, 2}; }
  c10::IntArrayRef dilation() const { return {v.data() + 4, 2}; }
};

SavedWindow window_of(c10::IntArrayRef stride, c10::IntArrayRef padding,
                      c10::IntArrayRef dilation) {
  SavedWindow w{};
  size_t i = 0;
  // (A list of another length fails the op's own checks in the forward.)
  for (const c10::IntArrayRef a : {stride, padding, dilation}) {
    w.v[i] = a.empty() ? 0 : a[0];
    w.v[i + 1] = a.size() >= 2 ? a[1] : w.v[i];
    i += 2;
  }
  return w;
}

void save_window(AutogradContext* ctx, c10::IntArrayRef stride, c10::IntArrayRef padding,
                 c10::IntArrayRef dilation) {
  const SavedWindow w = window_of(stride, padding, dilation);
  ctx->saved_data["window"] = std::vector<int64_t>(w.v.begin(), w.v.end());
}

SavedWindow load_window(AutogradContext* ctx) {
  SavedWindow w;
  const auto list = ctx->saved_data["window"].toIntList();
  for (size_t i = 0; i < w.v.size(); ++i) w.v[i] = list[i];
  return w;
}

// conv2d's (input, weight, bias) gradients from grad_output `go`, those that
// `need` asks for.
std::tuple<at::Tensor, at::Tensor, at::Tensor> conv2d_gradients(
    const at::Tensor& go, const at::Tensor& input, const at::Tensor& weight, const SavedWindow& win,
    int64_t groups, std::array<bool, 3> need) {
  const c10::IntArrayRef stride = win.stride(), padding = win.padding(), dilation = win.dilation();
  at::Tensor gi, gw, gb;
  if (need[0]) gi = detail::conv2d_grad_input(go, input, weight, stride, padding, dilation, groups);
  if (need[1])
    gw = detail::conv2d_grad_weight(go, input, weight, stride, padding, dilation, groups);
  if (need[2]) gb = detail::conv2d_grad_bias(go);
  return {gi, gw, gb};
}

// The same, asked by ctx (the window, groups and has_bias in its saved data).
std::tuple<at::Tensor, at::Tensor, at::Tensor> conv2d_gradients(AutogradContext* ctx,
                                                                const at::Tensor& go,
                                                                const at::Tensor& input,
                                                                const at::Tensor& weight) {
  return conv2d_gradients(go, input, weight, load_window(ctx), ctx->saved_data["groups"].toInt(),
                          {ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                           ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)});
}

// depthwise_conv2d's (input, weight, bias) gradients from `go`, those that
// `need` asks for; the weight's and the bias's in one pass over go when both are.
std::tuple<at::Tensor, at::Tensor, at::Tensor> depthwise_gradients(const at::Tensor& go,
                                                                   const at::Tensor& input,
                                                                   const at::Tensor& weight,
                                                                   const SavedWindow& win,
                                                                   std::array<bool, 3> need) {
  const c10::IntArrayRef stride = win.stride(), padding = win.padding(), dilation = win.dilation();
  at::Tensor gi, gw, gb;
  if (need[0])
    gi = detail::depthwise_conv2d_grad_input(go, input, weight, stride, padding, dilation);
  if (need[1] && need[2]) {
    std::tie(gw, gb) =
        detail::depthwise_conv2d_grad_weight_bias(go, input, weight, stride, padding, dilation);
  } else if (need[1]) {
    gw = detail::depthwise_conv2d_grad_weight(go, input, weight, stride, padding, dilation);
  } else if (need[2]) {
    gb = detail::conv2d_grad_bias(go);
  }
  return {gi, gw, gb};
}

// The backward node of conv2d (kDepthwise false) or depthwise_conv2d,
// recorded as PyTorch's generated code records its own nodes: the edges of
// input, weight and bias, and the input and weight as SavedVariables (which
// refuse a backward after either is changed in place). A
// torch::autograd::Function also records every input's metadata, wraps its
// output through sets and a std::function, and keeps its saved data in a
// string-keyed map of IValues; per call that cost several microseconds of the
// host's time more than PyTorch's convolution node, on every layer of a
// training step.
template <bool kDepthwise>
struct ConvolutionBackward : torch::autograd::Node {
  torch::autograd::SavedVariable input, weight;
  SavedWindow window{};
  int64_t groups = 1;
  bool has_bias = false;

  variable_list apply(variable_list&& grads) override {
    variable_list out(3);
    const at::Tensor& go = grads[0];
    if (!go.defined()) return out;  // no gradient flowed: none to give
    const at::Tensor x = input.unpack(), w = weight.unpack();
    const std::array<bool, 3> need{task_should_compute_output(0), task_should_compute_output(1),
                                   has_bias && task_should_compute_output(2)};
    std::tie(out[0], out[1], out[2]) = kDepthwise
                                           ? depthwise_gradients(go, x, w, window, need)
                                           : conv2d_gradients(go, x, w, window, groups, need);
    return out;
  }
  void release_variables() override {
    input.reset_data();
    weight.reset_data();
  }
  std::string name() const override {
    return kDepthwise ? "customconv::DepthwiseConv2dBackward" : "customconv::Conv2dBackward";
  }
};

// Whether t carries a forward-mode (dual) tangent.
bool has_tangent(const at::Tensor& t) { return t.defined() && t._fw_grad(/*level=*/0).defined(); }

// The forward of conv2d or depthwise_conv2d (`run`, below autograd) with its
// backward node recorded.
template <bool kDepthwise, class Run>
at::Tensor recorded_convolution(const char* name, const at::Tensor& input, const at::Tensor& weight,
                                const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                                const Run& run) {
  const at::Tensor b = bias.value_or(at::Tensor());
  TORCH_CHECK_NOT_IMPLEMENTED(!has_tangent(input) && !has_tangent(weight) && !has_tangent(b),
                              "customconv::", name, ": forward-mode AD is not supported");
  auto node = std::shared_ptr<ConvolutionBackward<kDepthwise>>(
      new ConvolutionBackward<kDepthwise>(), torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(input, weight, b));
  node->input = torch::autograd::SavedVariable(input, /*is_output=*/false);
  node->weight = torch::autograd::SavedVariable(weight, /*is_output=*/false);
  node->window = window_of(stride, padding, dilation);
  node->groups = groups;
  node->has_bias = b.defined();
  at::Tensor out;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    out = run();
  }
  torch::autograd::set_history(out, node);
  return out;
}

// conv2d_fused for training: the forward computes pre = conv + bias +
// residual with the fused op (identity activation), then the activation as an
// ATen op, and keeps what the activation's derivative reads (its input for
// relu6, silu, hardswish and gelu; its output for relu and sigmoid). The
// backward takes the activation's gradient, then conv2d's backward ops; the
// residual's gradient is the activation's input gradient itself.
class Conv2dFusedFunction : public torch::autograd::Function<Conv2dFusedFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                            c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                            c10::string_view activation,
                            const std::optional<at::Tensor>& residual) {
    at::AutoDispatchBelowADInplaceOrView below;
    const Activation a = parse_activation("conv2d_fused", activation);
    save_window(ctx, stride, padding, dilation);
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    ctx->saved_data["activation"] = static_cast<int64_t>(a);
    ctx->saved_data["has_residual"] = residual.has_value() && residual->defined();
    const at::Tensor pre = customconv::conv2d_fused(input, weight, bias, stride, padding, dilation,
                                                    groups, "identity", residual);
    const at::Tensor out = activation_forward(pre, a);
    const bool reads_out = a == Activation::kRelu || a == Activation::kSigmoid;
    const bool reads_pre = !reads_out && a != Activation::kIdentity;
    ctx->save_for_backward({input, weight, reads_pre ? pre : at::Tensor(),
                            reads_out ? out : at::Tensor()});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto a = static_cast<Activation>(ctx->saved_data["activation"].toInt());
    const at::Tensor go = activation_backward(grads[0], saved[2], saved[3], a);
    auto [gi, gw, gb] = conv2d_gradients(ctx, go, saved[0], saved[1]);
    at::Tensor gr;
    // needs_input_grad counts the tensors given (a missing bias is none).
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    if (ctx->saved_data["has_residual"].toBool() && ctx->needs_input_grad(has_bias ? 3 : 2)) {
      gr = go;
    }
    return {gi, gw, gb, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), gr};
  }
};

class Filter2dFunction : public torch::autograd::Function<Filter2dFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& kernel,
                            c10::string_view border) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->saved_data["border"] = std::string(border);
    ctx->save_for_backward({input, kernel});
    return customconv::filter2d(input, kernel, border);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const std::string border = ctx->saved_data["border"].toStringRef();
    at::Tensor gi, gk;
    if (ctx->needs_input_grad(0)) gi = detail::filter2d_grad_input(grads[0], saved[1], border);
    if (ctx->needs_input_grad(1)) {
      gk = detail::filter2d_grad_kernel(grads[0], saved[0], saved[1], border);
    }
    return {gi, gk, at::Tensor()};
  }
};

// What trilinear_interpolation's forward keeps for its backward.
enum TrilinearKeep : int64_t {
  // feats and points; the backward op blends the derivatives from feats again.
  kKeepFeats = 0,
  // The output's derivatives by the points too (3 NF elements), so the
  // backward reads those instead of feats' 8 NF. feats is kept as well (a
  // reference, no copy): a backward that records a graph (create_graph)
  // takes the backward op of feats, whose gradients refuse a second
  // differentiation in feats as well as points (the saved derivatives are
  // constants to autograd and would silently drop feats from it).
  kKeepDerivatives = 1,
  // points alone, when points needs no gradient: grad_feats comes from
  // grad_output and the corner weights (9 NF elements moved instead of 17).
  kKeepPoints = 2,
};

class TrilinearFunction : public torch::autograd::Function<TrilinearFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& feats,
                            const at::Tensor& points, int64_t keep) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->saved_data["keep"] = keep;
    if (keep == kKeepDerivatives) {
      auto [out, derivatives] = detail::trilinear_interpolation_with_derivatives(feats, points);
      ctx->save_for_backward({feats, points, derivatives});
      return out;
    }
    ctx->save_for_backward(keep == kKeepPoints ? variable_list{points}
                                               : variable_list{feats, points});
    return customconv::trilinear_interpolation(feats, points);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t keep = ctx->saved_data["keep"].toInt();
    if (keep == kKeepPoints) {
      return {detail::trilinear_interpolation_grad_feats(grads[0], saved[0]), at::Tensor(),
              at::Tensor()};
    }
    auto [grad_feats, grad_points] =
        keep == kKeepDerivatives && !at::GradMode::is_enabled()
            ? detail::trilinear_interpolation_backward_from_derivatives(grads[0], saved[2],
                                                                        saved[1])
            : detail::trilinear_interpolation_backward(grads[0], saved[0], saved[1]);
    return {grad_feats, grad_points, at::Tensor()};
  }
};

class Im2colFunction : public torch::autograd::Function<Im2colFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input,
                            c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                            c10::IntArrayRef padding, c10::IntArrayRef dilation) {
    at::AutoDispatchBelowADInplaceOrView below;
    // First the op, whose checks name a bad argument (input of fewer than 2 dims included).
    at::Tensor columns = customconv::im2col(input, kernel_size, stride, padding, dilation);
    // col2im's output_size is int[2]: under symbolic shapes, H and W specialize.
    ctx->saved_data["image_size"] =
        std::vector<int64_t>{input.sym_size(-2).guard_int(__FILE__, __LINE__),
                             input.sym_size(-1).guard_int(__FILE__, __LINE__)};
    ctx->saved_data["kernel_size"] = as_pair(kernel_size);
    save_window(ctx, stride, padding, dilation);
    return columns;
  }

  // The adjoint of im2col is col2im (differentiable in turn).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const SavedWindow win = load_window(ctx);
    const c10::IntArrayRef stride = win.stride(), padding = win.padding(),
                           dilation = win.dilation();
    at::Tensor gi =
        customconv::col2im(grads[0], ctx->saved_data["image_size"].toIntVector(),
                           ctx->saved_data["kernel_size"].toIntVector(), stride, padding, dilation);
    return {gi, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class Col2imFunction : public torch::autograd::Function<Col2imFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& columns,
                            c10::IntArrayRef output_size, c10::IntArrayRef kernel_size,
                            c10::IntArrayRef stride, c10::IntArrayRef padding,
                            c10::IntArrayRef dilation) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->saved_data["kernel_size"] = as_pair(kernel_size);
    save_window(ctx, stride, padding, dilation);
    return customconv::col2im(columns, output_size, kernel_size, stride, padding, dilation);
  }

  // The adjoint of col2im is im2col (differentiable in turn).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const SavedWindow win = load_window(ctx);
    const c10::IntArrayRef stride = win.stride(), padding = win.padding(),
                           dilation = win.dilation();
    at::Tensor gc = customconv::im2col(grads[0], ctx->saved_data["kernel_size"].toIntVector(),
                                       stride, padding, dilation);
    return {gc, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

[[noreturn]] void refuse_double_backward(const char* name) {
  TORCH_CHECK(false, "customconv::", name,
              ": double backward (differentiating a gradient of this op) is not supported");
}

// Whether autograd has to record a call with these arguments.
template <class... Args>
bool records_graph(const Args&... args) {
  if (!at::GradMode::is_enabled()) return false;
  const auto requires = [](const auto& a) {
    if constexpr (std::is_same_v<std::decay_t<decltype(a)>, at::Tensor>) {
      return a.defined() && a.requires_grad();
    } else {
      return false;
    }
  };
  return (requires(args) || ...);
}

// The Autograd kernel of a backward op returning one tensor or a pair: it runs
// the op below autograd and, when a gradient of its result is asked for,
// refuses clearly instead of silently returning none. `Fn` is the op's public
// C++ function, `kName` its name. When no argument requires grad (a backward
// pass without create_graph), it calls the op directly, building no node.
template <auto Fn, const char* kName>
struct RefuseDoubleBackward;

template <class R, class... Args, R (*Fn)(Args...), const char* kName>
struct RefuseDoubleBackward<Fn, kName>
    : torch::autograd::Function<RefuseDoubleBackward<Fn, kName>> {
  static variable_list forward(AutogradContext*, Args... args) {
    at::AutoDispatchBelowADInplaceOrView below;
    if constexpr (std::is_same_v<R, at::Tensor>) {
      return {Fn(args...)};
    } else {
      auto [a, b] = Fn(args...);
      return {a, b};
    }
  }
  static variable_list backward(AutogradContext*, variable_list) { refuse_double_backward(kName); }
  static R kernel(Args... args) {
    if (!records_graph(args...)) {
      at::AutoDispatchBelowADInplaceOrView below;
      return Fn(args...);
    }
    const variable_list out = RefuseDoubleBackward::apply(args...);
    if constexpr (std::is_same_v<R, at::Tensor>) {
      return out[0];
    } else {
      return {out[0], out[1]};
    }
  }
};

constexpr char kConv2dGradInput[] = "conv2d_grad_input";
constexpr char kConv2dGradWeight[] = "conv2d_grad_weight";
constexpr char kConv2dGradBias[] = "conv2d_grad_bias";
constexpr char kDepthwiseGradInput[] = "depthwise_conv2d_grad_input";
constexpr char kDepthwiseGradWeight[] = "depthwise_conv2d_grad_weight";
constexpr char kDepthwiseGradWeightBias[] = "depthwise_conv2d_grad_weight_bias";
constexpr char kFilter2dGradInput[] = "filter2d_grad_input";
constexpr char kFilter2dGradKernel[] = "filter2d_grad_kernel";
constexpr char kTrilinearBackward[] = "trilinear_interpolation_backward";
constexpr char kTrilinearWithDerivatives[] = "trilinear_interpolation_with_derivatives";
constexpr char kTrilinearBackwardFromDerivatives[] =
    "trilinear_interpolation_backward_from_derivatives";
constexpr char kTrilinearGradFeats[] = "trilinear_interpolation_grad_feats";

template <auto Fn, const char* kName>
void register_once_differentiable(torch::Library& m) {
  m.impl(kName, &RefuseDoubleBackward<Fn, kName>::kernel);
}

// Without a graph to record (no_grad, or nothing requiring grad) an op runs
// below autograd: no node, saved data or output wrapping, which cost inference
// a few microseconds of host time a call.
at::Tensor conv2d_autograd(const at::Tensor& input, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                           c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups) {
  if (!records_graph(input, weight, bias.value_or(at::Tensor()))) {
    at::AutoDispatchBelowADInplaceOrView below;
    return customconv::conv2d(input, weight, bias, stride, padding, dilation, groups);
  }
  return recorded_convolution<false>(
      "conv2d", input, weight, bias, stride, padding, dilation, groups,
      [&] { return customconv::conv2d(input, weight, bias, stride, padding, dilation, groups); });
}

// conv2d_fused without a graph runs its activation in the kernels.
at::Tensor conv2d_fused_autograd(const at::Tensor& input, const at::Tensor& weight,
                                 const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                 c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                 int64_t groups, c10::string_view activation,
                                 const std::optional<at::Tensor>& residual) {
  if (!records_graph(input, weight, bias.value_or(at::Tensor()), residual.value_or(at::Tensor()))) {
    at::AutoDispatchBelowADInplaceOrView below;
    return customconv::conv2d_fused(input, weight, bias, stride, padding, dilation, groups,
                                    activation, residual);
  }
  return Conv2dFusedFunction::apply(input, weight, bias, stride, padding, dilation, groups,
                                    activation, residual);
}

at::Tensor depthwise_conv2d_autograd(const at::Tensor& input, const at::Tensor& weight,
                                     const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                     c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  if (!records_graph(input, weight, bias.value_or(at::Tensor()))) {
    at::AutoDispatchBelowADInplaceOrView below;
    return customconv::depthwise_conv2d(input, weight, bias, stride, padding, dilation);
  }
  return recorded_convolution<true>(
      "depthwise_conv2d", input, weight, bias, stride, padding, dilation, /*groups=*/1,
      [&] { return customconv::depthwise_conv2d(input, weight, bias, stride, padding, dilation); });
}

at::Tensor filter2d_autograd(const at::Tensor& input, const at::Tensor& kernel,
                             c10::string_view border) {
  if (!records_graph(input, kernel)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return customconv::filter2d(input, kernel, border);
  }
  return Filter2dFunction::apply(input, kernel, border);
}

// What the forward keeps (TrilinearKeep). The backward needs the output's
// derivatives by the points only when points needs a gradient. On CUDA,
// saving them (3 NF elements written, then read) moves fewer bytes than
// reading feats (8 NF) again when they are stored in feats' own precision:
// float32 and float64. For 16-bit feats they are float32, and reading feats
// again is cheaper. On the CPU the fresh memory the derivatives are written
// to costs more than reading feats again (its pages are faulted in on first
// touch: N65536 F256 forward 61 -> 173 ms on a 2-core machine, for 60 ms less
// in the backward), so it reads feats.
int64_t trilinear_keep(const at::Tensor& feats, const at::Tensor& points) {
  if (!points.requires_grad()) return kKeepPoints;
  if (!feats.is_cuda() || !at::GradMode::is_enabled()) return kKeepFeats;
  const auto t = feats.scalar_type();
  return 6 * c10::elementSize(trilinear_derivatives_dtype(t)) < 8 * c10::elementSize(t)
             ? kKeepDerivatives
             : kKeepFeats;
}

at::Tensor trilinear_autograd(const at::Tensor& feats, const at::Tensor& points) {
  const int64_t keep = trilinear_keep(feats, points);
  // Bad arguments are reported under the name the caller used.
  if (keep == kKeepDerivatives) {
    check_trilinear<c10::SymInt>("trilinear_interpolation", feats, points);
  }
  return TrilinearFunction::apply(feats, points, keep);
}

at::Tensor im2col_autograd(const at::Tensor& input, c10::IntArrayRef kernel_size,
                           c10::IntArrayRef stride, c10::IntArrayRef padding,
                           c10::IntArrayRef dilation) {
  return Im2colFunction::apply(input, kernel_size, stride, padding, dilation);
}

at::Tensor col2im_autograd(const at::Tensor& columns, c10::IntArrayRef output_size,
                           c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                           c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  return Col2imFunction::apply(columns, output_size, kernel_size, stride, padding, dilation);
}

}  // namespace

TORCH_LIBRARY_IMPL(customconv, Autograd, m) {
  m.impl("conv2d", &conv2d_autograd);
  m.impl("conv2d_fused", &conv2d_fused_autograd);
  m.impl("depthwise_conv2d", &depthwise_conv2d_autograd);
  m.impl("filter2d", &filter2d_autograd);
  m.impl("trilinear_interpolation", &trilinear_autograd);
  m.impl("im2col", &im2col_autograd);
  m.impl("col2im", &col2im_autograd);
  register_once_differentiable<&detail::conv2d_grad_input, kConv2dGradInput>(m);
  register_once_differentiable<&detail::conv2d_grad_weight, kConv2dGradWeight>(m);
  register_once_differentiable<&detail::conv2d_grad_bias, kConv2dGradBias>(m);
  register_once_differentiable<&detail::depthwise_conv2d_grad_input, kDepthwiseGradInput>(m);
  register_once_differentiable<&detail::depthwise_conv2d_grad_weight, kDepthwiseGradWeight>(m);
  register_once_differentiable<&detail::depthwise_conv2d_grad_weight_bias,
                               kDepthwiseGradWeightBias>(m);
  register_once_differentiable<&detail::filter2d_grad_input, kFilter2dGradInput>(m);
  register_once_differentiable<&detail::filter2d_grad_kernel, kFilter2dGradKernel>(m);
  register_once_differentiable<&detail::trilinear_interpolation_backward, kTrilinearBackward>(m);
  register_once_differentiable<&detail::trilinear_interpolation_with_derivatives,
                               kTrilinearWithDerivatives>(m);
  register_once_differentiable<&detail::trilinear_interpolation_backward_from_derivatives,
                               kTrilinearBackwardFromDerivatives>(m);
  register_once_differentiable<&detail::trilinear_interpolation_grad_feats, kTrilinearGradFeats>(m);
}

}  // namespace customconv
