"""TorchScript: modules using customconv.nn.Conv2d and the raw
torch.ops.customconv.* ops script, save, load back, and give the eager
outputs (and gradients)."""

from typing import List

import pytest
import torch
import torch.nn.functional as F

import customconv
from testlib import DEVICES, make_tensor

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
