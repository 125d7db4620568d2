"""Shared helpers of the pytest suite: devices and dtypes, per-test seeds,
tensors in various memory layouts, random op configurations, the float64
references (PyTorch's own ops, or the op's formula written in PyTorch) and
dtype-aware tolerances."""

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


def cuda_extra_bytes(fn):
    """fn()'s result, and the peak memory its call allocated beyond the result,
    in bytes, on the current CUDA device (an earlier call warms the caching
    allocator)."""
    fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    return out, torch.cuda.max_memory_allocated() - before - out.numel() * out.element_size()


def kernels_launched(fn) -> str:
    """The names of the CUDA kernels fn() launches, one string (to check which
    route a call takes)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return " ".join(e.name for e in prof.events())


def run_profiled_cuda(fn, tf32: Optional[bool] = None):
    """fn's result and the names of the CUDA kernels it ran (none where the
    profiler saw no kernel: under compute-sanitizer); with `tf32` given,
    PyTorch's TF32 policy for convolutions set to it for the call."""
    saved = torch.backends.cudnn.allow_tf32
    if tf32 is not None:
        torch.backends.cudnn.allow_tf32 = tf32
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out = fn()
            torch.cuda.synchronize()
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    return out, [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


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
#: ... and "offset" too, for the direct kernels (which may load vectors).
DIRECT_LAYOUTS = LAYOUTS + ("offset",)


def per_thread_count(fn, counts=(1, 2)):
    """[fn() with ATen's intra-op thread count set to each of `counts`], the
    process's count restored afterwards."""
    saved = torch.get_num_threads()
    try:
        results = []
        for threads in counts:
            torch.set_num_threads(threads)
            results.append(fn())
        return results
    finally:
        torch.set_num_threads(saved)


def make_tensor(
    shape: Sequence[int],
    dtype: torch.dtype,
    device: str,
    layout: str = "contiguous",
    gen: Optional[torch.Generator] = None,
    requires_grad: bool = False,
    uniform: Optional[Tuple[float, float]] = None,
    map_values=None,
) -> torch.Tensor:
    """Standard-normal values (never all zeros or ones; uniform in
    [uniform[0], uniform[1]) when given; then passed through `map_values`, a
    function of a float64 tensor, when given) of `shape`, rounded to `dtype`,
    on `device`, with the given memory layout:

    contiguous     row-major
    channels_last  dim -3 innermost in memory (torch.channels_last for 4-D)
    transposed     the last two dims swapped in memory (a .transpose view)
    sliced         a strided slice of a larger tensor (storage offset, step 2)
    expanded       dim 0 broadcast from size 1 (stride 0), when dim 0 > 1
    offset         row-major, but one element past the start of its storage
                   (contiguous, data pointer not aligned to a vector width)
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
    elif layout == "offset":
        base_shape = (1 + _numel(shape),)
        view = lambda t: t[1:].view(shape)  # noqa: E731
    else:
        raise ValueError(f"unknown layout {layout!r}")
    if uniform is None:
        values = torch.randn(base_shape, generator=gen, dtype=torch.float64)
    else:
        lo, hi = uniform
        values = torch.rand(base_shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo
    if map_values is not None:
        values = map_values(values)
    base = values.to(dtype).to(device)
    t = view(base)
    assert t.shape == shape, (t.shape, shape, layout)
    return t.detach().requires_grad_(requires_grad)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


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
    nonfinite: Optional[str] = None,
) -> None:
    """Checks `actual` against the float64 `expected`, element by element, with
    tolerance tolerance_factor(dtype, reduction) * bound, where `bound` is the
    same computation on absolute values (sum of |terms|), so the tolerance
    scales with each element's magnitude and cancellation is no excuse.

    With `nonfinite`, `expected` may hold NaN and +-Inf; the tolerance applies
    to its finite elements, where `actual` must be finite too, and
      "exact":     `actual` holds NaN where `expected` does, Inf of the same
                   sign where `expected` does;
      "inf_or_nan": the same, except that NaN may stand for an Inf (for sums
                   whose order decides between Inf and NaN: Inf * (a + b) is
                   Inf where Inf * a + Inf * b with a > 0 > b is NaN)."""
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
    if nonfinite:
        assert nonfinite in ("exact", "inf_or_nan"), nonfinite
        loose = nonfinite == "inf_or_nan"
        for kind, test in (("NaN", torch.isnan), ("+Inf", torch.isposinf), ("-Inf", torch.isneginf),
                           ("a non-finite value", lambda t: ~torch.isfinite(t))):
            differ = test(got) != test(expected)
            if loose and kind != "a non-finite value":
                # Only NaN where expected is Inf is allowed.
                differ &= ~(torch.isinf(expected) & torch.isnan(got))
            if bool(differ.any()):
                idx = tuple(int(i) for i in differ.nonzero()[0])
                raise AssertionError(
                    f"{what}: {kind} not where the reference has it [{ctx}]: {int(differ.sum())} "
                    f"of {differ.numel()} elements; first at {idx}: got {float(got[idx])!r}, "
                    f"expected {float(expected[idx])!r}"
                )
        finite = torch.isfinite(expected)
        got, expected = torch.where(finite, got, 0.0), torch.where(finite, expected, 0.0)
        bound = torch.where(finite, bound, 0.0)
    factor = tolerance_factor(dtype, reduction)
    # Results that round into the dtype's subnormal range lose relative
    # precision: allow half a subnormal step on top (5.96e-8 / 2 for float16).
    finfo = torch.finfo(dtype)
    subnormal_step = finfo.smallest_normal * finfo.eps
    tol = factor * bound + factor * 1e-6 * float(bound.max()) + subnormal_step / 2
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


# Unit roundoff of TF32 (10 explicit mantissa bits), for float32 products that
# PyTorch's TF32 policy lets the device round to TF32.
TF32_ROUNDOFF = 2.0 ** -11


def conv2d_gradients_and_bounds(go, x, w, stride=1):
    """F.conv2d's grad_input and grad_weight for grad_output `go`, in float64,
    and the same on absolute values (each element's sum of |terms|, the
    bound assert_matches takes): ((gi, gw), (gi_bound, gw_bound))."""
    out = []
    for f in (lambda t: t.double(), lambda t: t.double().abs()):
        x64, w64 = f(x).requires_grad_(), f(w).requires_grad_()
        out.append(torch.autograd.grad(torch.nn.functional.conv2d(x64, w64, None, stride), (x64, w64), f(go)))
    return tuple(out)


def assert_float32_conv2d_matches(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                                  b: Optional[torch.Tensor], tf32: bool, ctx: str) -> None:
    """A float32 conv2d result (stride 1, no padding, one group: the pointwise
    layers' tests) against F.conv2d in float64: within 4 TF32 roundings of
    the sum of |terms| where `tf32`, else within float32's tolerance
    (assert_matches)."""
    bd = None if b is None else b.double()
    want = F.conv2d(x.double(), w.double(), bd)
    bound = F.conv2d(x.double().abs(), w.double().abs(), None if b is None else bd.abs())
    if tf32:
        err = (got.double() - want).abs()
        assert bool((err <= 4 * TF32_ROUNDOFF * bound + 1e-30).all()), f"{ctx}: max err {err.max().item()}"
    else:
        reduction = w.shape[1] * w.shape[2] * w.shape[3]
        assert_matches(got, want.cpu(), bound.cpu(), torch.float32, reduction, "output", ctx,
                       device=str(got.device.type))


# ---------------------------------------------------------------- conv2d configs


def _pair(rng: random.Random, lo: int, hi: int, square: float = 0.4) -> Tuple[int, int]:
    a = rng.randint(lo, hi)
    return (a, a) if rng.random() < square else (a, rng.randint(lo, hi))


def _extent(k: int, d: int) -> int:
    return d * (k - 1) + 1


def _out_len(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - _extent(k, d)) // s + 1


def random_hopper_window(rng: random.Random, rows: Sequence[int], cols: Sequence[int], size_slack: int):
    """(kernel, stride, dilation, padding, size) per axis for the Hopper
    forwards' random tests: kernel sides drawn from `rows` and `cols` (the two
    swapped half the time), strides mostly 1 (up to 3), dilations 1 or 2,
    paddings up to half the dilated window, and planes up to `size_slack`
    larger than the dilated window."""
    kernel = (rng.choice(rows), rng.choice(cols))
    if rng.random() < 0.5:
        kernel = kernel[::-1]
    stride = tuple(rng.choice([1, 1, 2, 3]) for _ in range(2))
    dilation = tuple(rng.choice([1, 1, 2]) for _ in range(2))
    padding = tuple(rng.randint(0, (k - 1) * d // 2 + 1) for k, d in zip(kernel, dilation))
    size = tuple(_extent(k, d) + rng.randint(0, size_slack) for k, d in zip(kernel, dilation))
    return kernel, stride, dilation, padding, size


def _random_geometry(rng: random.Random, fixed: dict, size_slack: int):
    """Kernel, stride, dilation, padding, input size (at least the dilated
    kernel's extent less the padding, plus up to `size_slack`) and batch (None:
    unbatched) of a sliding window, each popped from `fixed` where pinned there.
    The random draws are made whether or not a field is pinned, so that pinning
    one field leaves the others as they were."""
    kernel = fixed.pop("kernel", _pair(rng, 1, 4))
    stride = fixed.pop("stride", _pair(rng, 1, 3, square=0.5))
    dilation = fixed.pop("dilation", _pair(rng, 1, 3, square=0.5) if rng.random() < 0.6 else (1, 1))
    padding = fixed.pop("padding", _pair(rng, 0, 3, square=0.5) if rng.random() < 0.7 else (0, 0))
    size = fixed.pop(
        "size",
        tuple(
            max(1, _extent(kernel[a], dilation[a]) - 2 * padding[a]) + rng.randint(0, size_slack)
            for a in (0, 1)
        ),
    )
    r = rng.random()
    batch = fixed.pop("batch", None if r < 0.15 else (0 if r < 0.2 else rng.choice([1, 2, 3])))
    return kernel, stride, dilation, padding, size, batch


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
    kernel, stride, dilation, padding, size, batch = _random_geometry(rng, fixed, size_slack=6)
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


def float64_reference(
    fn, inputs: Dict[str, Optional[torch.Tensor]], grad: Optional[torch.Tensor], bounds: bool = True
) -> Dict[str, Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """`fn(**inputs)` (PyTorch's own ops) in float64 on the CPU on the same
    values, and its gradients for `grad`: {"output": (expected, bound)} and
    {"grad_<name>": (expected, bound)} for each input that is not None, bound
    being the same computation on absolute values (sum of |terms|; None
    without `bounds`)."""
    names = [n for n, t in inputs.items() if t is not None]

    def run(transform):
        leaves = {n: transform(f64(t)).requires_grad_() for n, t in inputs.items() if t is not None}
        out = fn(**{n: leaves.get(n) for n in inputs})
        if grad is None:
            return out.detach(), {}
        grads = torch.autograd.grad(out, [leaves[n] for n in names], transform(f64(grad)),
                                    allow_unused=True, materialize_grads=True)
        return out.detach(), dict(zip(names, grads))

    out, grads = run(lambda t: t.clone())
    out_b, grads_b = run(torch.abs) if bounds else (None, {})
    res = {"output": (out, out_b)}
    for n in grads:
        res["grad_" + n] = (grads[n], grads_b.get(n))
    return res


def conv2d_reference(cfg: ConvConfig, x, w, b, grad) -> Dict[str, Tuple[torch.Tensor, torch.Tensor]]:
    """F.conv2d in float64 on the CPU on the same values: for the output and
    the gradients of input, weight (and bias), (expected, bound), bound being
    the same computation on absolute values."""
    stride, padding, dilation, groups = cfg.args()

    def conv(input, weight, bias):
        return F.conv2d(input, weight, bias, stride, padding, dilation, groups)

    return float64_reference(conv, dict(input=x, weight=w, bias=b), grad)


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
    kernel, stride, dilation, padding, size, batch = _random_geometry(rng, fixed, size_slack=7)
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


# ---------------------------------------------------------------- depthwise_conv2d configs


def _kernel_size(rng: random.Random, largest: int = 31, odd: bool = False) -> Tuple[int, int]:
    """A kernel size up to `largest` per axis: mostly small, often medium,
    sometimes large; square or not."""
    r = rng.random()
    lo, hi = (1, 5) if r < 0.55 else ((6, 12) if r < 0.8 else (13, largest))
    kh, kw = _pair(rng, lo, hi, square=0.35)
    if rng.random() < 0.25:  # one axis from another size class (31 x 1, 3 x 17, ...)
        kw = rng.randint(1, largest)
    if odd:
        kh, kw = kh | 1, kw | 1
    return min(kh, largest), min(kw, largest)


def random_depthwise_config(rng: random.Random, **fixed) -> ConvConfig:
    """A random valid depthwise_conv2d configuration, as a ConvConfig with
    groups == in_channels (so conv2d_reference / conv2d_reductions apply):
    channel multipliers 1-4, kernels 1x1 to 31x31 (square or not), stride,
    dilation and padding per axis, batch 0/1/several or unbatched, every
    layout of input, weight and grad_output. Keyword arguments pin fields
    (`channels` and `multiplier` as well as ConvConfig's)."""
    channels = fixed.pop("channels", rng.randint(1, 5))
    multiplier = fixed.pop("multiplier", rng.randint(1, 4))
    kernel = tuple(fixed.pop("kernel", _kernel_size(rng)))
    large = max(kernel) > 8
    if "dilation" not in fixed:
        fixed["dilation"] = ((1, 1) if large and rng.random() < 0.7
                             else (_pair(rng, 1, 3, square=0.5) if rng.random() < 0.6 else (1, 1)))
    if "padding" not in fixed and large:
        fixed["padding"] = (rng.randint(0, kernel[0] // 2), rng.randint(0, kernel[1] // 2))
    layout = lambda: rng.choice(("contiguous",) * 2 + DIRECT_LAYOUTS[1:])  # noqa: E731
    for name in ("input_layout", "weight_layout", "grad_layout"):
        fixed.setdefault(name, layout())
    return random_conv2d_config(rng, kind="depthwise", groups=channels, in_channels=channels,
                                out_channels=channels * multiplier, kernel=kernel, **fixed)


# ---------------------------------------------------------------- filter2d configs

BORDERS = ("zeros", "reflect", "replicate", "circular")
_PAD_MODE = {"zeros": "constant", "reflect": "reflect", "replicate": "replicate",
             "circular": "circular"}


def min_plane_size(border: str, k: int) -> int:
    """The smallest plane side that `border` allows with a kernel of size k
    along it (what F.pad allows: reflect padding < size, circular padding <= size)."""
    pad = k // 2
    if border == "reflect":
        return pad + 1
    if border == "circular":
        return max(1, pad)
    return 1


@dataclasses.dataclass(frozen=True)
class FilterConfig:
    lead: Tuple[int, ...]  # the leading dims of the input (..., H, W); () for a single plane
    size: Tuple[int, int]  # the plane (H, W)
    kernel: Tuple[int, int]  # (kh, kw), both odd
    border: str
    input_layout: str = "contiguous"
    kernel_layout: str = "contiguous"
    grad_layout: str = "contiguous"

    @property
    def input_shape(self) -> Tuple[int, ...]:
        return self.lead + self.size

    @property
    def planes(self) -> int:
        return _numel(self.lead)


def random_filter2d_config(rng: random.Random, **fixed) -> FilterConfig:
    """A random valid filter2d configuration; keyword arguments pin fields.
    Covers every border, odd kernels 1x1 to 31x31 (square or not), planes
    smaller than the kernel where the border allows it, leading dims none /
    one / several / zero-sized and every layout of input, kernel and grad."""
    border = fixed.pop("border", rng.choice(BORDERS))
    kernel = tuple(fixed.pop("kernel", _kernel_size(rng, odd=True)))
    if "size" in fixed:
        size = tuple(fixed.pop("size"))
    else:
        size = []
        for k in kernel:
            lo = min_plane_size(border, k)
            r = rng.random()
            if r < 0.3:  # at or near the smallest plane the border allows
                size.append(lo + rng.randint(0, 2))
            elif r < 0.5:  # smaller than the kernel (and a tiny plane), where allowed
                size.append(rng.randint(lo, max(lo, k - 1)))
            else:
                size.append(max(lo, rng.randint(1, 12)) + rng.randint(0, 8))
        size = tuple(size)
    r = rng.random()
    if r < 0.2:
        lead = ()
    elif r < 0.45:
        lead = (rng.randint(1, 4),)
    elif r < 0.9:
        lead = tuple(rng.randint(1, 3) for _ in range(rng.randint(2, 3)))
    else:
        lead = tuple(rng.randint(0, 2) for _ in range(rng.randint(1, 3)))
        lead = lead[:-1] + (0,) if 0 not in lead else lead
    lead = tuple(fixed.pop("lead", lead))
    layout = lambda: rng.choice(("contiguous",) * 2 + DIRECT_LAYOUTS[1:])  # noqa: E731
    cfg = FilterConfig(lead=lead, size=size, kernel=kernel, border=border,
                       input_layout=fixed.pop("input_layout", layout()),
                       kernel_layout=fixed.pop("kernel_layout", layout()),
                       grad_layout=fixed.pop("grad_layout", layout()))
    assert not fixed, f"unknown config fields {sorted(fixed)}"
    assert all(k % 2 == 1 for k in cfg.kernel), cfg
    assert all(s >= min_plane_size(border, k) for s, k in zip(cfg.size, cfg.kernel)), cfg
    return cfg


def filter2d_torch(input: torch.Tensor, kernel: torch.Tensor, border: str) -> torch.Tensor:
    """filter2d written with PyTorch's ops: every plane padded by F.pad, then a
    valid correlation by F.conv2d."""
    h, w = input.shape[-2:]
    kh, kw = kernel.shape
    planes = input.reshape(-1, 1, h, w)
    padded = F.pad(planes, (kw // 2, kw // 2, kh // 2, kh // 2), mode=_PAD_MODE[border])
    return F.conv2d(padded, kernel[None, None]).reshape(input.shape)


def filter2d_reference(cfg: FilterConfig, x, k, grad) -> Dict[str, Tuple[torch.Tensor, torch.Tensor]]:
    """filter2d_torch in float64: output, grad_input and grad_kernel with bounds."""
    return float64_reference(lambda input, kernel: filter2d_torch(input, kernel, cfg.border),
                             dict(input=x, kernel=k), grad)


def filter2d_reductions(cfg: FilterConfig) -> Dict[str, int]:
    """Length of the sums behind each result (for the tolerance)."""
    kh, kw = cfg.kernel

    def copies(k: int, size: int) -> int:
        # Padded positions per axis that read one input sample: itself, and its
        # mirror / wrapped images (reflect, circular) or the whole border
        # (replicate, at the edge); each is read by at most k taps.
        per_border = {"zeros": 1, "reflect": 3, "circular": 3, "replicate": k // 2 + 1}
        return min(per_border[cfg.border], size)

    return {
        "output": kh * kw,
        "grad_input": kh * kw * copies(kh, cfg.size[0]) * copies(kw, cfg.size[1]),
        "grad_kernel": cfg.planes * cfg.size[0] * cfg.size[1],
    }


# ---------------------------------------------------------------- trilinear_interpolation configs

#: Feature counts that break every vector width (1, 3, 5, 7, 33, 1023) and others.
TRILINEAR_FEATURES = (1, 2, 3, 4, 5, 7, 8, 16, 31, 32, 33, 64, 127, 128, 256, 1023, 1024, 2048)


@dataclasses.dataclass(frozen=True)
class TrilinearConfig:
    n: int
    features: int
    # inside: in [-1, 1]; outside: in [-3, 3]; normal: N(0, 1); grid: on {-1, 0, 1}
    points: str = "inside"
    feats_layout: str = "contiguous"
    points_layout: str = "contiguous"
    grad_layout: str = "contiguous"

    @property
    def feats_shape(self) -> Tuple[int, int, int]:
        return (self.n, 8, self.features)


def random_trilinear_config(rng: random.Random, **fixed) -> TrilinearConfig:
    """A random valid trilinear_interpolation configuration (at most ~64K
    feature values); keyword arguments pin fields."""
    features = fixed.pop("features", rng.choice(TRILINEAR_FEATURES))
    n = fixed.pop("n", None)
    if n is None:
        n = min(rng.choice([0, 1, 2, 3, rng.randint(4, 40), rng.randint(41, 500)]),
                max(3, 8192 // features))
    layout = lambda: rng.choice(("contiguous",) * 2 + DIRECT_LAYOUTS[1:])  # noqa: E731
    cfg = TrilinearConfig(
        n=n, features=features,
        points=fixed.pop("points", rng.choice(["inside", "inside", "outside", "normal", "grid"])),
        feats_layout=fixed.pop("feats_layout", layout()),
        points_layout=fixed.pop("points_layout", layout()),
        grad_layout=fixed.pop("grad_layout", layout()))
    assert not fixed, f"unknown config fields {sorted(fixed)}"
    return cfg


def make_points(cfg: TrilinearConfig, dtype, device, gen, requires_grad=False) -> torch.Tensor:
    """The config's points (N, 3) in its layout and value range."""
    if cfg.points == "grid":
        # Exactly on corners, edges and faces: weights of exactly 0 and 1.
        return make_tensor((cfg.n, 3), dtype, device, cfg.points_layout, gen, requires_grad,
                           uniform=(-1.5, 1.5), map_values=torch.round)
    uniform = {"inside": (-1.0, 1.0), "outside": (-3.0, 3.0), "normal": None}[cfg.points]
    return make_tensor((cfg.n, 3), dtype, device, cfg.points_layout, gen, requires_grad, uniform)


def trilinear_torch(feats: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """The op's formula written with PyTorch's elementwise ops:
    u, v, w = (points + 1) / 2, corner c = 4i + 2j + k,
    out = sum_c (i ? u : 1-u) (j ? v : 1-v) (k ? w : 1-w) feats[:, c]."""
    factors = [(1 - t, t) for t in ((points + 1) / 2).unbind(1)]
    corners = feats.unbind(1)
    out = None
    for c in range(8):
        i, j, k = c >> 2, (c >> 1) & 1, c & 1
        term = (factors[0][i] * factors[1][j] * factors[2][k])[:, None] * corners[c]
        out = term if out is None else out + term
    return out


def trilinear_reference(feats, points, grad) -> Dict[str, Tuple[torch.Tensor, torch.Tensor]]:
    """trilinear_torch in float64 with autograd: output, grad_feats and
    grad_points. The bounds use |u| + |1 - u| for each weight factor (the
    rounding of 1 - u is relative to 1 + |u|, not to |1 - u|)."""
    res = float64_reference(trilinear_torch, dict(feats=feats, points=points), grad, bounds=False)
    u = (f64(points) + 1) / 2
    a = u.abs() + (1 - u).abs()  # (N, 3)
    fa = f64(feats).abs()
    res["output"] = (res["output"][0], a.prod(1)[:, None] * fa.sum(1))
    if grad is not None:
        ga = f64(grad).abs()
        res["grad_feats"] = (res["grad_feats"][0], (a.prod(1)[:, None] * ga)[:, None, :].expand(fa.shape))
        s = (ga * fa.sum(1)).sum(1)  # (N,)
        pairs = torch.stack([a[:, 1] * a[:, 2], a[:, 0] * a[:, 2], a[:, 0] * a[:, 1]], 1)
        res["grad_points"] = (res["grad_points"][0], 0.5 * s[:, None] * pairs)
    return res


def trilinear_reductions(features: int) -> Dict[str, int]:
    return {"output": 16, "grad_feats": 4, "grad_points": 8 * max(features, 1) + 8}


# ---------------------------------------------------------------- differential runs


def check_against_reference(
    call,
    inputs: Dict[str, Optional[torch.Tensor]],
    reference,
    reductions: Dict[str, int],
    dtype: torch.dtype,
    device: str,
    gen: torch.Generator,
    ctx: str,
    grad_layout: str = "contiguous",
    nonfinite: Optional[Dict[str, str]] = None,
) -> torch.Tensor:
    """Runs `out = call(**inputs)` and backward with a random grad_output (made
    in `grad_layout`); checks the output and the gradient of every input that
    requires grad ("grad_<name>") against `reference(grad_output)` (a dict as
    float64_reference returns); `nonfinite` maps result names to
    assert_matches's `nonfinite` modes. Returns the output."""
    nonfinite = nonfinite or {}
    out = call(**inputs)
    grad = make_tensor(out.shape, dtype, device, grad_layout, gen)
    ref = reference(grad)
    assert_matches(out, *ref["output"], dtype, reductions["output"], "output", ctx, device,
                   nonfinite.get("output"))
    wanted = [(n, t) for n, t in inputs.items()
              if isinstance(t, torch.Tensor) and t.requires_grad]
    if not wanted:
        assert not out.requires_grad, f"output requires grad, no input does [{ctx}]"
        return out
    grads = torch.autograd.grad(out, [t for _, t in wanted], grad)
    sync(device)
    for (name, t), g in zip(wanted, grads):
        assert g.shape == t.shape, f"grad_{name} shape {tuple(g.shape)} vs {tuple(t.shape)} [{ctx}]"
        assert_matches(g, *ref["grad_" + name], dtype, reductions["grad_" + name], "grad_" + name,
                       ctx, device, nonfinite.get("grad_" + name))
    return out


def assert_deterministic(fn, what: str) -> None:
    """fn() -> a tuple of tensors; two runs must give bitwise equal results."""
    first, second = fn(), fn()
    for i, (a, b) in enumerate(zip(first, second)):
        assert torch.equal(a, b), (
            f"{what}: result {i} differs between two runs by up to "
            f"{float((a.double() - b.double()).abs().max()):.3g}"
        )


def conv2d_call(cfg: ConvConfig):
    """ops.conv2d with cfg's stride, padding, dilation and groups, as the
    call(input, weight, bias) that check_conv_case takes."""
    stride, padding, dilation, groups = cfg.args()
    return lambda input, weight, bias: ops.conv2d(input, weight, bias, stride, padding, dilation,
                                                  groups)


def check_conv_case(call, cfg: ConvConfig, device: str, dtype: torch.dtype, gen: torch.Generator,
                    ctx: str, need: Sequence[str] = ("x", "w", "b")) -> torch.Tensor:
    """Makes cfg's input, weight and (with cfg.bias) bias in cfg's layouts (the
    bias sliced), each requiring grad where its letter ("x", "w", "b") is in
    `need`; runs `call(input, weight, bias)` forward and backward and checks
    every result against F.conv2d (check_against_reference). Returns the output."""
    x = make_tensor(cfg.input_shape, dtype, device, cfg.input_layout, gen, "x" in need)
    w = make_tensor(cfg.weight_shape, dtype, device, cfg.weight_layout, gen, "w" in need)
    b = None
    if cfg.bias:
        b = make_tensor((cfg.out_channels,), dtype, device, "sliced", gen, "b" in need)
    return check_against_reference(call, dict(input=x, weight=w, bias=b),
                                   lambda g: conv2d_reference(cfg, x, w, b, g),
                                   conv2d_reductions(cfg), dtype, device, gen, ctx, cfg.grad_layout)


def check_under_no_grad_and_inference_mode(call, want: torch.Tensor) -> None:
    """call() under torch.no_grad() and under torch.inference_mode(): neither
    result requires grad, and both match `want` (a CPU tensor) to 1e-12."""
    with torch.no_grad():
        a = call()
    with torch.inference_mode():
        b = call()
    for got in (a, b):
        assert not got.requires_grad
        torch.testing.assert_close(got.cpu(), want, rtol=1e-12, atol=1e-12)


def capture_and_replay(step, new_inputs: Sequence[torch.Tensor], gen: torch.Generator):
    """Runs step() once on a side stream (the warm-up, outside the capture),
    captures step() into a CUDA graph, refills each of `new_inputs` in place
    with new random values (made with `gen`, in order), replays the graph and
    waits for it. Returns (the captured step()'s results, which now hold those
    of the new inputs; the graph, to be kept alive while they are read)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # A capture stream of the current device: torch.cuda.graph's default one
    # belongs to the device that was current when it was first made.
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        results = step()
    for t in new_inputs:
        t.copy_(make_tensor(t.shape, t.dtype, "cuda", gen=gen))
    graph.replay()
    torch.cuda.synchronize()
    return results, graph


# ---------------------------------------------------------------- drop-ins for torch.nn.Conv2d


def check_drop_in_state_dict(ours: torch.nn.Module, theirs: torch.nn.Module, make_ours) -> None:
    """`ours` (a customconv.nn module) stands in for `theirs` (the torch.nn
    module built with the same arguments): an instance of its class with the
    same parameter names and shapes, state_dict keys and extra_repr; theirs's
    state_dict loads strictly into ours, values included, and so does the
    state_dict of a fresh make_ours() into theirs."""
    assert isinstance(ours, type(theirs))
    assert [(n, p.shape) for n, p in ours.named_parameters()] == \
        [(n, p.shape) for n, p in theirs.named_parameters()]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert ours.extra_repr() == theirs.extra_repr()
    result = ours.load_state_dict(theirs.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    for name, p in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], p), name
    # ... and the other way round, values included.
    other = make_ours()
    theirs.load_state_dict(other.state_dict(), strict=True)
    for name, p in other.state_dict().items():
        assert torch.equal(theirs.state_dict()[name], p), name


def check_drop_in_matches(ours, theirs, size: Tuple[int, int], device: str, gen: torch.Generator,
                          ctx: str) -> None:
    """In float64, the output and the gradients of input and parameters of
    `ours` match those of `theirs` (sharing its parameter values) to 1e-10 on a
    batch of 2 inputs of `size`, with a transposed grad_output."""
    x = make_tensor((2, ours.in_channels) + size, torch.float64, device, gen=gen, requires_grad=True)
    out, ref = ours(x), theirs(x)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10, msg=lambda m: f"{ctx}: output: {m}")
    grad = make_tensor(ref.shape, torch.float64, device, "transposed", gen)
    names = ["input"] + [n for n, _ in ours.named_parameters()]
    g_ours = torch.autograd.grad(out, [x] + list(ours.parameters()), grad)
    g_theirs = torch.autograd.grad(ref, [x] + list(theirs.parameters()), grad)
    for name, a, b in zip(names, g_ours, g_theirs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10,
                                   msg=lambda m: f"{ctx}: grad of {name}: {m}")


def check_float32_drop_in_matches_float64(ours, theirs64, size: Tuple[int, int], device: str,
                                          gen: torch.Generator, seed: int) -> None:
    """`ours` in float32 gives a float32 output within 1e-5 and gradients of
    input and parameters within 1e-4 of `theirs64` (the float64 reference with
    the same parameter values) on a batch of 3 inputs of `size`."""
    x = make_tensor((3, ours.in_channels) + size, torch.float32, device, gen=gen, requires_grad=True)
    x64 = x.detach().double().requires_grad_()
    out, ref = ours(x), theirs64(x64)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    grad = make_tensor(ref.shape, torch.float32, device, gen=gen)
    g_ours = torch.autograd.grad(out, [x] + list(ours.parameters()), grad)
    g_ref = torch.autograd.grad(ref, [x64] + list(theirs64.parameters()), grad.double())
    for a, b in zip(g_ours, g_ref):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4,
                                   msg=lambda m: f"seed={seed}: {m}")


def check_trains_alike(ours, theirs, input_shape, target_shape, device: str,
                       gen: torch.Generator) -> None:
    """Three steps of SGD with momentum on an MSE loss (new float64 inputs and
    targets each step) keep the parameters of `ours` and `theirs` equal to 1e-10."""
    opt_a = torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9)
    opt_b = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9)
    for _ in range(3):
        x = make_tensor(input_shape, torch.float64, device, gen=gen)
        target = make_tensor(target_shape, torch.float64, device, gen=gen)
        for m, opt in ((ours, opt_a), (theirs, opt_b)):
            opt.zero_grad()
            F.mse_loss(m(x), target).backward()
            opt.step()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=lambda m: f"{name}: {m}")


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



def check_small_direct_ops(device: str, dtype: torch.dtype = torch.float32) -> None:
    """One ordinary call (forward and backward) of depthwise_conv2d, filter2d
    and trilinear_interpolation that must give right results: run after an
    error to show the device is still usable."""
    gen = generator(4321)
    ctx = f"follow-up call on {device}"
    cfg = ConvConfig(batch=2, in_channels=3, out_channels=6, groups=3, kernel=(3, 5),
                     stride=(2, 1), padding=(1, 2), dilation=(1, 1), size=(7, 6), bias=True)
    stride, padding, dilation, _ = cfg.args()
    x = make_tensor(cfg.input_shape, dtype, device, gen=gen, requires_grad=True)
    w = make_tensor(cfg.weight_shape, dtype, device, gen=gen, requires_grad=True)
    b = make_tensor((cfg.out_channels,), dtype, device, gen=gen, requires_grad=True)
    check_against_reference(
        lambda input, weight, bias: ops.depthwise_conv2d(input, weight, bias, stride, padding,
                                                         dilation),
        dict(input=x, weight=w, bias=b), lambda g: conv2d_reference(cfg, x, w, b, g),
        conv2d_reductions(cfg), dtype, device, gen, "depthwise_conv2d " + ctx)

    fcfg = FilterConfig(lead=(2,), size=(6, 5), kernel=(3, 5), border="reflect")
    x = make_tensor(fcfg.input_shape, dtype, device, gen=gen, requires_grad=True)
    k = make_tensor(fcfg.kernel, dtype, device, gen=gen, requires_grad=True)
    check_against_reference(
        lambda input, kernel: ops.filter2d(input, kernel, fcfg.border), dict(input=x, kernel=k),
        lambda g: filter2d_reference(fcfg, x, k, g), filter2d_reductions(fcfg), dtype, device,
        gen, "filter2d " + ctx)

    feats = make_tensor((5, 8, 7), dtype, device, gen=gen, requires_grad=True)
    points = make_tensor((5, 3), dtype, device, gen=gen, requires_grad=True, uniform=(-1, 1))
    check_against_reference(
        ops.trilinear_interpolation, dict(feats=feats, points=points),
        lambda g: trilinear_reference(feats, points, g), trilinear_reductions(7), dtype, device,
        gen, "trilinear_interpolation " + ctx)


def random_direct_cpu_config(rng: random.Random, window: Dict, **fixed) -> ConvConfig:
    """A float32 case for the CPU's direct conv2d kernels: `window`'s fields
    (kernel, stride, padding, dilation, size, in_channels, out_channels) with a
    random batch (1-3), bias, input layout (offset views included), weight
    layout (transposed included) and grad layout. Keyword arguments pin any
    field."""
    values = dict(batch=rng.choice([1, 2, 3]), groups=1, bias=rng.random() < 0.6,
                  input_layout=rng.choice(DIRECT_LAYOUTS),
                  weight_layout=rng.choice(["contiguous", "channels_last", "transposed"]),
                  grad_layout=rng.choice(["contiguous", "channels_last"]))
    values.update(window)
    values.update(fixed)
    return ConvConfig(**values)


def same_memory_format(a: torch.Tensor, b: torch.Tensor) -> bool:
    return all(a.is_contiguous(memory_format=f) == b.is_contiguous(memory_format=f)
               for f in (torch.contiguous_format, torch.channels_last))


def check_cpu_float32_case(cfg: ConvConfig, gen: torch.Generator, ctx: str) -> torch.Tensor:
    """check_conv_case for conv2d on the CPU in float32, and the output in
    F.conv2d's memory format for the same layouts. Returns the output."""
    out = check_conv_case(conv2d_call(cfg), cfg, "cpu", torch.float32, gen, ctx)
    x = make_tensor(cfg.input_shape, torch.float32, "cpu", cfg.input_layout, gen)
    w = make_tensor(cfg.weight_shape, torch.float32, "cpu", cfg.weight_layout, gen)
    want = F.conv2d(x, w, None, *cfg.args())
    assert same_memory_format(out, want), f"{ctx} {out.stride()} {want.stride()}"
    return out
