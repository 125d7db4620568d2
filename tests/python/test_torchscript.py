"""TorchScript: modules using customconv.nn.Conv2d, DepthwiseConv2d,
Filter2d, TrilinearInterpolation and the raw torch.ops.customconv.* ops
script, save, load back, and give the eager outputs (and gradients)."""

from typing import List

import pytest
import torch
import torch.nn.functional as F

import customconv
from testlib import DEVICES, f64, filter2d_torch, make_tensor, trilinear_torch

# torch.jit.script / torch.jit.load warn that they are deprecated; they are a
# deployment path of this library all the same.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class ConvNet(torch.nn.Module):
    """customconv.nn.Conv2d in several configurations."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            customconv.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.ReLU(),
            customconv.nn.Conv2d(8, 8, (3, 2), stride=(2, 1), padding="valid", groups=4,
                                 bias=False),
            torch.nn.Tanh(),
            customconv.nn.Conv2d(8, 6, 3, padding="same", dilation=(1, 2), padding_mode="reflect"),
            customconv.nn.Conv2d(6, 4, 2, padding=1, padding_mode="circular"),
        )

    def forward(self, x):
        return self.body(x)


class RawOps(torch.nn.Module):
    """Calls torch.ops.customconv.* directly, defaulted arguments omitted in places."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(6, 2, 3, 3, dtype=torch.float64))
        self.bias = torch.nn.Parameter(torch.randn(6, dtype=torch.float64))
        self.size: List[int] = [9, 8]

    def forward(self, x):
        y = torch.ops.customconv.conv2d(x, self.weight, self.bias, [1, 1], [1, 1], [1, 1], 2)
        cols = torch.ops.customconv.im2col(y, [2, 3], [1, 1], [0, 1])
        cols = torch.sigmoid(cols)
        z = torch.ops.customconv.col2im(cols, self.size, [2, 3], padding=[0, 1])
        return z + torch.ops.customconv.conv2d(x, self.weight[:, :, :1, :1].contiguous(), None,
                                               groups=2)


def roundtrip(module, tmp_path, device):
    scripted = torch.jit.script(module)
    path = tmp_path / "model.pt"
    scripted.save(str(path))
    return scripted, torch.jit.load(str(path), map_location=device)


@pytest.mark.parametrize("device", DEVICES)
def test_scripted_nn_conv2d_model_survives_save_and_load(device, tmp_path, gen):
    model = ConvNet().double().to(device)
    scripted, loaded = roundtrip(model, tmp_path, device)
    x = make_tensor((2, 3, 11, 10), torch.float64, device, gen=gen, requires_grad=True)
    want = model(x)
    for name, m in (("scripted", scripted), ("loaded", loaded)):
        got = m(x)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=lambda e: f"{name}: {e}")
    # Gradients through the loaded module match eager.
    grad = make_tensor(want.shape, torch.float64, device, gen=gen)
    (g_want,) = torch.autograd.grad(want, x, grad)
    (g_got,) = torch.autograd.grad(loaded(x), x, grad)
    torch.testing.assert_close(g_got, g_want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_scripted_raw_ops_module_survives_save_and_load(device, tmp_path, gen):
    model = RawOps().to(device)
    scripted, loaded = roundtrip(model, tmp_path, device)
    graph = str(loaded.graph) + str(loaded.code)
    for op in ("customconv::conv2d", "customconv::im2col", "customconv::col2im"):
        assert op in graph.replace("torch.ops.customconv.", "customconv::"), op
    x = make_tensor((3, 4, 9, 8), torch.float64, device, "channels_last", gen)
    want = model(x)
    for name, m in (("scripted", scripted), ("loaded", loaded)):
        torch.testing.assert_close(m(x), want, rtol=1e-12, atol=1e-12, msg=lambda e: f"{name}: {e}")
    # ... and eager matches PyTorch's own ops.
    xr, w, b = x.cpu(), model.weight.detach().cpu(), model.bias.detach().cpu()
    y = F.conv2d(xr, w, b, 1, 1, 1, 2)
    z = F.fold(torch.sigmoid(F.unfold(y, (2, 3), padding=(0, 1))), (9, 8), (2, 3), padding=(0, 1))
    ref = z + F.conv2d(xr, w[:, :, :1, :1], None, groups=2)
    torch.testing.assert_close(want.detach().cpu(), ref, rtol=1e-10, atol=1e-10)


class DirectNet(torch.nn.Module):
    """customconv.nn.DepthwiseConv2d, Filter2d and TrilinearInterpolation."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            customconv.nn.DepthwiseConv2d(4, 8, 3, padding=1),
            torch.nn.ReLU(),
            customconv.nn.DepthwiseConv2d(8, 8, (5, 3), padding="same", padding_mode="reflect",
                                          bias=False),
            customconv.nn.Filter2d(torch.randn(3, 5, dtype=torch.float64), "circular",
                                   requires_grad=True),
        )
        self.interpolate = customconv.nn.TrilinearInterpolation()

    def forward(self, x, points):
        y = self.body(x)
        return self.interpolate(y.flatten(2), points)


class DirectRawOps(torch.nn.Module):
    """Calls the direct-kernel ops directly, defaulted arguments omitted in places."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 1, 3, 2, dtype=torch.float64))
        self.kernel = torch.nn.Parameter(torch.randn(5, 3, dtype=torch.float64))
        self.border: str = "replicate"

    def forward(self, x, points):
        y = torch.ops.customconv.depthwise_conv2d(x, self.weight, None, [1, 1], [1, 0])
        z = torch.ops.customconv.filter2d(y, self.kernel, self.border)
        z = z + torch.ops.customconv.filter2d(y, self.kernel)
        return torch.ops.customconv.trilinear_interpolation(z.flatten(2), points)


def direct_inputs(device, gen, batch=3):
    x = make_tensor((batch, 4, 7, 6), torch.float64, device, gen=gen, requires_grad=True)
    points = make_tensor((batch, 3), torch.float64, device, gen=gen, requires_grad=True)
    return x, points


@pytest.mark.parametrize("device", DEVICES)
def test_scripted_direct_ops_model_survives_save_and_load(device, tmp_path, gen):
    model = DirectNet().double().to(device)
    scripted, loaded = roundtrip(model, tmp_path, device)
    x, points = direct_inputs(device, gen)
    want = model(x, points)
    for name, m in (("scripted", scripted), ("loaded", loaded)):
        torch.testing.assert_close(m(x, points), want, rtol=1e-12, atol=1e-12,
                                   msg=lambda e: f"{name}: {e}")
    # Gradients (input, points and every parameter) through the loaded module match eager.
    grad = make_tensor(want.shape, torch.float64, device, gen=gen)
    g_want = torch.autograd.grad(want, [x, points] + list(model.parameters()), grad)
    g_got = torch.autograd.grad(loaded(x, points), [x, points] + list(loaded.parameters()), grad)
    for i, (a, b) in enumerate(zip(g_got, g_want)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=lambda e: f"grad {i}: {e}")


@pytest.mark.parametrize("device", DEVICES)
def test_scripted_direct_raw_ops_module_survives_save_and_load(device, tmp_path, gen):
    model = DirectRawOps().to(device)
    scripted, loaded = roundtrip(model, tmp_path, device)
    graph = (str(loaded.graph) + str(loaded.code)).replace("torch.ops.customconv.", "customconv::")
    for op in ("customconv::depthwise_conv2d", "customconv::filter2d",
               "customconv::trilinear_interpolation"):
        assert op in graph, op
    x, points = direct_inputs(device, gen)
    want = model(x, points)
    for name, m in (("scripted", scripted), ("loaded", loaded)):
        torch.testing.assert_close(m(x, points), want, rtol=1e-12, atol=1e-12,
                                   msg=lambda e: f"{name}: {e}")
    # ... and eager matches PyTorch's own ops.
    w, k = f64(model.weight), f64(model.kernel)
    y = F.conv2d(f64(x), w, None, 1, (1, 0), 1, 4)
    z = filter2d_torch(y, k, "replicate") + filter2d_torch(y, k, "zeros")
    ref = trilinear_torch(z.flatten(2), f64(points))
    torch.testing.assert_close(f64(want), ref, rtol=1e-10, atol=1e-10)
