"""Writes a TorchScript model built on the customconv ops, with its inputs and
expected outputs, for customconv_demo (the C++ deployment program) to run.

    python3 cpp_demo/make_model.py --out DIR [--model NAME] [--seed S] [--pt2 cpu|cuda]

writes
    DIR/model.pt     the scripted model (torch.jit.save)
    DIR/inputs.pt    its inputs, torch.save([t0, t1, ...])
    DIR/expected.pt  its outputs for those inputs, computed here on the CPU in
                     float32: a tensor, or a tuple of tensors
    DIR/model.pt2    with --pt2 DEVICE only: the model exported by torch.export
                     (dim 0 dynamic in the inputs whose dim 0 is the first
                     input's batch) and compiled by AOTInductor for DEVICE
                     (torch._inductor.aoti_compile_and_package); customconv_demo
                     runs it like model.pt

Models:
    default  a small CNN using every op: customconv.nn.Conv2d layers (strided,
             grouped, dilated, padding="same"), a DepthwiseConv2d layer, a
             filter2d blur and a trilinear_interpolation head; one input batch.
    raw_ops  calls every torch.ops.customconv op directly; takes an image, a
             filter bank and points, returns a tuple of six tensors.
    mobilenet_v2, resnet18
             torchvision's model with random weights, converted by
             customconv.convert (needs torchvision; nothing is downloaded);
             one (2, 3, 64, 64) batch.
    resnet18_fused
             the same resnet18 in eval mode made by customconv.fuse: each
             BatchNorm2d folded into its convolution, the ReLUs and the residual
             adds fused (customconv::conv2d_fused); the reference is the unfused
             PyTorch model.

Before writing anything, the outputs are checked against PyTorch's own ops
(convolution, unfold, fold, padding) and the trilinear formula, so expected.pt holds the right numbers and not
merely the library's own; the package's outputs are checked against them too,
at the inputs' batch size and at another one.

The customconv package is found on PYTHONPATH, else in <repo>/python_stub; it
loads the library from CUSTOMCONV_LIBRARY or <repo>/build/libcustomconv.so.
"""

import argparse
import importlib
import sys
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple, Type

import torch
import torch.nn.functional as F
from torch import Tensor

PYTHON_PACKAGE_DIR = Path(__file__).resolve().parent.parent / "python_stub"

# How far the outputs may be from PyTorch's reference (float32, small sizes).
REFERENCE_RTOL = 1e-4
REFERENCE_ATOL = 1e-5
# ... and a package compiled for CUDA from the CPU's outputs: float32
# convolutions run in TF32 on GPUs that have it (PyTorch's default).
CUDA_PACKAGE_TOLERANCE = 1e-2


# ---------------------------------------------------------------- default


class DemoCNN(torch.nn.Module):
    """A small CNN that exercises every op: (N, 3, 32, 32) images -> (N, 13).

    Convolutions (strided, grouped, dilated, padding="same"), a depthwise layer
    with channel multiplier 2, a filter2d blur with reflected borders, a 1x1
    classifier giving 10 scores, and a trilinear head blending 8 pooled corner
    features (3 each) at 3 predicted coordinates: output = cat(scores, head).

    `reference=False` builds it from customconv (the model that is saved);
    `reference=True` builds its twin from PyTorch's own ops (same parameters).
    """

    def __init__(self, reference: bool = False):
        super().__init__()
        import customconv

        conv = torch.nn.Conv2d if reference else customconv.nn.Conv2d
        if reference:
            depthwise = torch.nn.Conv2d(16, 32, 5, padding=2, groups=16)
        else:
            depthwise = customconv.nn.DepthwiseConv2d(16, 32, 5, padding=2)
        self.reference = reference
        self.features = torch.nn.Sequential(
            conv(3, 16, 3, padding=1),
            torch.nn.ReLU(),
            conv(16, 32, 3, stride=2, padding=1),  # 32x32 -> 16x16
            torch.nn.ReLU(),
            conv(32, 32, 3, padding=1, groups=4),  # grouped
            torch.nn.ReLU(),
            conv(32, 32, 3, padding=2, dilation=2),  # dilated
            torch.nn.ReLU(),
            conv(32, 16, (3, 4), padding="same", bias=False),  # "same", asymmetric padding
            torch.nn.ReLU(),
            depthwise,  # depthwise, channel multiplier 2
            torch.nn.ReLU(),
        )
        self.register_buffer("blur", torch.tensor([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]) / 16)
        self.classifier = conv(32, 10, 1)

    def filter(self, x: Tensor) -> Tensor:
        if self.reference:
            planes = x.reshape(-1, 1, x.shape[-2], x.shape[-1])
            planes = F.conv2d(F.pad(planes, (1, 1, 1, 1), mode="reflect"), self.blur[None, None])
            return planes.reshape(x.shape)
        return torch.ops.customconv.filter2d(x, self.blur, "reflect")

    def trilinear(self, feats: Tensor, points: Tensor) -> Tensor:
        if self.reference:
            u, v, w = ((points + 1) / 2).unbind(1)
            out = torch.zeros_like(feats[:, 0])
            for i in range(2):
                for j in range(2):
                    for k in range(2):
                        wt = (u if i else 1 - u) * (v if j else 1 - v) * (w if k else 1 - w)
                        out = out + wt[:, None] * feats[:, 4 * i + 2 * j + k]
            return out
        return torch.ops.customconv.trilinear_interpolation(feats, points)

    def forward(self, x: Tensor) -> Tensor:
        x = self.filter(self.features(x))
        scores = self.classifier(x).mean(dim=(2, 3))
        pooled = x.mean(dim=(2, 3))  # (N, 32)
        feats = pooled[:, :24].reshape(-1, 8, 3)
        points = torch.tanh(pooled[:, 24:27])
        return torch.cat([scores, self.trilinear(feats, points)], dim=1)


def make_default() -> Tuple[torch.nn.Module, torch.nn.Module, List[Tensor]]:
    model = DemoCNN()
    reference = DemoCNN(reference=True)
    reference.load_state_dict(model.state_dict())
    inputs = [torch.randn(2, 3, 32, 32)]
    return model, reference, inputs


# ---------------------------------------------------------------- raw_ops


class RawOps(torch.nn.Module):
    """Every op called directly through torch.ops.customconv, several inputs,
    a tuple of outputs.

    forward(image (N, 3, H, W), filters (8, 3, 3, 3), points (N, 3)) returns
        features (N, 8, H, W)    conv2d, padding 1, plus a bias
        patches  (N, 8*3*3, L)   im2col of features: 3x3 patches, stride 2, padding 1
        folded   (N, 8, H, W)    col2im of patches: each pixel of features times
                                 the number of patches that cover it
        depth    (N, 16, H, W)   depthwise_conv2d of features, channel multiplier 2
        smooth   (N, 3, H, W)    filter2d of image, 5x5 kernel, replicated borders
        blend    (N, H*W)        trilinear_interpolation of the first 8 feature
                                 planes (as corners) at the points
    """

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(8))
        self.depthwise = torch.nn.Parameter(torch.randn(16, 1, 3, 3))
        self.kernel = torch.nn.Parameter(torch.randn(5, 5))

    def forward(self, image: Tensor, filters: Tensor, points: Tensor):
        features = torch.ops.customconv.conv2d(image, filters, self.bias, [1, 1], [1, 1], [1, 1], 1)
        patches = torch.ops.customconv.im2col(features, [3, 3], [2, 2], [1, 1], [1, 1])
        size = [features.shape[2], features.shape[3]]
        folded = torch.ops.customconv.col2im(patches, size, [3, 3], [2, 2], [1, 1], [1, 1])
        depth = torch.ops.customconv.depthwise_conv2d(
            features, self.depthwise, None, [1, 1], [1, 1], [1, 1])
        smooth = torch.ops.customconv.filter2d(image, self.kernel, "replicate")
        blend = torch.ops.customconv.trilinear_interpolation(features.flatten(2), points)
        return features, patches, folded, depth, smooth, blend


class RawOpsReference(torch.nn.Module):
    """RawOps with PyTorch's own ops and the trilinear formula."""

    def __init__(self, model: RawOps):
        super().__init__()
        self.bias = torch.nn.Parameter(model.bias.detach().clone())
        self.depthwise = torch.nn.Parameter(model.depthwise.detach().clone())
        self.kernel = torch.nn.Parameter(model.kernel.detach().clone())

    def forward(self, image: Tensor, filters: Tensor, points: Tensor):
        features = F.conv2d(image, filters, self.bias, 1, 1, 1, 1)
        patches = F.unfold(features, 3, dilation=1, padding=1, stride=2)
        folded = F.fold(patches, features.shape[2:], 3, dilation=1, padding=1, stride=2)
        depth = F.conv2d(features, self.depthwise, None, 1, 1, 1, 8)
        planes = image.reshape(-1, 1, image.shape[2], image.shape[3])
        smooth = F.conv2d(F.pad(planes, (2, 2, 2, 2), mode="replicate"), self.kernel[None, None])
        smooth = smooth.reshape(image.shape)
        blend = DemoCNN(reference=True).trilinear(features.flatten(2), points)
        return features, patches, folded, depth, smooth, blend


def make_raw_ops() -> Tuple[torch.nn.Module, torch.nn.Module, List[Tensor]]:
    model = RawOps()
    reference = RawOpsReference(model)
    inputs = [torch.randn(2, 3, 15, 17), torch.randn(8, 3, 3, 3), torch.rand(2, 3) * 2 - 1]
    return model, reference, inputs


# ---------------------------------------------------------------- torchvision


def make_torchvision(arch: str,
                     fuse: bool = False) -> Tuple[torch.nn.Module, torch.nn.Module, List[Tensor]]:
    """torchvision's `arch` with random weights (nothing is downloaded) and
    random batch-norm statistics, converted by customconv.convert (or, with
    `fuse`, set to eval mode and fused by customconv.fuse); the reference is the
    unconverted model."""
    import copy

    import customconv
    try:
        import torchvision
    except ImportError as e:
        raise SystemExit(f"make_model: the {arch} model needs torchvision ({e})") from e

    reference = getattr(torchvision.models, arch)(weights=None)
    with torch.no_grad():
        for m in reference.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features) + 0.5)
    if fuse:
        model = customconv.fuse(reference.eval())  # a fused copy; the reference stays as it is
    else:
        model = customconv.convert(copy.deepcopy(reference))
    inputs = [torch.randn(2, 3, 64, 64)]
    return model, reference, inputs


MODELS: Dict[str, Callable[[], Tuple[torch.nn.Module, torch.nn.Module, List[Tensor]]]] = {
    "default": make_default,
    "raw_ops": make_raw_ops,
    "mobilenet_v2": lambda: make_torchvision("mobilenet_v2"),
    "resnet18": lambda: make_torchvision("resnet18"),
    "resnet18_fused": lambda: make_torchvision("resnet18", fuse=True),
}


# ---------------------------------------------------------------- helpers


def import_customconv() -> None:
    """Imports customconv (which registers torch.ops.customconv.*), from
    PYTHONPATH or else from this repository's python_stub."""
    try:
        importlib.import_module("customconv")
    except ModuleNotFoundError as e:
        if e.name != "customconv":
            raise
        sys.path.insert(0, str(PYTHON_PACKAGE_DIR))
        try:
            importlib.import_module("customconv")
        except ImportError as e2:
            raise SystemExit(f"make_model: {e2}") from e2
    except ImportError as e:
        raise SystemExit(f"make_model: {e}") from e


def as_tensors(outputs) -> List[Tensor]:
    """A model's output (a tensor or a tuple of tensors) as a list of tensors."""
    if isinstance(outputs, Tensor):
        return [outputs]
    return list(outputs)


def standalone(t: Tensor) -> Tensor:
    """A contiguous CPU copy with its own storage (torch.save writes whole storages)."""
    return t.detach().to("cpu").contiguous().clone()


def check_against_reference(outputs: Sequence[Tensor], reference: Sequence[Tensor],
                            rtol: float = REFERENCE_RTOL, atol: float = REFERENCE_ATOL) -> None:
    if len(outputs) != len(reference):
        raise SystemExit(f"make_model: {len(outputs)} outputs, the reference has {len(reference)}")
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        if out.shape != ref.shape:
            raise SystemExit(
                f"make_model: output {i} has shape {tuple(out.shape)}, "
                f"the reference {tuple(ref.shape)}")
        if not torch.allclose(out, ref, rtol=rtol, atol=atol):
            err = (out - ref).abs().max().item()
            raise SystemExit(
                f"make_model: output {i} differs from PyTorch's reference "
                f"(max abs error {err:.3g})")


def batch_dims(inputs: Sequence[Tensor]):
    """dynamic_shapes for torch.export: dim 0 is the batch in every input whose
    dim 0 has the first input's size."""
    batch = torch.export.Dim("batch", min=1, max=1024)
    n = inputs[0].shape[0]
    return tuple({0: batch} if t.dim() > 0 and t.shape[0] == n else None for t in inputs)


def write_package(model: torch.nn.Module, inputs: List[Tensor], expected, device: torch.device,
                  path: Path) -> None:
    """Exports `model` with a dynamic batch, compiles it with AOTInductor for
    `device` into `path`, and checks the package: the expected outputs at the
    inputs' batch size, the eager model's at a batch one larger."""
    model = model.to(device)
    on_device = [t.to(device) for t in inputs]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        exported = torch.export.export(model, tuple(on_device), dynamic_shapes=batch_dims(inputs))
        torch._inductor.aoti_compile_and_package(exported, package_path=str(path))
        package = torch._inductor.aoti_load_package(str(path))
    tolerance = (CUDA_PACKAGE_TOLERANCE,) * 2 if device.type == "cuda" else ()
    with torch.no_grad():
        check_against_reference([t.cpu() for t in as_tensors(package(*on_device))],
                                as_tensors(expected), *tolerance)
        batch = inputs[0].shape[0]
        larger = [torch.cat([t, t[:1]]) if s is not None else t
                  for t, s in zip(on_device, batch_dims(inputs))]
        check_against_reference(as_tensors(package(*larger)), as_tensors(model(*larger)), *tolerance)
    print(f"  package:  {path.name} for {device.type}, checked at batch {batch} and {batch + 1}")


def describe(t: Tensor) -> str:
    return f"{list(t.shape)} {str(t.dtype).replace('torch.', '')}"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Write a TorchScript model using customconv ops, its inputs and its "
                    "expected outputs, for customconv_demo.")
    parser.add_argument("--out", required=True, type=Path,
                        help="directory to write model.pt, inputs.pt and expected.pt to")
    parser.add_argument("--model", choices=sorted(MODELS), default="default",
                        help="which model (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    parser.add_argument("--pt2", choices=("cpu", "cuda"),
                        help="also write model.pt2, an AOTInductor package for this device")
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    import_customconv()
    torch.manual_seed(args.seed)

    model, reference, inputs = MODELS[args.model]()
    model.eval()
    reference.eval()
    inputs = [standalone(t) for t in inputs]
    with warnings.catch_warnings():
        # Scripting a torch.fx GraphModule (customconv.fuse's models) warns about an
        # annotation in GraphModule.__init__ itself.
        warnings.filterwarnings("ignore", message="The TorchScript type system doesn't support")
        scripted = torch.jit.script(model)

    with torch.no_grad(), warnings.catch_warnings():
        # PyTorch's own conv warns that an even kernel with padding="same" pads a copy.
        warnings.filterwarnings("ignore", message="Using padding='same'")
        outputs = scripted(*inputs)
        check_against_reference(as_tensors(outputs), as_tensors(reference(*inputs)))

    if isinstance(outputs, Tensor):
        expected = standalone(outputs)
    else:
        expected = tuple(standalone(t) for t in outputs)

    args.out.mkdir(parents=True, exist_ok=True)
    scripted.save(str(args.out / "model.pt"))
    torch.save(inputs, args.out / "inputs.pt")
    torch.save(expected, args.out / "expected.pt")

    if args.pt2:
        write_package(model, inputs, expected, torch.device(args.pt2), args.out / "model.pt2")

    print(f"make_model: wrote the {args.model!r} model to {args.out}/")
    print("  inputs:   " + ", ".join(describe(t) for t in inputs))
    print("  expected: " + ", ".join(describe(t) for t in as_tensors(expected)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
