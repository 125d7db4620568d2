"""customconv.convert(model): torch.nn.Conv2d modules become customconv's
(DepthwiseConv2d when groups == in_channels, else Conv2d), keeping their
parameters and every padding mode; converted torchvision models (random
weights) give the original's outputs and gradients, and script."""

import copy

import pytest
import torch

import customconv
from testlib import DEVICES, make_tensor

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.script


class Mixed(torch.nn.Module):
    """Every kind of torch.nn.Conv2d that convert() meets, nested."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, padding_mode="reflect")
        self.blocks = torch.nn.Sequential(
            torch.nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False),      # depthwise
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 16, (3, 5), padding="same", groups=8,        # depthwise, m = 2
                            padding_mode="circular"),
            torch.nn.Conv2d(16, 12, 3, padding=2, dilation=2, groups=4),    # grouped
            torch.nn.Conv2d(12, 6, (2, 3), padding="same", padding_mode="replicate"),
            torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Conv2d(6, 4, 1, padding="valid")),
        )

    def forward(self, x):
        return self.blocks(self.stem(x))


def conv_types(model):
    return [type(m) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]


def assert_same_outputs_and_grads(model, converted, x, rtol, atol):
    x1 = x.detach().clone().requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    want, got = model(x1), converted(x2)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    grad = torch.randn_like(want)
    want.backward(grad)
    got.backward(grad)
    torch.testing.assert_close(x2.grad, x1.grad, rtol=rtol, atol=atol)
    for (name, p), q in zip(model.named_parameters(), converted.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("device", DEVICES)
def test_convert_swaps_each_conv2d_and_matches_torch_in_float64(device, gen):
    model = Mixed().to(device, torch.float64)
    converted = customconv.convert(copy.deepcopy(model))
    assert conv_types(converted) == [
        customconv.nn.Conv2d, customconv.nn.DepthwiseConv2d, customconv.nn.DepthwiseConv2d,
        customconv.nn.Conv2d, customconv.nn.Conv2d, customconv.nn.Conv2d]
    for (name, p), (name2, q) in zip(model.named_parameters(), converted.named_parameters()):
        assert name == name2 and q.device == p.device and q.dtype == p.dtype
        assert torch.equal(q, p), name
    x = make_tensor((2, 3, 19, 22), torch.float64, device, gen=gen)
    assert_same_outputs_and_grads(model, converted, x, 1e-10, 1e-10)


def test_convert_keeps_the_parameter_objects_and_the_training_flag():
    conv = torch.nn.Conv2d(4, 4, 3, groups=4).eval()
    model = torch.nn.Sequential(conv)
    weight, bias = conv.weight, conv.bias
    converted = customconv.convert(model)
    assert converted is model
    assert isinstance(model[0], customconv.nn.DepthwiseConv2d)
    assert model[0].weight is weight and model[0].bias is bias
    assert not model[0].training
    # A bare Conv2d is converted too (and returned).
    assert isinstance(customconv.convert(torch.nn.Conv2d(3, 4, 3)), customconv.nn.Conv2d)


def test_convert_leaves_subclasses_and_customconv_modules_alone():
    class ScaledConv(torch.nn.Conv2d):
        def forward(self, x):
            return 2 * super().forward(x)

    model = torch.nn.Sequential(ScaledConv(3, 3, 1), customconv.nn.Conv2d(3, 3, 1),
                                torch.nn.Conv1d(3, 3, 1))
    before = [type(m) for m in model]
    customconv.convert(model)
    assert [type(m) for m in model] == before


def test_convert_refuses_a_lazy_conv2d_before_its_first_call():
    model = torch.nn.Sequential(torch.nn.LazyConv2d(4, 3))
    with pytest.raises(ValueError, match="LazyConv2d whose weight is not initialized"):
        customconv.convert(model)
    model(torch.randn(1, 2, 5, 5))  # now a torch.nn.Conv2d with 2 input channels
    assert isinstance(customconv.convert(model)[0], customconv.nn.Conv2d)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ["mobilenet_v2", "resnet18"])
def test_converted_torchvision_model_matches_the_original_and_scripts(arch, device, gen):
    torchvision = pytest.importorskip("torchvision")
    model = getattr(torchvision.models, arch)(weights=None)  # random weights, no download
    randomize_batch_norm_statistics(model, gen)
    model = model.to(device).eval()
    converted = customconv.convert(copy.deepcopy(model))
    kinds = {type(m) for m in converted.modules()}
    assert torch.nn.Conv2d not in kinds
    if arch == "mobilenet_v2":
        assert customconv.nn.DepthwiseConv2d in kinds

    # float64: the same numbers as PyTorch's convolutions, gradients included.
    x = make_tensor((2, 3, 48, 40), torch.float64, device, gen=gen)
    assert_same_outputs_and_grads(model.double(), converted.double(), x, 1e-9, 1e-9)

    # float32, scripted.
    model, converted = model.float(), converted.float()
    scripted = torch.jit.script(converted)
    with torch.no_grad():
        x = make_tensor((2, 3, 64, 64), torch.float32, device, gen=gen)
        torch.testing.assert_close(scripted(x), model(x), rtol=1e-4, atol=1e-4)


def randomize_batch_norm_statistics(model, gen):
    """Running statistics and affine parameters away from their initial 0 / 1,
    so that evaluation-mode batch norm is not nearly the identity."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(n, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(n, generator=gen) * 0.1)
