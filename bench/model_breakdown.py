"""Where a whole model's GPU time goes, kernel by kernel: PyTorch eager
against customconv.convert(model) and customconv.fuse(model) (its automatic
weight layout, and channels_last weights), inference.

    python3 bench/model_breakdown.py [--model convnext_tiny] [--dtype float16]
        [--layout nchw|channels_last] [--batch 32] [--reps 10] [--top 15]
        [--host] [--train]

With --train it compares one float32 SGD training step (forward,
cross-entropy, backward, optimizer step) of eager PyTorch and of the
converted model instead.

For each variant it prints the time per forward (CUDA events) and the CUDA
kernels that take the most time per forward, with their launch counts, so that
a slow variant can be traced to the layers that make it slow.
"""

import argparse
import copy
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python_stub"))
import customconv  # noqa: E402
from e2e import make_base  # noqa: E402


def grad_mode(fn):
    """Autograd on for a training step (train_step), off for inference."""
    return torch.set_grad_enabled(getattr(fn, "train_step", False))


def per_forward_ms(fn, x, reps):
    with grad_mode(fn):
        for _ in range(3):
            fn(x)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn(x)
        end.record()
        torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def kernels(fn, x, reps):
    with grad_mode(fn):
        fn(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn(x)
            torch.cuda.synchronize()
    rows = [(e.device_time_total / reps / 1000, e.count // reps, e.key) for e in prof.key_averages()
            if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0]
    return sorted(rows, reverse=True)


def host_ops(fn, x, reps):
    """The operators taking the most host (CPU) time per forward, self time."""
    with grad_mode(fn):
        fn(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(reps):
                fn(x)
            torch.cuda.synchronize()
    rows = [(e.self_cpu_time_total / reps / 1000, e.count // reps, e.key) for e in prof.key_averages()]
    return sorted(rows, reverse=True)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="convnext_tiny")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--layout", default="nchw", choices=["nchw", "channels_last"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--host", action="store_true", help="also the operators' host time per forward")
    p.add_argument("--train", action="store_true", help="a float32 training step instead of inference")
    a = p.parse_args(argv)
    dtype = getattr(torch, a.dtype)
    fmt = torch.channels_last if a.layout == "channels_last" else torch.contiguous_format
    base = make_base(a.model, 0)
    if a.train:
        dtype, a.dtype = torch.float32, "float32 training step"
        y = torch.randint(0, 1000, (a.batch,), device="cuda")
        variants = {name: train_step(model.to("cuda").to(memory_format=fmt).train(), y)
                    for name, model in (("eager", copy.deepcopy(base)),
                                        ("converted", customconv.convert(copy.deepcopy(base))))}
        x = torch.randn(a.batch, 3, 224, 224, device="cuda").contiguous(memory_format=fmt)
        report(a, variants, x)
        return
    eager = copy.deepcopy(base).to("cuda", dtype).to(memory_format=fmt)
    variants = {"eager": eager,
                "converted": customconv.convert(copy.deepcopy(base)).to("cuda", dtype).to(memory_format=fmt),
                "fused": customconv.fuse(copy.deepcopy(base).to("cuda", dtype)),
                "fused, channels_last weights": customconv.fuse(copy.deepcopy(base).to("cuda", dtype),
                                                                memory_format=torch.channels_last)}
    x = torch.randn(a.batch, 3, 224, 224, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    report(a, variants, x)


def train_step(model, y):
    """One SGD step of `model` on labels y, as a callable of the input."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step(x):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    step.train_step = True
    return step


def report(a, variants, x):
    print(f"{a.model} {a.dtype} {a.layout} N={a.batch} on {torch.cuda.get_device_name()}")
    for name, model in variants.items():
        ms = per_forward_ms(model, x, a.reps)
        rows = kernels(model, x, a.reps)
        total = sum(r[0] for r in rows)
        print(f"\n## {name}: {ms:.3f} ms per forward (kernels {total:.3f} ms)")
        for t, n, key in rows[:a.top]:
            print(f"  {t:8.3f} ms  x{n:<4d} {key[:110]}")
        if a.host:
            host = host_ops(model, x, a.reps)
            print(f"  host: {sum(r[0] for r in host):.3f} ms self time per forward")
            for t, n, key in host[:a.top]:
                print(f"  {t:8.3f} ms  x{n:<4d} {key[:110]}")


if __name__ == "__main__":
    main(sys.argv[1:])
