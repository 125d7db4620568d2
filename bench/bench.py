"""Times customconv's ops against the fastest thing PyTorch offers for the same job.

    python3 bench/bench.py --device cuda|cpu [--ops depthwise,filter2d,trilinear,conv2d,conv2d_grouped]
                           [--dtypes float32,float16,bfloat16] [--quick] [--out bench/results]
                           [--append]

For each case it measures, in the same run, our op and its baselines, forward and
forward+backward, as the fastest of three medians of many repetitions (CUDA events
on the GPU, with the L2 cache flushed by a read pass before each repetition so it
does not flatter; perf_counter on the CPU); see Timer. It also measures the
device-to-device copy rate and reports each forward of a memory-bound op as a
percentage of it (bytes read + written).

Writes <out>/<device>.json (one record per case), <out>/<device>.md (a table)
and <out>/<device>.png (speedups, when matplotlib is present), and prints the
table last.
"""

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python_stub"))
import customconv  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}


@dataclass
class Record:
    op: str
    shape: str
    dtype: str
    pass_: str  # "fwd" or "fwd+bwd"
    ours_ms: float
    baseline: str
    baseline_ms: float
    speedup: float
    pct_copy_bw: Optional[float]  # forward of memory-bound ops only
    cls: str = ""  # size class the targets are stated for (e.g. "k<=5"), grouped in the summary
    extra_mib: Optional[float] = None  # peak memory beyond inputs and results (conv2d)
    tflops: Optional[float] = None  # compute-bound ops (conv2d): our achieved TFLOP/s


def sleep_cycles_per_us() -> float:
    """Cycles of torch.cuda._sleep per microsecond on this device, measured."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1 << 20)
    start.record()
    torch.cuda._sleep(1 << 22)
    end.record()
    torch.cuda.synchronize()
    return (1 << 22) / (start.elapsed_time(end) * 1e3)


class Timer:
    """Time of a callable on one device: the fastest of `rounds` medians of many repetitions.

    On the GPU each repetition is timed with CUDA events, after a pass that evicts the inputs
    from the L2 cache so it does not flatter. That pass reads a buffer four times the L2's size
    (a sum into a scalar), so the L2 is left holding clean lines. Writing the buffer instead
    (`zero_()`) leaves the L2 full of dirty lines, and whatever runs next pays to write them
    back: on an H100 (50 MB of L2) that cost a 32 MiB copy a quarter of its speed (0.028 ms
    instead of 0.022), work that belongs to the flush, not to the op timed.

    The events time the device, not the host: where one call takes the host longer to queue
    than the flush takes the device (a forward+backward, whose backward runs on autograd's
    device thread, takes 200-400 us of host time at any size), each repetition first parks the
    device in a sleep kernel as long as 1.5 times the call's host time, so the call is queued
    whole before the start event runs and no host gap falls between the two events. Without
    it, forward+backward rows of layers under about 0.3 ms timed the host on both sides: the
    same kernels read 0.13 and 0.37 ms in two runs. The host's own cost per call is
    `bench/host_cost.py`'s to measure.

    The number of repetitions fits the callable's speed (about 50 ms of repetitions per round,
    between `min_reps` and `max_reps`, from a first estimate of three repetitions that is not
    reported), and the fastest round's median is reported, so a spell of slowness on the
    machine (clocks, other processes) that covers one round does not set the result.
    """

    def __init__(self, device: str, max_reps: int, warmup: int, rounds: int = 3, min_reps: int = 5):
        self.device, self.max_reps, self.warmup = device, max_reps, warmup
        self.rounds, self.min_reps = rounds, min_reps
        self.flush = self.flush_sum = None
        if device == "cuda":
            l2 = torch.cuda.get_device_properties(0).L2_cache_size
            self.flush = torch.ones(max(4 * l2, 64 << 20) // 4, dtype=torch.float32, device="cuda")
            self.flush_sum = torch.empty((), dtype=torch.float32, device="cuda")
            self.cycles_per_us = sleep_cycles_per_us()

    def _fit_sleep(self, fn: Callable[[], object]) -> int:
        """The sleep, in cycles, that keeps the device behind the host for fn (see the class)."""
        host_us = []
        for _ in range(5):
            torch.cuda._sleep(int(2000 * self.cycles_per_us))  # keeps the queue from filling
            t0 = time.perf_counter()
            fn()
            host_us.append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()
        host = statistics.median(host_us)
        # The flush alone covers cheaper calls.
        return int(1.5 * host * self.cycles_per_us) if host > 40.0 else 0

    def evict(self) -> None:
        """Evicts the inputs from the L2 cache, leaving clean lines of the flush buffer there."""
        torch.sum(self.flush, dim=0, out=self.flush_sum)

    def _round(self, fn: Callable[[], object], reps: int, sleep_cycles: int = 0) -> float:
        if self.device != "cuda":
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(times)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        for start, end in events:
            if sleep_cycles:
                torch.cuda._sleep(sleep_cycles)
            self.evict()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in events)

    def __call__(self, fn: Callable[[], object]) -> float:
        for _ in range(self.warmup):
            fn()
        sleep = 0
        if self.device == "cuda":
            torch.cuda.synchronize()
            sleep = self._fit_sleep(fn)
        estimate = self._round(fn, 3, sleep)
        reps = max(self.min_reps, min(self.max_reps, int(50.0 / max(estimate, 1e-3))))
        return min(self._round(fn, reps, sleep) for _ in range(self.rounds))


def warm_up_device(device: str, seconds: float = 1.0) -> None:
    """Keeps the GPU busy for a while so its clocks have settled before the first timing."""
    if device != "cuda":
        return
    a = torch.randn(4096, 4096, device="cuda")
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            a = torch.mm(a, a).clamp_(-1, 1)
        torch.cuda.synchronize()


def copy_bandwidth(device: str, timer: Timer) -> float:
    """Device-to-device copy rate in GB/s, bytes read + written."""
    n = (1 << 30) if device == "cuda" else (256 << 20)
    src = torch.empty(n, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    return 2 * n / (ms * 1e-3) / 1e9


def fwd_bwd(fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor]) -> Callable[[], None]:
    """A callable running fn forward and backward (gradients for every input that needs one)."""
    grad_out = {}

    def run():
        out = fn(*inputs)
        if "g" not in grad_out:
            grad_out["g"] = torch.randn_like(out)
        out.backward(grad_out["g"])
        for t in inputs:
            t.grad = None

    return run


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# ---------------------------------------------------------------- cases

def depthwise_cases(quick: bool) -> List[Tuple[str, Tuple[int, int, int, int], int, int]]:
    # (model, (N, C, H, W), kernel, stride): MobileNetV2, EfficientNet, ConvNeXt, RepLKNet layers.
    cases = [
        ("MobileNetV2", (32, 96, 112, 112), 3, 1),
        ("MobileNetV2", (32, 144, 56, 56), 3, 2),
        ("MobileNetV2", (32, 384, 14, 14), 3, 1),
        ("EfficientNet", (32, 240, 28, 28), 5, 1),
        ("EfficientNet", (32, 480, 14, 14), 5, 2),
        ("ConvNeXt", (32, 96, 56, 56), 7, 1),
        ("ConvNeXt", (32, 384, 14, 14), 7, 1),
        ("RepLKNet", (32, 128, 56, 56), 13, 1),
        ("RepLKNet", (32, 256, 28, 28), 31, 1),
    ]
    return cases[::3] if quick else cases


def bench_depthwise(device, dtype, timer, copy_bw, quick) -> List[Record]:
    """Each layer in NCHW and in channels_last, ours and F.conv2d in the same
    run: a record per layout (same-layout ratio) and one of our best layout
    against PyTorch's best ("PyTorch best layout"), forward and
    forward+backward."""
    records = []
    layouts = (("NCHW", torch.contiguous_format), ("channels_last", torch.channels_last))
    for model, (n, c, h, w), k, s in depthwise_cases(quick):
        if device == "cpu":
            n = max(1, n // 16)
        x = torch.randn(n, c, h, w, device=device, dtype=dtype)
        wt = torch.randn(c, 1, k, k, device=device, dtype=dtype)
        b = torch.randn(c, device=device, dtype=dtype)
        pad = k // 2
        shape = f"{model} N{n} C{c} {h}x{w} k{k} s{s}"
        ours = lambda x, wt, b: customconv.depthwise_conv2d(x, wt, b, s, pad)
        torch_conv = lambda x, wt, b: F.conv2d(x, wt, b, s, pad, 1, c)
        inputs = {lay: (x.contiguous(memory_format=fmt), wt.contiguous(memory_format=fmt), b)
                  for lay, fmt in layouts}
        out_bytes = nbytes(ours(x, wt, b))
        pct_of = lambda t: 100 * (nbytes(x, wt) + out_bytes) / (t * 1e-3) / 1e9 / copy_bw
        cls = "k<=5" if k <= 5 else "k>=7"
        dt = str(dtype)[6:]
        for pass_ in ("fwd", "fwd+bwd"):
            t_ours, t_base = {}, {}
            for lay, args in inputs.items():
                if pass_ == "fwd":
                    t_ours[lay] = timer(lambda: ours(*args))
                    t_base[lay] = timer(lambda: torch_conv(*args))
                else:
                    grads = [t.clone().requires_grad_() for t in args]
                    t_ours[lay] = timer(fwd_bwd(ours, grads))
                    t_base[lay] = timer(fwd_bwd(torch_conv, grads))
                pct = pct_of(t_ours[lay]) if pass_ == "fwd" else None
                records.append(Record("depthwise_conv2d", f"{shape} {lay}", dt, pass_, t_ours[lay],
                                      f"F.conv2d {lay}", t_base[lay], t_base[lay] / t_ours[lay],
                                      pct, cls))
            mine = min(t_ours, key=t_ours.get)
            best = min(t_base.values())
            pct = pct_of(t_ours[mine]) if pass_ == "fwd" else None
            records.append(Record("depthwise_conv2d", f"{shape} ours {mine}", dt, pass_,
                                  t_ours[mine], "PyTorch best layout", best, best / t_ours[mine],
                                  pct, cls))
    return records


def bench_filter2d(device, dtype, timer, copy_bw, quick) -> List[Record]:
    records = []
    shapes = [(4096, 4096), (16, 3, 1024, 1024)] if device == "cuda" else [(1024, 1024), (2, 3, 512, 512)]
    kernels = [3, 7] if quick else [3, 5, 7, 15, 31]
    for shape in shapes:
        for k in kernels:
            x = torch.randn(*shape, device=device, dtype=dtype)
            kern = torch.randn(k, k, device=device, dtype=dtype)
            ours = lambda x, kern: customconv.filter2d(x, kern, "zeros")

            def torch_filter(x, kern):
                planes = x.reshape(-1, 1, x.shape[-2], x.shape[-1])
                return F.conv2d(planes, kern[None, None], None, 1, k // 2).reshape(x.shape)

            name = f"{'x'.join(map(str, shape))} k{k}"
            cls = "k<=7" if k <= 7 else "k>7"
            t_ours = timer(lambda: ours(x, kern))
            t_base = timer(lambda: torch_filter(x, kern))
            pct = 100 * 2 * nbytes(x) / (t_ours * 1e-3) / 1e9 / copy_bw
            records.append(Record("filter2d", name, str(dtype)[6:], "fwd", t_ours,
                                  "F.conv2d on planes", t_base, t_base / t_ours, pct, cls))
            args = [x.clone().requires_grad_(), kern.clone().requires_grad_()]
            t_ours_b = timer(fwd_bwd(ours, args))
            t_base_b = timer(fwd_bwd(torch_filter, args))
            records.append(Record("filter2d", name, str(dtype)[6:], "fwd+bwd", t_ours_b,
                                  "F.conv2d on planes", t_base_b, t_base_b / t_ours_b, None, cls))
    return records


def trilinear_composite(feats: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """Seed 004's formula as a composite of PyTorch ops."""
    u, v, w = ((points + 1) / 2).unbind(1)
    out = 0
    for i in (0, 1):
        for j in (0, 1):
            for k in (0, 1):
                wt = (u if i else 1 - u) * (v if j else 1 - v) * (w if k else 1 - w)
                out = out + wt[:, None] * feats[:, 4 * i + 2 * j + k]
    return out


def bench_trilinear(device, dtype, timer, copy_bw, quick) -> List[Record]:
    records = []
    sizes = [(65536, 256)] if quick else [(65536, 256), (1 << 20, 32), (4096, 2048), (65536, 255)]
    compiled = torch.compile(trilinear_composite) if device == "cuda" else None
    for n, f in sizes:
        feats = torch.randn(n, 8, f, device=device, dtype=dtype)
        points = torch.rand(n, 3, device=device, dtype=dtype) * 2 - 1
        ours = customconv.trilinear_interpolation
        name = f"N{n} F{f}"
        t_ours = timer(lambda: ours(feats, points))
        baselines = [("seed composite eager", trilinear_composite)]
        if compiled is not None:
            baselines.append(("seed composite compiled", compiled))
        pct = 100 * (nbytes(feats, points) + n * f * feats.element_size()) / (t_ours * 1e-3) / 1e9 / copy_bw
        args = [feats.clone().requires_grad_(), points.clone().requires_grad_()]
        t_ours_b = timer(fwd_bwd(ours, args))
        for bname, fn in baselines:
            t_base = timer(lambda: fn(feats, points))
            records.append(Record("trilinear_interpolation", name, str(dtype)[6:], "fwd", t_ours,
                                  bname, t_base, t_base / t_ours, pct))
            t_base_b = timer(fwd_bwd(fn, args))
            records.append(Record("trilinear_interpolation", name, str(dtype)[6:], "fwd+bwd",
                                  t_ours_b, bname, t_base_b, t_base_b / t_ours_b, None))
    return records


# ResNet-50's convolution layers: (C, H, K, kernel, stride); H is the input size.
RESNET50_LAYERS = [
    (3, 224, 64, 7, 2),  # stem
    (64, 56, 64, 1, 1), (64, 56, 64, 3, 1), (64, 56, 256, 1, 1), (256, 56, 64, 1, 1),
    (256, 56, 128, 1, 1), (128, 56, 128, 3, 2), (128, 28, 512, 1, 1), (256, 56, 512, 1, 2),
    (512, 28, 128, 1, 1), (128, 28, 128, 3, 1), (512, 28, 256, 1, 1), (256, 28, 256, 3, 2),
    (256, 14, 1024, 1, 1), (512, 28, 1024, 1, 2), (1024, 14, 256, 1, 1), (256, 14, 256, 3, 1),
    (1024, 14, 512, 1, 1), (512, 14, 512, 3, 2), (512, 7, 2048, 1, 1), (1024, 14, 2048, 1, 2),
    (2048, 7, 512, 1, 1), (512, 7, 512, 3, 1),
]


def extra_memory_mib(fn: Callable[[], object], kept_bytes: Callable[[object], int],
                     device: str = "cuda") -> Optional[float]:
    """Peak memory that fn() allocates beyond what it returns and what
    existed before, in MiB (kept_bytes(result): the bytes of its results that
    are not the tensors it returns, such as a gradient's seed freed before it
    returns; 0 for a plain call). CUDA: the caching allocator's peak; CPU: the
    profiler's memory timeline (every allocation and free in order), or None
    where this PyTorch has none."""
    if device == "cpu":
        return cpu_extra_memory_mib(fn, kept_bytes)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before - kept_bytes(result)
    return max(extra, 0) / 2**20


def cpu_extra_memory_mib(fn: Callable[[], object], seed_bytes: Callable[[object], int]) -> Optional[float]:
    """extra_memory_mib on the CPU: the peak of the memory timeline during
    fn() less its level at the end (what fn() returns stays allocated; the
    tensors that existed before are in both), less seed_bytes(result)."""
    try:
        from torch.profiler._memory_profiler import MemoryProfileTimeline
    except ImportError:
        return None
    fn()  # first-call allocations (packed weights cached by PyTorch, ...) out of the way
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                record_shapes=True, with_stack=True) as prof:
        result = fn()
    try:
        _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    except Exception:  # a private interface: absent or changed in this PyTorch
        return None
    levels = [sum(level) for level in sizes]
    if not levels:
        return 0.0
    return max(max(levels) - levels[-1] - seed_bytes(result), 0) / 2**20


# ResNeXt-50 32x4d's grouped 3x3 layers (32 groups of 4, 8, 16 and 32
# channels) and RegNetY-400MF's (groups of 8 channels): (C, H, K, kernel,
# stride, groups); H is the input size.
GROUPED_LAYERS = [
    (128, 56, 128, 3, 1, 32), (256, 56, 256, 3, 2, 32), (256, 28, 256, 3, 1, 32),
    (512, 28, 512, 3, 2, 32), (512, 14, 512, 3, 1, 32), (1024, 14, 1024, 3, 2, 32),
    (1024, 7, 1024, 3, 1, 32),
    (48, 112, 48, 3, 2, 6), (104, 56, 104, 3, 2, 13), (104, 28, 104, 3, 1, 13),
    (208, 28, 208, 3, 2, 26), (208, 14, 208, 3, 1, 26), (440, 14, 440, 3, 2, 55),
    (440, 7, 440, 3, 1, 55),
]

# The RGB stems of torchvision's classification models: ResNet's 7x7 stride 2
# (3 -> 64) and the 3x3 stride-2 stems of MobileNetV2, EfficientNet-B0 and
# RegNet (3 -> 32) and of MobileNetV3 (3 -> 16): (C, H, K, kernel, stride).
STEM_LAYERS = [(3, 224, 64, 7, 2), (3, 224, 32, 3, 2), (3, 224, 16, 3, 2)]


def bench_conv2d(device, dtype, timer, copy_bw, quick) -> List[Record]:
    """Each ResNet-50 layer; see conv2d_records."""
    layers = RESNET50_LAYERS[1:4] if quick else RESNET50_LAYERS
    return conv2d_records([layer + (1,) for layer in layers], device, dtype, timer)


def bench_conv2d_stems(device, dtype, timer, copy_bw, quick) -> List[Record]:
    """The RGB stems; see conv2d_records."""
    layers = STEM_LAYERS[1:2] if quick else STEM_LAYERS
    return conv2d_records([layer + (1,) for layer in layers], device, dtype, timer)


def bench_conv2d_grouped(device, dtype, timer, copy_bw, quick) -> List[Record]:
    """ResNeXt-50's and RegNetY-400MF's grouped layers; see conv2d_records."""
    layers = GROUPED_LAYERS[::4] if quick else GROUPED_LAYERS
    return conv2d_records(layers, device, dtype, timer)


def conv2d_records(layers, device, dtype, timer) -> List[Record]:
    """Each layer (C, H, K, kernel, stride, groups) in NCHW and in
    channels_last, ours and F.conv2d in the same run: a record per layout
    (same-layout ratio) and one of our best layout against PyTorch's best
    ("PyTorch best layout"), forward and forward+backward."""
    records = []
    n = 32 if device == "cuda" else 4
    dt = str(dtype)[6:]
    layouts = (("NCHW", torch.contiguous_format), ("channels_last", torch.channels_last))
    for c, h, k, ks, s, g in layers:
        x = torch.randn(n, c, h, h, device=device, dtype=dtype)
        w = torch.randn(k, c // g, ks, ks, device=device, dtype=dtype) / math.sqrt(c // g * ks * ks)
        pad = ks // 2
        ours = lambda x, w: customconv.conv2d(x, w, None, s, pad, 1, g)
        ref = lambda x, w: F.conv2d(x, w, None, s, pad, 1, g)
        name = f"N{n} C{c} {h}x{h} K{k} k{ks} s{s}" + (f" g{g}" if g > 1 else "")
        cls = (f"stem {ks}x{ks}" if c <= 4 else f"grouped {ks}x{ks}" if g > 1 else f"{ks}x{ks}")
        flops = 2 * n * k * (c // g) * ks * ks * (h // s) ** 2
        inputs = {lay: (x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt))
                  for lay, fmt in layouts}
        for pass_, work in (("fwd", 1), ("fwd+bwd", 3)):
            t_ours, t_base, extra = {}, {}, {}
            for lay, (xl, wl) in inputs.items():
                if pass_ == "fwd":
                    t_ours[lay] = timer(lambda: ours(xl, wl))
                    t_base[lay] = timer(lambda: ref(xl, wl))
                    extra[lay] = extra_memory_mib(lambda: ours(xl, wl), nbytes, device)
                else:
                    args = [xl.clone().requires_grad_(), wl.clone().requires_grad_()]
                    t_ours[lay] = timer(fwd_bwd(ours, args))
                    t_base[lay] = timer(fwd_bwd(ref, args))
                    def step():
                        out = ours(*args)
                        return (out,) + torch.autograd.grad(out, args, torch.ones_like(out))
                    seed = lambda r: r[0].numel() * r[0].element_size()  # ones_like(out), freed
                    extra[lay] = extra_memory_mib(
                        step, (lambda r: nbytes(*r) + seed(r)) if device == "cuda" else seed, device)
                records.append(Record("conv2d", f"{name} {lay}", dt, pass_, t_ours[lay],
                                      f"F.conv2d {lay}", t_base[lay], t_base[lay] / t_ours[lay],
                                      None, cls, extra.get(lay), work * flops / t_ours[lay] / 1e9))
            mine = min(t_ours, key=t_ours.get)
            best = min(t_base.values())
            records.append(Record("conv2d", f"{name} ours {mine}", dt, pass_, t_ours[mine],
                                  "PyTorch best layout", best, best / t_ours[mine], None, cls,
                                  extra.get(mine), work * flops / t_ours[mine] / 1e9))
    return records


BENCHES: Dict[str, Callable] = {
    "depthwise": bench_depthwise,
    "filter2d": bench_filter2d,
    "trilinear": bench_trilinear,
    "conv2d": bench_conv2d,
    "conv2d_grouped": bench_conv2d_grouped,
    "conv2d_stems": bench_conv2d_stems,
}


# ---------------------------------------------------------------- output

def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def markdown(records: List[Record], device_name: str, copy_bw: float) -> str:
    lines = [f"# customconv benchmark on {device_name}", "",
             f"Device-to-device copy: {copy_bw:.0f} GB/s (read + write).", "",
             "Times are the device's: on the GPU each repetition is queued whole before it "
             "runs, so no host time falls inside it (Timer); `bench/host_cost.py` measures "
             "the host's cost per call.", "",
             "TFLOP/s: ours, for the compute-bound conv2d. Extra MiB: peak memory of ours beyond "
             "its inputs and results (conv2d; on the CPU from the profiler's memory timeline).", "",
             "| op | shape | dtype | pass | ours ms | baseline | baseline ms | speedup | % copy BW "
             "| TFLOP/s | extra MiB |",
             "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in records:
        pct = f"{r.pct_copy_bw:.0f}%" if r.pct_copy_bw is not None else ""
        tflops = f"{r.tflops:.1f}" if r.tflops is not None else ""
        extra = f"{r.extra_mib:.0f}" if r.extra_mib is not None else ""
        lines.append(f"| {r.op} | {r.shape} | {r.dtype} | {r.pass_} | {r.ours_ms:.3f} | "
                     f"{r.baseline} | {r.baseline_ms:.3f} | {r.speedup:.2f}x | {pct} | {tflops} "
                     f"| {extra} |")
    lines += ["", "Geometric-mean speedup per op, pass, baseline, dtype and size class "
              "(all: every case; min % copy BW over the forward cases; max extra MiB):", "",
              "| op | pass | baseline | dtype | class | geomean speedup | min % copy BW "
              "| max extra MiB | cases |",
              "|---|---|---|---|---|---:|---:|---:|---:|"]
    groups: Dict[Tuple[str, str, str, str, str], List[Record]] = {}
    for r in records:
        for cls in sorted({"all", r.cls or "all"}):
            groups.setdefault((r.op, r.pass_, r.baseline, r.dtype, cls), []).append(r)
    for (op, p, b, dt, cls), rs in groups.items():
        pcts = [r.pct_copy_bw for r in rs if r.pct_copy_bw is not None]
        low = f"{min(pcts):.0f}%" if pcts else ""
        extras = [r.extra_mib for r in rs if r.extra_mib is not None]
        most = f"{max(extras):.0f}" if extras else ""
        lines.append(f"| {op} | {p} | {b} | {dt} | {cls} | "
                     f"{geomean([r.speedup for r in rs]):.2f}x | {low} | {most} | {len(rs)} |")
    return "\n".join(lines) + "\n"


def chart(records: List[Record], path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [f"{r.op} {r.shape} {r.dtype} {r.pass_} vs {r.baseline}" for r in records]
    fig, ax = plt.subplots(figsize=(12, max(4, 0.22 * len(records))))
    ax.barh(range(len(records)), [r.speedup for r in records],
            color=["tab:green" if r.speedup >= 1 else "tab:red" for r in records])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(records)))
    ax.set_yticklabels(labels, fontsize=6)
    ax.set_xscale("log")
    ax.set_xlabel("speedup over the baseline (log scale)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--ops", default=",".join(BENCHES))
    parser.add_argument("--dtypes", default=None,
                        help="default: float32,float16,bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--append", action="store_true",
                        help="add to the records already in <out>/<device>.json")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench: --device cuda but no GPU is available", file=sys.stderr)
        return 2
    dtypes = (args.dtypes or ("float32,float16,bfloat16" if args.device == "cuda" else "float32"))
    reps, warmup = (5, 2) if args.quick else (50, 3)
    timer = Timer(args.device, reps, warmup, rounds=1 if args.quick else 3)
    warm_up_device(args.device)
    copy_bw = copy_bandwidth(args.device, timer)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    records: List[Record] = []
    for op in args.ops.split(","):
        for dt in dtypes.split(","):
            records += BENCHES[op](args.device, DTYPES[dt], timer, copy_bw, args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / args.device
    if args.append and stem.with_suffix(".json").exists():
        old = json.loads(stem.with_suffix(".json").read_text())["records"]
        records = [Record(**{("pass_" if k == "pass" else k): v for k, v in r.items()})
                   for r in old] + records
    payload = {"device": device_name, "torch": torch.__version__, "copy_gbps": copy_bw,
               "records": [{**asdict(r), "pass": r.pass_} for r in records]}
    for rec in payload["records"]:
        del rec["pass_"]
    stem.with_suffix(".json").write_text(json.dumps(payload, indent=1))
    table = markdown(records, device_name, copy_bw)
    stem.with_suffix(".md").write_text(table)
    chart(records, stem.with_suffix(".png"))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
