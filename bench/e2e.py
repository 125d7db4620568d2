"""End-to-end benchmark of whole torchvision models: PyTorch eager against
TorchScript's optimize_for_inference, customconv.convert(model) and
customconv.fuse(model), a float32 training step, and the C++ deployment program.

    python3 bench/e2e.py [--device cuda|cpu]
        [--models resnet50,mobilenet_v2,efficientnet_b0,convnext_tiny]
        [--batches 32,1] [--dtypes float32,float16] [--layouts nchw,channels_last]
        [--iters N] [--rounds R] [--no-script-fused] [--render JSON] [--merge JSON JSON ...]
        [--no-train] [--train-batch N] [--no-inference]
        [--no-demo] [--demo-binary PATH] [--demo-models M,...]
        [--demo-dtypes float32,float16] [--demo-layouts channels_last]
        [--demo-batch N] [--demo-threads T] [--demo-iters N]
        [--out bench/results/e2e]

What it measures, 224x224 images, random weights (nothing is downloaded) with
random batch-norm statistics and affine parameters, so that folding them
changes the numbers; every variant starts from the same weights (deep copies):

- inference, for each model x batch x dtype x layout: ms per forward of
  PyTorch eager; of torch.jit.optimize_for_inference(torch.jit.freeze(
  torch.jit.script(model))) ("ofi"); of customconv.convert(model) ("converted",
  eager modules calling customconv's unfused ops); and of customconv.fuse(model)
  ("fused": batch norms folded, activations and residual adds fused into
  customconv::conv2d_fused). Each output is compared with eager's (max abs
  difference over max abs value); a difference above the dtype's tolerance is
  flagged in the table, and a variant that fails is recorded with its error.
  The fused model is also timed scripted, torch.jit.script(fused model)
  ("fused scripted"; --no-script-fused skips it), which is what the
  optimize_for_inference target compares (both are TorchScript).
- training (float32): one SGD step (forward, cross-entropy on random labels,
  backward, optimizer.step) of PyTorch against customconv.convert(model), in
  each layout; before timing, both models' logits and gradients are compared
  with a float64 copy's.
- the C++ program customconv_demo: latency p50/p90/p99 and throughput of the
  scripted fused model against the scripted unconverted model, with the same
  request threads, on the benchmark's device; also T / p50, the steady-state
  rate, which leaves out TorchScript's start-up work in the first requests.

Timing: CUDA events (on the CPU, the wall clock) around back-to-back calls after
a warm-up; the median of --rounds rounds, the variants of a case (eager, ofi,
converted, fused; PyTorch's and the converted training step) taking their
rounds in turn, so that a slow stretch of a busy machine does not fall on one. Without --iters, the calls per round
are chosen so that a round takes about 80 ms on CUDA (at least 5 calls) and
200 ms on the CPU (at least 1).

Writes <out>/fused-<device>.json, <out>/fused-<device>.md (tables, geomeans and
the targets' pass/fail) and <out>/fused-<device>.png (a bar chart of the
speedups; skipped without matplotlib). Prints a progress line per case.
"""

import argparse
import copy
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
import torchvision

REPO = Path(__file__).resolve().parents[1]


def shown_path(p: Path) -> str:
    """p as the results record it: relative to the repository where it lies
    inside it, so that a results file names no machine's directories."""
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return p.name if p.is_absolute() else str(p)
try:  # the package on PYTHONPATH, else this repository's (as cpp_demo/make_model.py does)
    import customconv
except ModuleNotFoundError as e:
    if e.name != "customconv":
        raise
    sys.path.insert(0, str(REPO / "python_stub"))
    import customconv

MODELS = ("resnet50", "mobilenet_v2", "efficientnet_b0", "convnext_tiny")
VARIANTS = ("eager", "ofi", "converted", "fused")
EXTRA_VARIANTS = ("fused_jit",)  # torch.jit.script(fused model), unless --no-script-fused
LAYOUTS = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}
SPEEDUPS = (("conv_vs_eager", "converted", "eager", "converted/eager"),
            ("fused_vs_eager", "fused", "eager", "fused/eager"),
            ("fused_vs_ofi", "fused", "ofi", "fused/ofi"),
            ("fused_jit_vs_eager", "fused_jit", "eager", "fused scripted/eager"),
            ("fused_jit_vs_ofi", "fused_jit", "ofi", "fused scripted/ofi"))


def variants_of(rows: List[dict]) -> List[str]:
    """The variants measured in these inference rows, in table order."""
    return [v for v in VARIANTS + EXTRA_VARIANTS if any(v in r for r in rows)]


def speedups_of(rows: List[dict]) -> list:
    present = variants_of(rows)
    return [s for s in SPEEDUPS if s[1] in present and s[2] in present]

# Targets (set for an H100).
TARGET_CONVERTED = 1.0  # converted / eager at N=32 inference, every case
TARGET_TRAIN = 1.0  # converted / PyTorch training step, every case
TARGET_FUSED_EAGER = 1.3  # fused / eager, geomean
TARGET_FUSED_OFI = 1.1  # fused / ofi, geomean
TARGET_FUSED_MIN = 1.0  # fused / eager, every case
TARGET_DEMO = 1.2  # C++ demo on CUDA, fused / unconverted resnet50 throughput

DEFAULTS = {  # per device: what a run without arguments does
    "cuda": dict(batches="32,1", dtypes="float32,float16", rounds=5, round_ms=80.0,
                 warmup_calls=3, warmup_s=0.2, min_iters=5, train_batch=32, demo_batch=32,
                 demo_threads=4, demo_iters=1000, demo_dtypes="float32,float16"),
    "cpu": dict(batches="4,1", dtypes="float32", rounds=3, round_ms=200.0,
                warmup_calls=2, warmup_s=0.3, min_iters=1, train_batch=4, demo_batch=1,
                demo_threads=1, demo_iters=20, demo_dtypes="float32"),
}


# ---------------------------------------------------------------- timing

class Timer:
    """bench/e2e_convert.py's ms_per_call, with the warm-up and the calls per
    round sized by time: median over rounds of the time for `iters`
    back-to-back calls, per call, in ms."""

    def __init__(self, device: str, iters: Optional[int], rounds: int, round_ms: float,
                 warmup_calls: int, warmup_s: float, min_iters: int):
        self.device, self.iters, self.rounds = device, iters, rounds
        self.round_ms, self.min_iters = round_ms, min_iters
        self.warmup_calls, self.warmup_s = warmup_calls, warmup_s

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def ms_per_call(self, fn: Callable[[], object]) -> float:
        return median_round_ms(fn, self.device, self._warm_up(fn), self.rounds)

    def ms_per_call_each(self, fns: Dict[str, Callable[[], object]]) -> Dict[str, object]:
        """ms_per_call of each callable, their rounds interleaved (a round of
        each in turn), so that a slow stretch of a busy machine falls on all of
        them rather than on one; a callable that raises gets its error's text."""
        out: Dict[str, object] = {}
        iters, times = {}, {}
        for key, fn in fns.items():
            try:
                iters[key] = self._warm_up(fn)
                times[key] = []
            except Exception as e:  # noqa: BLE001
                out[key] = f"error: {first_line(e)}"
        for _ in range(self.rounds):
            for key in list(times):
                try:
                    times[key].append(median_round_ms(fns[key], self.device, iters[key], 1))
                except Exception as e:  # noqa: BLE001
                    out[key] = f"error: {first_line(e)}"
                    del times[key]
        out.update({key: statistics.median(t) for key, t in times.items()})
        return out

    def _warm_up(self, fn: Callable[[], object]) -> int:
        """Warms fn up and returns the calls per round."""
        self._sync()
        t0 = time.perf_counter()
        calls = 0
        while calls < self.warmup_calls or time.perf_counter() - t0 < self.warmup_s:
            fn()
            calls += 1
            if calls >= self.warmup_calls:
                self._sync()
        iters = self.iters
        if iters is None and self.round_ms <= 0:
            iters = self.min_iters
        elif iters is None:  # one timed call sizes the rounds
            self._sync()
            t0 = time.perf_counter()
            fn()
            self._sync()
            one_ms = (time.perf_counter() - t0) * 1e3
            iters = max(self.min_iters, min(500, round(self.round_ms / max(one_ms, 1e-3))))
        return iters


def median_round_ms(fn: Callable[[], object], device: str, iters: int, rounds: int) -> float:
    """The median over `rounds` rounds of `iters` back-to-back calls, per call, in
    ms: CUDA events on CUDA, the wall clock on the CPU."""
    times = []
    for _ in range(rounds):
        if device == "cuda":
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            times.append((time.perf_counter() - t0) * 1e3 / iters)
    return statistics.median(times)


# ---------------------------------------------------------------- models

def make_base(name: str, seed: int) -> torch.nn.Module:
    """torchvision's `name`, random weights, with random batch-norm statistics
    and affine parameters, in eval mode, on the CPU in float32."""
    torch.manual_seed(seed)
    model = getattr(torchvision.models, name)(weights=None)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features) + 0.5)
                if m.affine:
                    m.weight.copy_(torch.rand(m.num_features) + 0.5)
                    m.bias.copy_(torch.randn(m.num_features) * 0.1)
    return model.eval()


def fuse_summary(fused) -> Optional[str]:
    """The fused model's human-readable summary: its `fuse_summary` attribute,
    else customconv.fuse_report(m)."""
    s = getattr(fused, "fuse_summary", None)
    if s is None and hasattr(customconv, "fuse_report"):
        s = customconv.fuse_report(fused)
    if s is None:
        return None
    return s if isinstance(s, str) else str(s)


def build_fused(eager: torch.nn.Module, base: torch.nn.Module, device: str,
                dtype: torch.dtype,
                fmt: torch.memory_format) -> Tuple[torch.nn.Module, Optional[str]]:
    """customconv.fuse of the model in its dtype; if that fails in a 16-bit
    dtype, fused in float32 and then cast (returned with a note saying so)."""
    if not hasattr(customconv, "fuse"):
        raise RuntimeError("customconv.fuse is not available in this package")
    note = None
    try:
        fused = customconv.fuse(copy.deepcopy(eager))
    except Exception as e:  # noqa: BLE001
        if dtype == torch.float32:
            raise
        note = (f"fuse of the {str(dtype).replace('torch.', '')} model failed "
                f"({first_line(e)}); fused in float32, then cast")
        fused = customconv.fuse(copy.deepcopy(base).to(device).to(memory_format=fmt)).to(dtype)
    # The layout of the fused model's weights is fuse's choice (memory_format="auto").
    return fused.eval(), note


def script_module(model) -> torch.jit.ScriptModule:
    """torch.jit.script of a model (of the fused model: its build's error if it had one)."""
    if isinstance(model, str):
        raise RuntimeError(f"no fused model to script ({model})")
    return model if isinstance(model, torch.jit.ScriptModule) else torch.jit.script(model)


def build_ofi(eager: torch.nn.Module) -> torch.nn.Module:
    scripted = torch.jit.script(copy.deepcopy(eager).eval())
    return torch.jit.optimize_for_inference(torch.jit.freeze(scripted))


# ---------------------------------------------------------------- helpers

def first_line(e: BaseException, limit: int = 240) -> str:
    text = str(e).strip().splitlines()
    msg = f"{type(e).__name__}: {text[0] if text else ''}"
    return msg if len(msg) <= limit else msg[:limit - 3] + "..."


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    if got.shape != want.shape:
        raise RuntimeError(f"output shape {tuple(got.shape)}, eager's {tuple(want.shape)}")
    got, want = got.detach().float(), want.detach().float()
    scale = want.abs().max().item()
    return float((got - want).abs().max().item() / (scale if scale > 0 else 1.0))


def tolerance(dtype: torch.dtype, device: str) -> float:
    """Max relative error still counted as a match (outputs' max abs difference
    over eager's max abs value). CUDA float32 convolutions run in TF32 (PyTorch's
    default), differently rounded by each implementation."""
    if dtype == torch.float32:
        return 1e-2 if device == "cuda" else 1e-3
    if dtype == torch.float16:
        return 5e-2
    return 1e-1


def geomean(xs: List[float]) -> Optional[float]:
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def fmt_ms(v) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) else "—"


def fmt_x(v) -> str:
    return f"{v:.2f}x" if isinstance(v, (int, float)) else "—"


def fmt_err(err, tol) -> str:
    if err is None:
        return "—"
    if not (err <= tol):  # NaN too
        return f"**{err:.1e} MISMATCH**"
    return f"{err:.1e}"


def free_device_memory(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- inference

def run_inference(name: str, base: torch.nn.Module, args, timer: Timer, progress,
                  notes: List[str], summaries: Dict[str, str]) -> List[dict]:
    rows = []
    device = args.device
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for layout in args.layouts:
            fmt = LAYOUTS[layout]
            t0 = time.perf_counter()
            models: Dict[str, object] = {}
            eager = copy.deepcopy(base).to(device, dtype).to(memory_format=fmt).eval()
            models["eager"] = eager
            builders = {
                "ofi": lambda: build_ofi(eager),
                "converted": lambda: customconv.convert(copy.deepcopy(eager)).eval(),
                "fused": lambda: build_fused(eager, base, device, dtype, fmt),
            }
            if args.script_fused:
                builders["fused_jit"] = lambda: script_module(models["fused"])
            for variant, build in builders.items():
                try:
                    with torch.no_grad():
                        built = build()
                    if variant == "fused":
                        built, note = built
                        if note:
                            notes.append(f"{name} {dtype_name} {layout}: {note}")
                        if name not in summaries:
                            s = fuse_summary(built)
                            if s:
                                summaries[name] = s
                    models[variant] = built
                except Exception as e:  # noqa: BLE001
                    models[variant] = f"error: {first_line(e)}"
            print(f"  built {name} {dtype_name} {layout} in {time.perf_counter() - t0:.1f} s",
                  flush=True)
            tol = tolerance(dtype, device)
            for batch in args.batches:
                torch.manual_seed(1)
                x = torch.randn(batch, 3, 224, 224, device=device, dtype=dtype)
                x = x.contiguous(memory_format=fmt)
                row = dict(model=name, batch=batch, dtype=dtype_name, layout=layout, tol=tol)
                with torch.inference_mode():
                    want = None
                    timed = {}
                    for variant in models:
                        m = models[variant]
                        if isinstance(m, str):
                            row[variant] = m
                            continue
                        try:
                            out = m(x)
                            if variant == "eager":
                                want = out.float()
                            elif want is not None:
                                row[f"{variant}_err"] = rel_err(out, want)
                            del out
                            timed[variant] = lambda m=m: m(x)
                        except Exception as e:  # noqa: BLE001
                            row[variant] = f"error: {first_line(e)}"
                    row.update(timer.ms_per_call_each(timed))
                for key, num, den, _ in SPEEDUPS:
                    if num not in row or den not in row:
                        continue
                    a, b = row.get(num), row.get(den)
                    row[key] = b / a if isinstance(a, float) and isinstance(b, float) else None
                rows.append(row)
                progress(inference_line(row))
                del x, want
            del models, eager, builders
            free_device_memory(device)
    return rows


def inference_line(r: dict) -> str:
    def ms(v):
        return f"{v:7.2f}" if isinstance(v, float) else "  error"
    variants = variants_of([r])
    flags = [v for v in variants[1:]
             if r.get(f"{v}_err") is not None and not (r[f"{v}_err"] <= r["tol"])]
    return (f"{r['model']:15s} N={r['batch']:<3d} {r['dtype']:8s} {r['layout']:13s} ms: "
            + " ".join(f"{v} {ms(r[v])}" for v in variants) + " | "
            + " ".join(f"{label} {fmt_x(r[k])}" for k, _, _, label in speedups_of([r]))
            + (f" | MISMATCH: {', '.join(flags)}" if flags else ""))


# ---------------------------------------------------------------- training

def grads_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
    """The logits and every parameter's gradient (one flat float64 vector) of
    one forward and backward in training mode, with dropout and stochastic
    depth off (so that models in different dtypes draw nothing at random)."""
    random = [m for m in model.modules()
              if isinstance(m, (torch.nn.Dropout, torchvision.ops.StochasticDepth))]
    for m in random:
        m.eval()
    model.zero_grad(set_to_none=True)
    out = model(x)
    F.cross_entropy(out, y).backward()
    grads = torch.cat([p.grad.detach().double().flatten() for p in model.parameters()
                       if p.grad is not None])
    model.zero_grad(set_to_none=True)
    for m in random:
        m.train()
    return out.detach(), grads


def norm_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm().item() / max(want.norm().item(), 1e-30))


def too_far(ours: Optional[float], theirs: Optional[float], tol: float) -> bool:
    """Ours is further from float64's result than both twice PyTorch's distance
    and the dtype's tolerance."""
    return ours is not None and theirs is not None and not (ours <= max(2 * theirs, tol))


def training_mismatch(row: dict) -> bool:
    """The converted model's logits or gradients are further from a float64
    copy's than twice PyTorch's own (and than the tolerance). Float32 training
    of a deep network with random weights is ill-conditioned (batch statistics
    of small late-stage planes, TF32 on CUDA): PyTorch's own gradients differ
    from float64's by about 1e-2 (mobilenet_v2, CPU) to over 0.5 (resnet50,
    CUDA, TF32) in norm, so a fixed tolerance would say little."""
    return (too_far(row.get("logits_err"), row.get("torch_logits_err"), row["tol"])
            or too_far(row.get("grad_err"), row.get("torch_grad_err"), row["tol"]))


def run_training(name: str, base: torch.nn.Module, args, timer: Timer, progress) -> List[dict]:
    rows = []
    device, batch = args.device, args.train_batch
    tol = tolerance(torch.float32, device)
    for layout in args.layouts:
        fmt = LAYOUTS[layout]
        row = dict(model=name, batch=batch, dtype="float32", layout=layout, tol=tol)
        try:
            theirs = copy.deepcopy(base).to(device).to(memory_format=fmt).train()
            ours = customconv.convert(copy.deepcopy(base)).to(device).to(memory_format=fmt).train()
            torch.manual_seed(2)
            x = torch.randn(batch, 3, 224, 224, device=device).contiguous(memory_format=fmt)
            y = torch.randint(0, 1000, (batch,), device=device)

            try:  # the check against a float64 copy; a failure here still lets the timing run
                ref = copy.deepcopy(base).to(device, torch.float64).to(memory_format=fmt).train()
                outs = [grads_of(m, xx, y)
                        for m, xx in ((theirs, x), (ours, x), (ref, x.double()))]
                (out_t, g_t), (out_o, g_o), (out_64, g_64) = outs
                row["logits_err"] = rel_err(out_o, out_64)
                row["torch_logits_err"] = rel_err(out_t, out_64)
                row["grad_err"] = norm_err(g_o, g_64)
                row["torch_grad_err"] = norm_err(g_t, g_64)
                del outs, out_t, g_t, out_o, g_o, out_64, g_64, ref
            except Exception as e:  # noqa: BLE001
                row["check_error"] = f"error: {first_line(e)}"
            free_device_memory(device)
            steps = {}
            for side, model in (("torch", theirs), ("converted", ours)):
                opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

                def step(model=model, opt=opt):
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(model(x), y).backward()
                    opt.step()

                steps[side] = step
            row.update(timer.ms_per_call_each(steps))
            del steps
            del theirs, ours, x, y
        except Exception as e:  # noqa: BLE001
            row.setdefault("torch", f"error: {first_line(e)}")
            row.setdefault("converted", f"error: {first_line(e)}")
        a, b = row.get("converted"), row.get("torch")
        row["speedup"] = b / a if isinstance(a, float) and isinstance(b, float) else None
        rows.append(row)
        flag = " | MISMATCH" if training_mismatch(row) else ""
        if "check_error" in row:
            flag += f" | check failed: {row['check_error']}"
        progress(f"{name:15s} N={batch:<3d} float32  {layout:13s} training step ms: "
                 f"PyTorch {fmt_ms(row['torch']):>7s} converted {fmt_ms(row['converted']):>7s} "
                 f"| {fmt_x(row['speedup'])}{flag}")
        free_device_memory(device)
    return rows


# ---------------------------------------------------------------- C++ demo

DEMO_PATTERNS = {
    "latency": re.compile(r"^latency:\s*p50 ([0-9.]+) ms, p90 ([0-9.]+) ms, p99 ([0-9.]+) ms", re.M),
    "throughput": re.compile(r"^throughput:\s*([0-9.eE+-]+) requests/s", re.M),
    "result": re.compile(r"^result:\s*(.*)$", re.M),
}


def run_demo_binary(binary: Path, model: Path, inputs: Path, expected: Path, device: str,
                    threads: int, iters: int, rtol: float, atol: float) -> dict:
    cmd = [str(binary), "--model", str(model), "--inputs", str(inputs), "--expected", str(expected),
           "--device", device, "--threads", str(threads), "--iters", str(iters),
           "--rtol", f"{rtol:g}", "--atol", f"{atol:g}"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return dict(error="error: customconv_demo ran over 600 s")
    out = p.stdout
    res = {"rc": p.returncode}
    m = DEMO_PATTERNS["latency"].search(out)
    if m:
        res["p50"], res["p90"], res["p99"] = (float(v) for v in m.groups())
    m = DEMO_PATTERNS["throughput"].search(out)
    if m:
        res["throughput"] = float(m.group(1))
    m = DEMO_PATTERNS["result"].search(out)
    res["result"] = m.group(1).strip() if m else None
    if p.returncode != 0 or "throughput" not in res:
        tail = (p.stderr.strip() or out.strip()).splitlines()[-3:]
        res["error"] = f"error: exit {p.returncode}: " + " / ".join(tail)[:300]
    return res


def run_demo(name: str, base: torch.nn.Module, args, progress, notes: List[str]) -> List[dict]:
    rows = []
    device, batch = args.device, args.demo_batch
    for dtype_name in args.demo_dtypes:
        dtype = getattr(torch, dtype_name)
        tol = tolerance(dtype, device)
        for layout in args.demo_layouts:
            fmt = LAYOUTS[layout]
            row = dict(model=name, device=device, batch=batch, dtype=dtype_name, layout=layout,
                       threads=args.demo_threads, iters=args.demo_iters)
            with tempfile.TemporaryDirectory(prefix="customconv-e2e-") as tmp:
                tmp = Path(tmp)
                try:
                    eager = copy.deepcopy(base).to(device, dtype).to(memory_format=fmt).eval()
                    torch.manual_seed(4)
                    x = torch.randn(batch, 3, 224, 224, dtype=dtype).contiguous(memory_format=fmt)
                    with torch.inference_mode():
                        want = eager(x.to(device)).cpu().clone()
                    torch.save([x], tmp / "inputs.pt")
                    torch.save(want, tmp / "expected.pt")
                    scale = want.float().abs().max().item()
                    rtol, atol = tol, tol * (scale if scale > 0 else 1.0)
                    row["rtol"], row["atol"] = rtol, atol
                    with torch.no_grad():
                        torch.jit.script(eager).save(str(tmp / "unconverted.pt"))
                except Exception as e:  # noqa: BLE001
                    row["unconverted"] = dict(error=f"error: {first_line(e)}")
                    row["fused"] = dict(error=f"error: {first_line(e)}")
                else:
                    try:
                        with torch.no_grad():
                            fused, note = build_fused(eager, base, device, dtype, fmt)
                            if note:
                                notes.append(f"demo {name} {dtype_name} {layout}: {note}")
                            if not isinstance(fused, torch.jit.ScriptModule):
                                fused = torch.jit.script(fused)
                            fused.save(str(tmp / "fused.pt"))
                    except Exception as e:  # noqa: BLE001
                        row["fused"] = dict(error=f"error: {first_line(e)}")
                    del eager
                    free_device_memory(device)
                    for variant in ("unconverted", "fused"):
                        if variant in row:
                            continue
                        row[variant] = run_demo_binary(
                            args.demo_binary, tmp / f"{variant}.pt", tmp / "inputs.pt",
                            tmp / "expected.pt", device, args.demo_threads, args.demo_iters,
                            rtol, atol)
            for variant in ("unconverted", "fused"):
                d = row[variant]
                if d.get("p50"):  # Little's law: T requests always in flight
                    d["steady"] = min(args.demo_threads, args.demo_iters) * 1e3 / d["p50"]
            u, f = row["unconverted"].get("throughput"), row["fused"].get("throughput")
            row["ratio"] = f / u if u and f else None
            u, f = row["unconverted"].get("steady"), row["fused"].get("steady")
            row["steady_ratio"] = f / u if u and f else None
            rows.append(row)

            def side(r):
                if "throughput" not in r:
                    return r.get("error", "error")
                return (f"p50 {r['p50']:.2f} p99 {r['p99']:.2f} ms {r['throughput']:.1f} req/s"
                        + ("" if r.get("rc") == 0 else f" [{r.get('result')}]"))
            progress(f"{name:15s} N={batch:<3d} {dtype_name:8s} {layout:13s} C++ demo {device} "
                     f"T={args.demo_threads}: unconverted {side(row['unconverted'])} | fused "
                     f"{side(row['fused'])} | {fmt_x(row['ratio'])} (T/p50 "
                     f"{fmt_x(row['steady_ratio'])})")
    return rows


# ---------------------------------------------------------------- report

def evaluate_targets(device: str, inf: List[dict], train: List[dict], demo: List[dict],
                     args) -> List[dict]:
    """Each target as {name, status: PASS / FAIL / n/a, detail}."""
    out = []

    def failed(n):
        return f", {n} failed" if n else ""

    def add(name, ok, detail):
        out.append(dict(target=name, status="n/a" if ok is None else ("PASS" if ok else "FAIL"),
                        detail=detail))

    big = 32 if 32 in args.batches else max(args.batches)
    sel = [r for r in inf if r["batch"] == big]
    vals = [r["conv_vs_eager"] for r in sel]
    missing = sum(v is None for v in vals)
    worst = min((v for v in vals if v is not None), default=None)
    add(f"converted >= {TARGET_CONVERTED:.1f}x eager at N={big} inference, every case",
        None if not sel else (missing == 0 and worst >= TARGET_CONVERTED),
        f"min {fmt_x(worst)} over {len(sel) - missing} cases" + failed(missing))

    vals = [r["speedup"] for r in train]
    missing = sum(v is None for v in vals)
    worst = min((v for v in vals if v is not None), default=None)
    add(f"float32 training step, converted >= {TARGET_TRAIN:.1f}x PyTorch, every case",
        None if not train else (missing == 0 and worst >= TARGET_TRAIN),
        f"min {fmt_x(worst)} over {len(train) - missing} cases" + failed(missing))

    fe = [r["fused_vs_eager"] for r in inf]
    # optimize_for_inference's model is TorchScript: compared with the fused
    # model scripted where that was timed (both without Python's per-call cost).
    scripted = any(r.get("fused_jit_vs_ofi") is not None for r in inf)
    fo = [r["fused_jit_vs_ofi" if scripted else "fused_vs_ofi"] for r in inf]
    missing = sum(v is None for v in fe)
    g = geomean(fe)
    add(f"fused geomean >= {TARGET_FUSED_EAGER:.1f}x eager",
        None if not inf else (missing == 0 and g is not None and g >= TARGET_FUSED_EAGER),
        f"geomean {fmt_x(g)} over {len(fe) - missing} cases" + failed(missing))
    mo = sum(v is None for v in fo)
    go = geomean(fo)
    add(f"fused{' scripted' if scripted else ''} geomean >= {TARGET_FUSED_OFI:.1f}x "
        "optimize_for_inference",
        None if not inf else (mo == 0 and go is not None and go >= TARGET_FUSED_OFI),
        f"geomean {fmt_x(go)} over {len(fo) - mo} cases" + (f", {mo} without a ratio" if mo else ""))
    worst = min((v for v in fe if v is not None), default=None)
    add(f"fused >= {TARGET_FUSED_MIN:.1f}x eager, every case",
        None if not inf else (missing == 0 and worst >= TARGET_FUSED_MIN),
        f"min {fmt_x(worst)}" + (f", {missing} failed" if missing else ""))

    sel = [r for r in demo if r["model"] == "resnet50" and r["device"] == "cuda"]
    vals = [r["ratio"] for r in sel]
    missing = sum(v is None for v in vals)
    bad = sum(r[v].get("rc") not in (0, None) for r in sel for v in ("unconverted", "fused"))
    worst = min((v for v in vals if v is not None), default=None)
    steady = min((r["steady_ratio"] for r in sel if r["steady_ratio"] is not None), default=None)
    add(f"C++ demo on CUDA, fused resnet50 throughput >= {TARGET_DEMO:.1f}x unconverted scripted",
        None if not sel else (missing == 0 and bad == 0 and worst >= TARGET_DEMO),
        "not run on CUDA" if not sel else
        f"min {fmt_x(worst)} over {len(sel) - missing} cases (T/p50: min {fmt_x(steady)})"
        + (f", {missing} failed" if missing else "")
        + (f", {bad} run(s) with a mismatch or error" if bad else ""))
    return out


def pair_cell(r: dict, ours: str, theirs: str) -> str:
    g, gt = r.get(ours), r.get(theirs)
    if g is None or gt is None:
        return "—"
    text = f"{g:.1e} / {gt:.1e}"
    return f"**{text} MISMATCH**" if too_far(g, gt, r["tol"]) else text


def markdown(meta: dict, inf: List[dict], train: List[dict], demo: List[dict],
             targets: List[dict], summaries: Dict[str, str], notes: List[str]) -> str:
    title = ("eager, optimize_for_inference, convert and fuse" if inf or not train
             else "float32 training steps, PyTorch against convert")
    L = [f"# End to end: {title} on {meta['device_name']}", ""]
    L += [f"torch {meta['torch']}, torchvision {meta['torchvision']}, customconv "
          f"{meta['customconv']}; {meta['settings']}.", "",
          "224x224 inputs, random weights with random batch-norm statistics. ms per call (median of "
          "rounds, a case's variants timed in turn); speedup = the other's ms / ours (above 1: ours is faster)."
          + (" \"ofi\" = "
             "`torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.script(model)))`. Max rel "
             "err = max |output - eager's| / max |eager's|, flagged MISMATCH above the dtype's "
             "tolerance." if inf or not train else ""), ""]
    footnotes: List[str] = []

    def cell(v, what):
        if isinstance(v, str):
            footnotes.append(f"{what}: {v}")
            return f"error [{len(footnotes)}]"
        return fmt_ms(v)

    variants, speedups = variants_of(inf), speedups_of(inf)
    titles = {"fused_jit": "fused scripted"}
    if inf or not train:
        L += ["## Inference", "",
              "| model | N | dtype | layout | "
              + " | ".join(f"{titles.get(v, v)} ms" for v in variants) + " | "
              + " | ".join(label for *_, label in speedups) + " | max rel err "
              + " / ".join(titles.get(v, v) for v in variants[1:]) + " |",
              "|---|---:|---|---|" + "---:|" * (len(variants) + len(speedups)) + "---|"]
    for r in inf:
        case = f"{r['model']} N={r['batch']} {r['dtype']} {r['layout']}"
        errs = " / ".join(fmt_err(r.get(f"{v}_err"), r["tol"]) for v in variants[1:])
        L.append(f"| {r['model']} | {r['batch']} | {r['dtype']} | {r['layout']} | "
                 + " | ".join(cell(r.get(v), f"{case} {v}") for v in variants) + " | "
                 + " | ".join(fmt_x(r.get(k)) for k, *_ in speedups) + f" | {errs} |")
    if inf:
        L += ["", "Geomeans of the speedups (cases with both timings):", "",
              "| group | " + " | ".join(label for *_, label in speedups) + " | cases |",
              "|---|" + "---:|" * (len(speedups) + 1)]
        groups: List[Tuple[str, List[dict]]] = [("all", inf)]
        for key in ("batch", "dtype", "layout", "model"):
            for v in dict.fromkeys(r[key] for r in inf):
                groups.append((f"{'N' if key == 'batch' else key}={v}",
                               [r for r in inf if r[key] == v]))
        for label, rs in groups:
            L.append(f"| {label} | " + " | ".join(fmt_x(geomean([r.get(k) for r in rs]))
                                                  for k, *_ in speedups) + f" | {len(rs)} |")
    if train:
        L += ["", "## Training step (float32)", "",
              "One SGD step: forward, cross-entropy on random labels, backward, optimizer.step. "
              "Checked before timing, with dropout off, both models against a float64 copy: "
              "the logits (max rel err) and all parameters' gradients (norm of the difference "
              "over the norm); flagged MISMATCH where ours is further from float64's than "
              "twice PyTorch's own distance and the tolerance.", "",
              "| model | N | layout | PyTorch ms | converted ms | speedup | logits err "
              "converted / PyTorch | grad err converted / PyTorch |",
              "|---|---:|---|---:|---:|---:|---:|---:|"]
        for r in train:
            case = f"training {r['model']} {r['layout']}"
            L.append(f"| {r['model']} | {r['batch']} | {r['layout']} | "
                     f"{cell(r['torch'], case + ' PyTorch')} | "
                     f"{cell(r['converted'], case + ' converted')} | {fmt_x(r['speedup'])} | "
                     f"{pair_cell(r, 'logits_err', 'torch_logits_err')} | "
                     + (f"{pair_cell(r, 'grad_err', 'torch_grad_err')} |" if "check_error" not in r
                        else f"{cell(r['check_error'], case + ' check')} |"))
    if demo:
        L += ["", "## C++ demo (customconv_demo)", "",
              "Both models scripted (`torch.jit.script`) and saved; customconv_demo serves "
              f"{demo[0]['iters']} requests on `T` threads at once (on CUDA each thread on its "
              "own stream) and checks every output against eager PyTorch's. Latency per request "
              "in ms; throughput in requests/s as the demo measures it (requests over the wall "
              "time of the serving threads, from when each has run an untimed warm-up request "
              "of its own; images/s = requests/s x N), and in brackets T / p50 (the "
              "steady-state rate with T requests always in flight).", "",
              "| model | device | N | dtype | layout | T | unconverted p50 / p90 / p99 | "
              "fused p50 / p90 / p99 | unconverted req/s (T/p50) | fused req/s (T/p50) | "
              "fused/unconverted (T/p50) |",
              "|---|---|---:|---|---|---:|---|---|---:|---:|---:|"]
        for r in demo:
            lat, rate = [], []
            for variant in ("unconverted", "fused"):
                d = r[variant]
                if "throughput" in d:
                    bad = "" if d.get("rc") == 0 else f" ({d.get('result') or d.get('error')})"
                    lat.append(f"{d['p50']:.2f} / {d['p90']:.2f} / {d['p99']:.2f}{bad}")
                    rate.append(f"{d['throughput']:.1f} ({d['steady']:.1f})")
                else:
                    footnotes.append(f"demo {r['model']} {r['dtype']} {r['layout']} {variant}: "
                                     f"{d.get('error', 'error')}")
                    lat.append(f"error [{len(footnotes)}]")
                    rate.append("—")
            L.append(f"| {r['model']} | {r['device']} | {r['batch']} | {r['dtype']} | "
                     f"{r['layout']} | {r['threads']} | " + " | ".join(lat + rate)
                     + f" | {fmt_x(r['ratio'])} ({fmt_x(r['steady_ratio'])}) |")
    L += ["", "## Targets", "", "Set for an H100; on other devices they are for reference.", "",
          "| target | status | measured |", "|---|---|---|"]
    for t in targets:
        if inf or t["status"] != "n/a":  # a training-only report: its own target alone
            L.append(f"| {t['target']} | {t['status']} | {t['detail']} |")
    if footnotes:
        L += ["", "## Errors", ""] + [f"{i}. {f}" for i, f in enumerate(footnotes, 1)]
    if notes:
        L += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    if summaries:
        L += ["", "## What fuse did", ""]
        for name, s in summaries.items():
            lines = s.strip().splitlines()
            shown = lines[:40] + ([f"... ({len(lines) - 40} more lines)"] if len(lines) > 40 else [])
            L += [f"{name}:", "", "```"] + shown + ["```", ""]
    return "\n".join(L).rstrip() + "\n"


SHORT_NAMES = {"resnet50": "RN50", "mobilenet_v2": "MNv2", "efficientnet_b0": "EffB0",
               "convnext_tiny": "CNXt-T"}


def short_case(r: dict, dtype: bool = True) -> str:
    name = SHORT_NAMES.get(r["model"], r["model"])
    layout = "CL" if r["layout"] == "channels_last" else "NCHW"
    dt = r["dtype"].replace("float", "f") if dtype else ""
    return f"{name}\nN={r['batch']} {dt}\n{layout}".replace(" \n", "\n")


def chart(path: Path, meta: dict, inf: List[dict], train: List[dict], demo: List[dict]) -> bool:
    """Bar charts of the speedups: inference on top, training and the C++ demo
    below; dashed lines mark the targets."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    if not (inf or train or demo):
        return False
    bottom = [p for p in (("training", train), ("demo", demo)) if p[1]]
    rows = (1 if inf else 0) + (1 if bottom else 0)
    fig = plt.figure(figsize=(max(10.0, 0.5 * len(inf) + 2), 4.5 * rows))
    grid = fig.add_gridspec(rows, max(1, len(bottom)),
                            width_ratios=[max(len(r), 2) for _, r in bottom] or [1])

    def bars(ax, labels, series, title, targets):
        n = len(series)
        w = 0.8 / n
        for i, (label, vals) in enumerate(series):
            xs = [j + (i - (n - 1) / 2) * w for j in range(len(labels))]
            heights = [v if v is not None else 0 for v in vals]
            ax.bar(xs, heights, w, label=label)
            if len(labels) * n <= 16:
                for x, v in zip(xs, vals):
                    ax.text(x, v if v else 0, fmt_x(v), ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="black", linewidth=0.8)
        for value, label in targets:
            ax.axhline(value, color="gray", linewidth=0.8, linestyle="--")
            ax.text(len(labels) - 0.5, value, f" {label}", fontsize=7, va="bottom", ha="right",
                    color="gray")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_xlim(-0.6, len(labels) - 0.4)
        top = max([v for _, vals in series for v in vals if v is not None and math.isfinite(v)]
                  + [t for t, _ in targets] + [1.0])
        ax.set_ylim(0, top * 1.12)
        ax.set_ylabel("speedup (x)")
        ax.set_title(title, fontsize=10)
        if n > 1:
            ax.legend(fontsize=8, loc="upper left")

    if inf:
        bars(fig.add_subplot(grid[0, :]), [short_case(r) for r in inf],
             [(label, [r.get(k) for r in inf]) for k, _, _, label in speedups_of(inf)],
             "inference: speedups over PyTorch eager and optimize_for_inference (ofi); "
             "missing bar: a variant failed",
             [(TARGET_FUSED_EAGER, f"fused/eager geomean target {TARGET_FUSED_EAGER}x")])
    for col, (kind, rs) in enumerate(bottom):
        ax = fig.add_subplot(grid[rows - 1, col])
        if kind == "training":
            bars(ax, [short_case(r, dtype=False) for r in rs],
                 [("converted/PyTorch", [r["speedup"] for r in rs])],
                 "float32 training step: converted over PyTorch", [])
        else:
            bars(ax, [f"{short_case(r)}\n{r['device']} T={r['threads']}" for r in rs],
                 [("measured", [r["ratio"] for r in rs]),
                  ("T/p50", [r["steady_ratio"] for r in rs])],
                 "C++ demo: fused/unconverted throughput",
                 [(TARGET_DEMO, f"target {TARGET_DEMO}x")] if meta["device"] == "cuda" else [])
    fig.suptitle(f"customconv end to end, {meta['device_name']}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---------------------------------------------------------------- main

def parse_args(argv: List[str]):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--render", type=Path, metavar="JSON",
                   help="only write the .md and .png of an earlier run's .json again")
    p.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                   help="only merge earlier runs' .json (different models) into one report "
                        "under --out")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batches", help="default 32,1 on cuda, 4,1 on cpu")
    p.add_argument("--dtypes", help="default float32,float16 on cuda, float32 on cpu")
    p.add_argument("--layouts", default="nchw,channels_last")
    p.add_argument("--iters", type=int, help="calls per timed round (default: sized by time)")
    p.add_argument("--rounds", type=int, help="timed rounds, the median is kept (default 5 on "
                                              "cuda, 3 on cpu)")
    p.add_argument("--no-script-fused", dest="script_fused", action="store_false",
                   help="do not also time torch.jit.script(fused model) (\"fused scripted\")")
    p.add_argument("--no-train", action="store_true", help="skip the training step")
    p.add_argument("--no-inference", action="store_true",
                   help="skip inference: a report of the training steps (and the demo unless "
                        "--no-demo) alone, written as training-<device>.*")
    p.add_argument("--train-batch", type=int, help="default 32 on cuda, 4 on cpu")
    p.add_argument("--no-demo", action="store_true", help="skip the C++ demo")
    p.add_argument("--demo-binary", type=Path,
                   default=Path(os.environ.get("CUSTOMCONV_DEMO",
                                               REPO / "build" / "customconv_demo")))
    p.add_argument("--demo-models", help="default: --models on cuda; on cpu resnet50 if in "
                                         "--models, else the first of them")
    p.add_argument("--demo-dtypes", help="default float32,float16 on cuda, float32 on cpu")
    p.add_argument("--demo-layouts", default="channels_last")
    p.add_argument("--demo-batch", type=int, help="default 32 on cuda, 1 on cpu")
    p.add_argument("--demo-threads", type=int, help="request threads, the same for both models "
                                                    "(default 4 on cuda, 1 on cpu)")
    p.add_argument("--demo-iters", type=int, help="requests per demo run (default 1000 on cuda, "
                                                  "20 on cpu)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "e2e")
    args = p.parse_args(argv)
    d = DEFAULTS[args.device]
    args.batches = [int(b) for b in (args.batches or d["batches"]).split(",")]
    args.dtypes = (args.dtypes or d["dtypes"]).split(",")
    args.demo_dtypes = (args.demo_dtypes or d["demo_dtypes"]).split(",")
    args.rounds = args.rounds or d["rounds"]
    for k in ("train_batch", "demo_batch", "demo_threads", "demo_iters"):
        if getattr(args, k) is None:
            setattr(args, k, d[k])
    args.models = args.models.split(",")
    if args.demo_models is None and args.device == "cuda":
        args.demo_models = ",".join(args.models)
    elif args.demo_models is None:
        args.demo_models = "resnet50" if "resnet50" in args.models else args.models[0]
    args.demo_models = [m for m in args.demo_models.split(",") if m]
    args.layouts = [s.lower() for s in args.layouts.split(",")]
    args.demo_layouts = [s.lower() for s in args.demo_layouts.split(",")]
    for name in args.models + args.demo_models:
        if not hasattr(torchvision.models, name):
            p.error(f"unknown torchvision model {name!r}")
    for layout in args.layouts + args.demo_layouts:
        if layout not in LAYOUTS:
            p.error(f"unknown layout {layout!r} (nchw or channels_last)")
    for dt in args.dtypes + args.demo_dtypes:
        if not isinstance(getattr(torch, dt, None), torch.dtype):
            p.error(f"unknown dtype {dt!r}")
    if not (args.render or args.merge) and args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device (use --device cpu)")
    return args


def merge(json_paths: List[Path], out: Path) -> None:
    """One report from runs over different models (a run split to fit a time
    limit): their rows together, the targets evaluated again over all of them."""
    runs = [json.loads(p.read_text()) for p in json_paths]
    meta = dict(runs[0]["meta"])
    meta["args"] = dict(meta["args"])
    meta["args"]["models"] = [m for r in runs for m in r["meta"]["args"]["models"]]
    meta["args"]["demo_models"] = [m for r in runs for m in r["meta"]["args"].get("demo_models") or []]
    meta["seconds"] = round(sum(r["meta"]["seconds"] for r in runs), 1)
    meta["merged_from"] = len(runs)
    rows = {k: [x for r in runs for x in r[k]] for k in ("inference", "training", "demo", "notes")}
    summaries = {k: v for r in runs for k, v in r["fuse_summaries"].items()}
    args = argparse.Namespace(**meta["args"])
    targets = evaluate_targets(meta["device"], rows["inference"], rows["training"], rows["demo"], args)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"fused-{meta['device']}"
    stem.with_suffix(".json").write_text(json.dumps(
        dict(meta=meta, inference=rows["inference"], training=rows["training"], demo=rows["demo"],
             targets=targets, fuse_summaries=summaries, notes=rows["notes"]),
        indent=1, default=str) + "\n")
    render(stem.with_suffix(".json"))


def render(json_path: Path) -> None:
    """Writes the .md (and .png) of a results .json again, beside it."""
    r = json.loads(json_path.read_text())
    json_path.with_suffix(".md").write_text(markdown(
        r["meta"], r["inference"], r["training"], r["demo"], r["targets"], r["fuse_summaries"],
        r["notes"]))
    chart(json_path.with_suffix(".png"), r["meta"], r["inference"], r["training"], r["demo"])
    print(f"wrote {json_path.with_suffix('.md')}")


def main(argv: List[str]) -> int:
    args = parse_args(argv)
    if args.render:
        render(args.render)
        return 0
    if args.merge:
        merge(args.merge, args.out)
        return 0
    d = DEFAULTS[args.device]
    timer = Timer(args.device, args.iters, args.rounds, d["round_ms"], d["warmup_calls"],
                  d["warmup_s"], d["min_iters"])
    device_name = (torch.cuda.get_device_name() if args.device == "cuda"
                   else f"CPU ({platform.processor() or platform.machine()}, "
                        f"{torch.get_num_threads()} threads)")
    settings = [f"{torch.get_num_threads()} intra-op threads"]
    if args.device == "cuda":
        settings = [f"cuDNN {torch.backends.cudnn.version()}",
                    f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}",
                    f"cudnn.benchmark={torch.backends.cudnn.benchmark}"]
    meta = dict(device=args.device, device_name=device_name, torch=torch.__version__,
                torchvision=torchvision.__version__, customconv=customconv.__version__,
                settings=", ".join(settings),
                has_conv2d_fused=hasattr(torch.ops.customconv, "conv2d_fused"),
                has_fuse=hasattr(customconv, "fuse"),
                args={k: (shown_path(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                timing=dict(iters=args.iters or (f"sized to ~{d['round_ms']:g} ms a round"
                                                 if d["round_ms"] > 0 else d["min_iters"]),
                            rounds=args.rounds, warmup_calls=d["warmup_calls"],
                            warmup_s=d["warmup_s"]))
    n_inf = (0 if args.no_inference else
             len(args.models) * len(args.batches) * len(args.dtypes) * len(args.layouts))
    n_train = 0 if args.no_train else len(args.models) * len(args.layouts)
    demo_binary_ok = args.demo_binary.is_file() and os.access(args.demo_binary, os.X_OK)
    demo_models = [] if args.no_demo else args.demo_models
    n_demo = len(demo_models) * len(args.demo_dtypes) * len(args.demo_layouts)
    notes: List[str] = []
    if not args.no_demo and not demo_binary_ok:
        notes.append(f"C++ demo skipped: no executable {args.demo_binary}")
        demo_models, n_demo = [], 0
    if not meta["has_fuse"]:
        notes.append("customconv.fuse is not in this package: the fused variant was not measured")
    total = n_inf + n_train + n_demo
    print(f"e2e: {device_name}; {n_inf} inference, {n_train} training, {n_demo} demo cases; "
          f"torch {torch.__version__}, customconv {customconv.__version__}", flush=True)
    for n in notes:
        print(f"e2e: {n}", flush=True)
    done = [0]
    t_start = time.perf_counter()

    def progress(line: str) -> None:
        done[0] += 1
        print(f"[{done[0]:>3d}/{total}] {time.perf_counter() - t_start:6.0f}s  {line}", flush=True)

    inf, train, demo = [], [], []
    summaries: Dict[str, str] = {}
    for name in dict.fromkeys(args.models + demo_models):
        base = make_base(name, seed=0)
        try:
            if name in args.models:
                if not args.no_inference:
                    inf += run_inference(name, base, args, timer, progress, notes, summaries)
                if not args.no_train:
                    train += run_training(name, base, args, timer, progress)
            if name in demo_models:
                demo += run_demo(name, base, args, progress, notes)
        except Exception:  # noqa: BLE001  (a bug of this script: keep the rest)
            traceback.print_exc()
            last = traceback.format_exc().splitlines()[-1]
            notes.append(f"{name}: the benchmark stopped early: {last}")
        del base
        free_device_memory(args.device)

    targets = evaluate_targets(args.device, inf, train, demo, args)
    meta["seconds"] = round(time.perf_counter() - t_start, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{'training' if args.no_inference else 'fused'}-{args.device}"
    stem.with_suffix(".json").write_text(json.dumps(
        dict(meta=meta, inference=inf, training=train, demo=demo, targets=targets,
             fuse_summaries=summaries, notes=notes), indent=1, default=str) + "\n")
    stem.with_suffix(".md").write_text(markdown(meta, inf, train, demo, targets, summaries, notes))
    png = chart(stem.with_suffix(".png"), meta, inf, train, demo)

    print(f"\nSummary ({device_name}, {meta['seconds']:.0f} s):")
    if inf:
        print(f"  {'geomean':24s} converted/eager {fmt_x(geomean([r['conv_vs_eager'] for r in inf]))}"
              f"  fused/eager {fmt_x(geomean([r['fused_vs_eager'] for r in inf]))}"
              f"  fused/ofi {fmt_x(geomean([r['fused_vs_ofi'] for r in inf]))}")
        for name in args.models:
            rs = [r for r in inf if r["model"] == name]
            print(f"  {name:24s} converted/eager {fmt_x(geomean([r['conv_vs_eager'] for r in rs]))}"
                  f"  fused/eager {fmt_x(geomean([r['fused_vs_eager'] for r in rs]))}"
                  f"  fused/ofi {fmt_x(geomean([r['fused_vs_ofi'] for r in rs]))}")
    if any("fused_jit" in r for r in inf):
        print(f"  {'geomean, fused scripted':24s} fused scripted/eager "
              f"{fmt_x(geomean([r.get('fused_jit_vs_eager') for r in inf]))}  fused scripted/ofi "
              f"{fmt_x(geomean([r.get('fused_jit_vs_ofi') for r in inf]))}")
    if train:
        print(f"  {'training (geomean)':24s} converted/PyTorch "
              f"{fmt_x(geomean([r['speedup'] for r in train]))}")
    for r in demo:
        print(f"  demo {r['model']:15s} {r['dtype']:8s} {r['layout']:<13s} fused/unconverted "
              f"throughput {fmt_x(r['ratio'])} (T/p50 {fmt_x(r['steady_ratio'])})")
    for t in targets:
        print(f"  {t['status']:4s}  {t['target']}: {t['detail']}")
    errors = sum(isinstance(r.get(v), str) for r in inf for v in VARIANTS + EXTRA_VARIANTS)
    if errors:
        print(f"  {errors} inference variant(s) failed; see the Errors section")
    print(f"wrote {stem}.json, {stem}.md" + (f", {stem}.png" if png else " (no PNG: matplotlib is "
                                                                           "not installed)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
