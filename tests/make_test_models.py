"""Writes the TorchScript model and the tensors that the C++ tests load.

Usage: make_test_models.py OUT_DIR   (with `import customconv` working, e.g.
PYTHONPATH=<repo>/python_stub and CUSTOMCONV_LIBRARY=<build>/libcustomconv.so)

Files written to OUT_DIR:
  conv_model.pt            torch.jit.script of ConvModel: two customconv.nn.Conv2d
                           layers and a raw torch.ops.customconv.im2col call;
                           forward(x) returns (features, columns)
  conv_model_inputs.pt     torch.save([x])
  conv_model_expected.pt   torch.save([features, columns]) computed by PyTorch's
                           own F.conv2d / F.unfold with the model's parameters
  conv_model_backward.pt   torch.save([grad_features, grad_columns, grad_x,
                           grad_conv1_weight, grad_conv2_weight]): upstream
                           gradients and the reference gradients they give

C++ reads the tensor files with torch::jit::pickle_load (the zip format of torch.save).
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import customconv


class ConvModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = customconv.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = customconv.nn.Conv2d(
            8, 6, (3, 2), stride=(2, 1), dilation=(1, 2), groups=2, bias=False
        )

    def forward(self, x):
        features = self.conv2(torch.relu(self.conv1(x)))
        columns = torch.ops.customconv.im2col(features, [2, 2], [1, 1], [1, 0], [1, 1])
        return features, columns


def reference_forward(model, x):
    """ConvModel's forward with PyTorch's own ops and the same parameters."""
    c1, c2 = model.conv1, model.conv2
    h = F.conv2d(x, c1.weight, c1.bias, c1.stride, c1.padding, c1.dilation, c1.groups)
    features = F.conv2d(
        torch.relu(h), c2.weight, c2.bias, c2.stride, c2.padding, c2.dilation, c2.groups
    )
    columns = F.unfold(features, (2, 2), dilation=1, padding=(1, 0), stride=1)
    return features, columns


def check_close(name, actual, expected):
    if not torch.allclose(actual, expected, rtol=1e-4, atol=1e-5):
        raise SystemExit(
            f"make_test_models: {name} of the customconv model differs from PyTorch's reference "
            f"(max abs diff {(actual - expected).abs().max().item()})"
        )


def main(out_dir):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(20240611)

    model = ConvModel().eval()
    scripted = torch.jit.script(model)
    for module in (scripted.conv1, scripted.conv2):
        if "customconv::conv2d" not in str(module._conv_forward.graph):
            raise SystemExit("make_test_models: the scripted Conv2d does not call customconv::conv2d")
    if "customconv::im2col" not in str(scripted.graph):
        raise SystemExit("make_test_models: the scripted forward does not call customconv::im2col")

    x = torch.randn(2, 3, 11, 9)
    expected = reference_forward(model, x)
    for name, actual, ref in zip(("features", "columns"), scripted(x), expected):
        check_close(name, actual, ref)

    # Reference gradients of sum(features * grad_features) + sum(columns * grad_columns).
    grad_features = torch.randn_like(expected[0])
    grad_columns = torch.randn_like(expected[1])
    xr = x.clone().requires_grad_()
    model.zero_grad()
    features, columns = reference_forward(model, xr)
    ((features * grad_features).sum() + (columns * grad_columns).sum()).backward()
    backward = [grad_features, grad_columns, xr.grad, model.conv1.weight.grad.clone(),
                model.conv2.weight.grad.clone()]
    model.zero_grad()

    scripted.save(str(out / "conv_model.pt"))
    torch.save([x], out / "conv_model_inputs.pt")
    torch.save([t.detach() for t in expected], out / "conv_model_expected.pt")
    torch.save(backward, out / "conv_model_backward.pt")
    print(f"make_test_models: wrote conv_model*.pt to {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: make_test_models.py OUT_DIR")
    main(sys.argv[1])
