"""Shared helpers of the pytest suite: devices and dtypes, per-test seeds,
tensors in various memory layouts, random op configurations, the float64
references (PyTorch's own ops) and dtype-aware tolerances."""

import dataclasses
import hashlib
import random
from typing import Dict, Optional, Sequence, Tuple

import pytest
import torch
import torch.nn.functional as F

import customconv  # noqa: F401  (loads the library: torch.ops.customconv.*)

ops = torch.ops.customconv

# ---------------------------------------------------------------- devices, dtypes

#: Marks a test (or a parameter) that needs a CUDA device; conftest.py skips it
#: when torch.cuda.is_available() is False.
cuda = pytest.mark.cuda

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=cuda)]

CPU_DTYPES = (torch.float32, torch.float64, torch.bfloat16)
CUDA_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

_SHORT = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16"}


def dtype_name(dtype: torch.dtype) -> str:
    return _SHORT[dtype]


#: Every (device, dtype) pair the library supports, as pytest parameters.
DEVICE_DTYPES = [pytest.param("cpu", dt, id=f"cpu-{_SHORT[dt]}") for dt in CPU_DTYPES] + [
    pytest.param("cuda", dt, id=f"cuda-{_SHORT[dt]}", marks=cuda) for dt in CUDA_DTYPES
]


def sync(device: str) -> None:
    """Waits for the device, so that asynchronous CUDA errors surface here."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


# ---------------------------------------------------------------- seeds


def seed_for(key: str) -> int:
    """A stable 31-bit seed for a test id (the same on every machine and run)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little") & 0x7FFFFFFF


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- tensors

#: Memory layouts a tensor argument is made in (all hold the same kind of values).
LAYOUTS = ("contiguous", "channels_last", "transposed", "sliced", "expanded")


def make_tensor(
    shape: Sequence[int],
    dtype: torch.dtype,
    device: str,
    layout: str = "contiguous",
    gen: Optional[torch.Generator] = None,
    requires_grad: bool = False,
) -> torch.Tensor:
    """Standard-normal values (never all zeros or ones) of `shape`, rounded to
    `dtype`, on `device`, with the given memory layout:

    contiguous     row-major
    channels_last  dim -3 innermost in memory (torch.channels_last for 4-D)
    transposed     the last two dims swapped in memory (a .transpose view)
    sliced         a strided slice of a larger tensor (storage offset, step 2)
    expanded       dim 0 broadcast from size 1 (stride 0), when dim 0 > 1
    """
    shape = tuple(int(s) for s in shape)
    nd = len(shape)
    if nd < 2 or (layout == "channels_last" and nd < 3):
        layout = "transposed" if nd >= 2 and layout != "contiguous" else "contiguous"
    if layout == "expanded" and shape[0] <= 1:
        layout = "sliced"
    if layout == "contiguous":
        base_shape, view = shape, lambda t: t
    elif layout == "channels_last":
        base_shape = shape[:-3] + shape[-2:] + shape[-3:-2]
        view = lambda t: t.movedim(-1, -3)  # noqa: E731
    elif layout == "transposed":
        base_shape = shape[:-2] + (shape[-1], shape[-2])
        view = lambda t: t.transpose(-1, -2)  # noqa: E731
    elif layout == "sliced":
        base_shape = shape[:-2] + (shape[-2] + 1, 2 * shape[-1] + 1)
        view = lambda t: t[..., 1:, 1::2]  # noqa: E731
    elif layout == "expanded":
        base_shape = (1,) + shape[1:]
        view = lambda t: t.expand(shape)  # noqa: E731
    else:
        raise ValueError(f"unknown layout {layout!r}")
    base = torch.randn(base_shape, generator=gen, dtype=torch.float64).to(dtype).to(device)
    t = view(base)
    assert t.shape == shape, (t.shape, shape, layout)
    return t.detach().requires_grad_(requires_grad)


def f64(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The same values in float64 on the CPU, contiguous (the reference's input).
    Contiguous on purpose: PyTorch's own CPU conv2d weight gradient is wrong for
    some channels_last-strided inputs with grouped 1x1 weights (torch 2.11), and
    the reference must be the plain math."""
    return None if t is None else t.detach().to("cpu", torch.float64).contiguous()


# ---------------------------------------------------------------- tolerances

# Unit roundoff of each dtype (half an ulp at 1.0).
_UNIT_ROUNDOFF = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
}


def tolerance_factor(dtype: torch.dtype, reduction: int) -> float:
    """Relative error allowed against the sum of |terms| of each output element:
    a few roundings to `dtype` plus `reduction` additions in the accumulation
    type (float32 for float16 / bfloat16, as the design requires)."""
    acc = _UNIT_ROUNDOFF[torch.float64 if dtype == torch.float64 else torch.float32]
    return 4.0 * (_UNIT_ROUNDOFF[dtype] + max(reduction, 1) * acc)


def assert_matches(
    actual: torch.Tensor,
    expected: torch.Tensor,
    bound: torch.Tensor,
    dtype: torch.dtype,
    reduction: int,
    what: str,
    ctx: str,
    device: Optional[str] = None,
) -> None:
    """Checks `actual` against the float64 `expected`, element by element, with
    tolerance tolerance_factor(dtype, reduction) * bound, where `bound` is the
    same computation on absolute values (sum of |terms|), so the tolerance
    scales with each element's magnitude and cancellation is no excuse."""
    assert isinstance(actual, torch.Tensor), f"{what}: got {type(actual)} [{ctx}]"
    assert actual.dtype == dtype, f"{what}: dtype {actual.dtype}, expected {dtype} [{ctx}]"
    if device is not None:
        assert actual.device.type == torch.device(device).type, (
            f"{what}: on {actual.device}, expected {device} [{ctx}]"
        )
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)} [{ctx}]"
    )
    if expected.numel() == 0:
        return
    got = f64(actual)
    factor = tolerance_factor(dtype, reduction)
    tol = factor * bound + factor * 1e-6 * float(bound.max())
    err = (got - expected).abs()
    bad = ~(err <= tol)  # NaN counts as bad
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{what} differs from the reference [{ctx}]: {int(bad.sum())} of {bad.numel()} "
            f"elements out of tolerance; first at {idx}: got {float(got[idx])!r}, "
            f"expected {float(expected[idx])!r}, tolerance {float(tol[idx]):.3g}; "
            f"max abs error {float(err.nan_to_num(float('inf')).max()):.3g}"
        )


def assert_exact(actual: torch.Tensor, expected: torch.Tensor, what: str, ctx: str) -> None:
    """Bitwise-equal values (for pure data movement such as im2col)."""
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)} [{ctx}]"
    )
    got = f64(actual)
    if not torch.equal(got, expected):
        diff = (got - expected).abs()
        idx = tuple(int(i) for i in (diff != 0).nonzero()[0])
        raise AssertionError(
            f"{what} is not an exact copy of the reference [{ctx}]: "
            f"{int((diff != 0).sum())} elements differ; first at {idx}: got {float(got[idx])!r}, "
            f"expected {float(expected[idx])!r}"
        )


# ---------------------------------------------------------------- conv2d configs


def _pair(rng: random.Random, lo: int, hi: int, square: float = 0.4) -> Tuple[int, int]:
    a = rng.randint(lo, hi)
    return (a, a) if rng.random() < square else (a, rng.randint(lo, hi))


def _extent(k: int, d: int) -> int:
    return d * (k - 1) + 1


def _out_len(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - _extent(k, d)) // s + 1


@dataclasses.dataclass(frozen=True)
class ConvConfig:
    batch: Optional[int]  # None: unbatched (C, H, W) input
    in_channels: int
    out_channels: int
    groups: int
    kernel: Tuple[int, int]
    stride: Tuple[int, int]
    padding: Tuple[int, int]
    dilation: Tuple[int, int]
    size: Tuple[int, int]
    bias: bool
    input_layout: str = "contiguous"
    weight_layout: str = "contiguous"
    grad_layout: str = "contiguous"

    @property
    def input_shape(self) -> Tuple[int, ...]:
        chw = (self.in_channels,) + self.size
        return chw if self.batch is None else (self.batch,) + chw

    @property
    def weight_shape(self) -> Tuple[int, ...]:
        return (self.out_channels, self.in_channels // self.groups) + self.kernel

    @property
    def output_size(self) -> Tuple[int, int]:
        return tuple(
            _out_len(self.size[a], self.kernel[a], self.stride[a], self.padding[a], self.dilation[a])
            for a in (0, 1)
        )

    @property
    def output_shape(self) -> Tuple[int, ...]:
        chw = (self.out_channels,) + self.output_size
        return chw if self.batch is None else (self.batch,) + chw

    def args(self):
        """The op's int arguments after (input, weight, bias)."""
        return list(self.stride), list(self.padding), list(self.dilation), self.groups


def random_conv2d_config(rng: random.Random, **fixed) -> ConvConfig:
    """A random valid conv2d configuration; keyword arguments pin fields.
    Covers groups == 1, grouped with several output channels per group,
    depthwise (groups == C, with a channel multiplier), non-square kernels,
    stride / padding / dilation per axis, batch 0 and 1, unbatched input and
    non-contiguous layouts of input, weight and grad_output."""
    kind = fixed.pop("kind", None) or rng.choice(["plain", "plain", "grouped", "depthwise"])
    if kind == "plain":
        groups, cin_g, kout_g = 1, rng.randint(1, 5), rng.randint(1, 5)
    elif kind == "grouped":
        groups, cin_g, kout_g = rng.randint(2, 3), rng.randint(1, 3), rng.randint(1, 3)
    else:  # depthwise: one input channel per group, multiplier kout_g
        groups, cin_g, kout_g = rng.randint(2, 5), 1, rng.randint(1, 3)
    groups = fixed.pop("groups", groups)
    in_channels = fixed.pop("in_channels", groups * cin_g)
    out_channels = fixed.pop("out_channels", groups * kout_g)
    kernel = fixed.pop("kernel", _pair(rng, 1, 4))
    stride = fixed.pop("stride", _pair(rng, 1, 3, square=0.5))
    dilation = fixed.pop("dilation", _pair(rng, 1, 3, square=0.5) if rng.random() < 0.6 else (1, 1))
    padding = fixed.pop("padding", _pair(rng, 0, 3, square=0.5) if rng.random() < 0.7 else (0, 0))
    size = fixed.pop(
        "size",
        tuple(
            max(1, _extent(kernel[a], dilation[a]) - 2 * padding[a]) + rng.randint(0, 6)
            for a in (0, 1)
        ),
    )
    r = rng.random()
    batch = fixed.pop("batch", None if r < 0.15 else (0 if r < 0.2 else rng.choice([1, 2, 3])))
    bias = fixed.pop("bias", rng.random() < 0.7)
    layout = lambda: rng.choice(("contiguous",) * 2 + LAYOUTS[1:])  # noqa: E731
    cfg = ConvConfig(
        batch=batch, in_channels=in_channels, out_channels=out_channels, groups=groups,
        kernel=tuple(kernel), stride=tuple(stride), padding=tuple(padding),
        dilation=tuple(dilation), size=tuple(size), bias=bias,
        input_layout=fixed.pop("input_layout", layout()),
        weight_layout=fixed.pop("weight_layout", layout()),
        grad_layout=fixed.pop("grad_layout", layout()),
    )
    assert not fixed, f"unknown config fields {sorted(fixed)}"
    assert min(cfg.output_size) >= 1, cfg
    return cfg


def conv2d_reference(cfg: ConvConfig, x, w, b, grad) -> Dict[str, Tuple[torch.Tensor, torch.Tensor]]:
    """F.conv2d in float64 on the CPU on the same values: for the output and
    the gradients of input, weight (and bias), (expected, bound), bound being
    the same computation on absolute values."""
    stride, padding, dilation, groups = cfg.args()
    conv = lambda i, k, c: F.conv2d(i, k, c, stride, padding, dilation, groups)  # noqa: E731
    x64, w64, b64, g64 = f64(x), f64(w), f64(b), f64(grad)
    xr, wr = x64.clone().requires_grad_(), w64.clone().requires_grad_()
    br = None if b64 is None else b64.clone().requires_grad_()
    out = conv(xr, wr, br)
    inputs = [xr, wr] + ([br] if br is not None else [])
    grads = torch.autograd.grad(out, inputs, g64) if g64 is not None else [None] * len(inputs)

    xa, wa = x64.abs().requires_grad_(), w64.abs().requires_grad_()
    out_b = conv(xa, wa, None if b64 is None else b64.abs())
    res = {"output": (out.detach(), out_b.detach())}
    if g64 is not None:
        gxa, gwa = torch.autograd.grad(out_b, [xa, wa], g64.abs())
        res["grad_input"] = (grads[0], gxa)
        res["grad_weight"] = (grads[1], gwa)
        if br is not None:
            dims = [d for d in range(g64.dim()) if d != g64.dim() - 3]
            res["grad_bias"] = (grads[2], g64.abs().sum(dims))
    return res


def conv2d_reductions(cfg: ConvConfig) -> Dict[str, int]:
    """Length of the sums behind each result (for the tolerance)."""
    kh, kw = cfg.kernel
    oh, ow = cfg.output_size
    n = 1 if cfg.batch is None else cfg.batch
    return {
        "output": (cfg.in_channels // cfg.groups) * kh * kw + 1,
        "grad_input": (cfg.out_channels // cfg.groups) * kh * kw,
        "grad_weight": n * oh * ow,
        "grad_bias": n * oh * ow,
    }


# ---------------------------------------------------------------- im2col / col2im configs


@dataclasses.dataclass(frozen=True)
class WindowConfig:
    batch: Optional[int]  # None: unbatched ((C, H, W) images, (C*kh*kw, L) columns)
    channels: int
    kernel: Tuple[int, int]
    stride: Tuple[int, int]
    padding: Tuple[int, int]
    dilation: Tuple[int, int]
    size: Tuple[int, int]  # image (H, W): im2col's input, col2im's output_size
    layout: str = "contiguous"  # of the op's tensor argument
    grad_layout: str = "contiguous"

    @property
    def image_shape(self) -> Tuple[int, ...]:
        chw = (self.channels,) + self.size
        return chw if self.batch is None else (self.batch,) + chw

    @property
    def positions(self) -> int:
        oh, ow = (
            _out_len(self.size[a], self.kernel[a], self.stride[a], self.padding[a], self.dilation[a])
            for a in (0, 1)
        )
        return oh * ow

    @property
    def columns_shape(self) -> Tuple[int, ...]:
        rl = (self.channels * self.kernel[0] * self.kernel[1], self.positions)
        return rl if self.batch is None else (self.batch,) + rl

    @property
    def overlap(self) -> int:
        """A bound on the window entries that read one image element (col2im's sum length)."""
        return self.kernel[0] * self.kernel[1]


def random_window_config(rng: random.Random, **fixed) -> WindowConfig:
    """A random valid im2col / col2im geometry; keyword arguments pin fields."""
    kernel = fixed.pop("kernel", _pair(rng, 1, 4))
    stride = fixed.pop("stride", _pair(rng, 1, 3, square=0.5))
    dilation = fixed.pop("dilation", _pair(rng, 1, 3, square=0.5) if rng.random() < 0.6 else (1, 1))
    padding = fixed.pop("padding", _pair(rng, 0, 3, square=0.5) if rng.random() < 0.7 else (0, 0))
    size = fixed.pop(
        "size",
        tuple(
            max(1, _extent(kernel[a], dilation[a]) - 2 * padding[a]) + rng.randint(0, 7)
            for a in (0, 1)
        ),
    )
    r = rng.random()
    batch = fixed.pop("batch", None if r < 0.15 else (0 if r < 0.2 else rng.choice([1, 2, 3])))
    layout = lambda: rng.choice(("contiguous",) * 2 + LAYOUTS[1:])  # noqa: E731
    cfg = WindowConfig(
        batch=batch, channels=fixed.pop("channels", rng.randint(1, 4)), kernel=tuple(kernel),
        stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation),
        size=tuple(size), layout=fixed.pop("layout", layout()),
        grad_layout=fixed.pop("grad_layout", layout()),
    )
    assert not fixed, f"unknown config fields {sorted(fixed)}"
    assert cfg.positions >= 1, cfg
    return cfg


def unfold_args(cfg: WindowConfig) -> dict:
    return dict(kernel_size=cfg.kernel, dilation=cfg.dilation, padding=cfg.padding,
                stride=cfg.stride)


# ---------------------------------------------------------------- a small known-good call


def check_small_conv2d(device: str, dtype: torch.dtype = torch.float32) -> None:
    """One ordinary conv2d (forward and backward) that must give right results:
    run after an error to show the device is still usable."""
    gen = generator(1234)
    cfg = ConvConfig(batch=2, in_channels=4, out_channels=6, groups=2, kernel=(3, 2),
                     stride=(1, 2), padding=(1, 1), dilation=(1, 1), size=(6, 7), bias=True)
    x = make_tensor(cfg.input_shape, dtype, device, gen=gen, requires_grad=True)
    w = make_tensor(cfg.weight_shape, dtype, device, gen=gen, requires_grad=True)
    b = make_tensor((cfg.out_channels,), dtype, device, gen=gen, requires_grad=True)
    out = ops.conv2d(x, w, b, *cfg.args())
    g = make_tensor(out.shape, dtype, device, gen=gen)
    grads = torch.autograd.grad(out, (x, w, b), g)
    sync(device)
    ref = conv2d_reference(cfg, x, w, b, g)
    red = conv2d_reductions(cfg)
    for name, got in zip(("output", "grad_input", "grad_weight", "grad_bias"), (out,) + grads):
        assert_matches(got, *ref[name], dtype, red[name], name, f"follow-up call on {device}")

