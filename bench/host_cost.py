"""Host cost per call of customconv's ops (torch.ops.customconv.*, as the
nn modules and TorchScript call them) against PyTorch's, on inputs so small
that the device work is negligible: many calls queued back to back with one
synchronize at the end, so the time per call is what the host spends issuing
it (argument checks, dispatch, allocation, launch).

    python3 bench/host_cost.py --device cuda|cpu [--calls 2000] [--out bench/results/host_cost]

Writes <out>/<device>.{json,md}: per op and pass (forward, forward+backward),
microseconds per call for ours and for PyTorch's counterpart, and their ratio.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python_stub"))
import customconv  # noqa: E402


ROUNDS = 9


def round_us(fn: Callable[[], object], sync: Callable[[], None], calls: int) -> float:
    """(Time for `calls` back-to-back calls and one synchronize) / calls, in us."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def per_call_us(fn: Callable[[], object], device: str, calls: int, rounds: int = ROUNDS) -> float:
    """Median over rounds of round_us."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(20):
        fn()
    sync()
    return statistics.median(round_us(fn, sync, calls) for _ in range(rounds))


def paired_us(ours: Callable[[], object], theirs: Callable[[], object], device: str, calls: int,
              rounds: int = ROUNDS):
    """(ours' median us, theirs' median us, median of the rounds' ratios), the
    two sides' rounds taken in turn, so that a slow stretch of a busy host
    falls on both."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(20):
        ours()
        theirs()
    sync()
    pairs = [(round_us(ours, sync, calls), round_us(theirs, sync, calls)) for _ in range(rounds)]
    return (statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs),
            statistics.median(a / b for a, b in pairs))


def cases(device: str, dtype: torch.dtype) -> Dict[str, Dict[str, Callable]]:
    """name -> {"ours": fn, "torch": fn, "ours_bwd": fn, "torch_bwd": fn} on tiny inputs."""
    mk = lambda *shape, grad=False: torch.randn(*shape, device=device, dtype=dtype,  # noqa: E731
                                                requires_grad=grad)
    out: Dict[str, Dict[str, Callable]] = {}
    # The registered ops, as customconv.nn's modules and TorchScript call them.
    ops, one, zero = torch.ops.customconv, [1, 1], [0, 0]

    def add(name, ours, theirs, args):
        grads = [a.detach().clone().requires_grad_() for a in args]

        def bwd(f):
            def run():
                y = f(*grads)
                y.backward(torch.ones_like(y))
            return run

        out[name] = {"ours": lambda: ours(*args), "torch": lambda: theirs(*args),
                     "ours_bwd": bwd(ours), "torch_bwd": bwd(theirs)}

    x, w, b = mk(1, 8, 8, 8), mk(8, 8, 3, 3), mk(8)
    add("conv2d 3x3", lambda x, w, b: ops.conv2d(x, w, b, one, one, one, 1),
        lambda x, w, b: F.conv2d(x, w, b, 1, 1), (x, w, b))
    w1 = mk(8, 8, 1, 1)
    add("conv2d 1x1", lambda x, w, b: ops.conv2d(x, w, b, one, zero, one, 1),
        lambda x, w, b: F.conv2d(x, w, b), (x, w1, b))
    xcl = x.contiguous(memory_format=torch.channels_last)
    wcl = w.contiguous(memory_format=torch.channels_last)
    add("conv2d 3x3 channels_last", lambda x, w, b: ops.conv2d(x, w, b, one, one, one, 1),
        lambda x, w, b: F.conv2d(x, w, b, 1, 1), (xcl, wcl, b))
    wd = mk(8, 1, 3, 3)
    add("depthwise_conv2d 3x3", lambda x, w, b: ops.depthwise_conv2d(x, w, b, one, one, one),
        lambda x, w, b: F.conv2d(x, w, b, 1, 1, 1, 8), (x, wd, b))
    add("depthwise_conv2d 3x3 channels_last", lambda x, w, b: ops.depthwise_conv2d(x, w, b, one, one, one),
        lambda x, w, b: F.conv2d(x, w, b, 1, 1, 1, 8), (xcl, wd, b))
    w1cl = w1.contiguous(memory_format=torch.channels_last)
    add("conv2d 1x1 channels_last", lambda x, w, b: ops.conv2d(x, w, b, one, zero, one, 1),
        lambda x, w, b: F.conv2d(x, w, b), (xcl, w1cl, b))
    res = mk(1, 8, 8, 8).contiguous(memory_format=torch.channels_last)
    add("conv2d_fused 3x3 channels_last relu",
        lambda x, w, b: ops.conv2d_fused(x, w, b, one, one, one, 1, "relu", None),
        lambda x, w, b: F.relu(F.conv2d(x, w, b, 1, 1)), (xcl, wcl, b))
    add("conv2d_fused 3x3 channels_last residual relu",
        lambda x, w, b: ops.conv2d_fused(x, w, b, one, one, one, 1, "relu", res),
        lambda x, w, b: F.relu(F.conv2d(x, w, b, 1, 1) + res), (xcl, wcl, b))
    # A pointwise layer with its residual and relu (cuBLASLt's product with the epilogue on CUDA).
    add("conv2d_fused 1x1 channels_last residual relu",
        lambda x, w, b: ops.conv2d_fused(x, w, b, one, zero, one, 1, "relu", res),
        lambda x, w, b: F.relu(F.conv2d(x, w, b) + res), (xcl, w1cl, b))
    # Grouped: 3 groups of 8 channels (the tensor-core kernel for groups of 8 on CUDA).
    xg = mk(1, 24, 8, 8).contiguous(memory_format=torch.channels_last)
    wg = mk(24, 8, 3, 3).contiguous(memory_format=torch.channels_last)
    add("conv2d 3x3 grouped (3 x 8) channels_last",
        lambda x, w, b: ops.conv2d(x, w, b, one, one, one, 3),
        lambda x, w, b: F.conv2d(x, w, b, 1, 1, 1, 3), (xg, wg, mk(24)))
    k = mk(3, 3)
    add("filter2d 3x3", lambda x, k: ops.filter2d(x, k, "zeros"),
        lambda x, k: F.conv2d(x.reshape(-1, 1, 8, 8), k[None, None], None, 1, 1).reshape(x.shape),
        (x, k))
    return out


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "host_cost")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    rows = []
    for name, fns in cases(args.device, dtype).items():
        for pass_, ours, theirs in (("fwd", "ours", "torch"), ("fwd+bwd", "ours_bwd", "torch_bwd")):
            t_ours, t_torch, ratio = paired_us(fns[ours], fns[theirs], args.device, args.calls)
            rows.append(dict(op=name, pass_=pass_, ours_us=t_ours, torch_us=t_torch, ratio=ratio))
            print(f"{name:28s} {pass_:8s} ours {t_ours:8.1f} us  PyTorch {t_torch:8.1f} us  "
                  f"ratio {ratio:5.2f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    device_name = (torch.cuda.get_device_name() if args.device == "cuda" else "CPU")
    (args.out / f"{args.device}.json").write_text(json.dumps(
        dict(device=device_name, dtype=args.dtype, calls=args.calls, rows=rows), indent=1))
    lines = [f"# Host cost per call on {device_name} ({args.dtype}, tiny inputs, "
             f"{args.calls} calls queued a round, {ROUNDS} rounds a side taken in turn)", "",
             "Per call: the median over rounds; ours / PyTorch: the median of the rounds' ratios.", "",
             "| op | pass | ours us | PyTorch us | ours / PyTorch |", "|---|---|---:|---:|---:|"]
    lines += [f"| {r['op']} | {r['pass_']} | {r['ours_us']:.1f} | {r['torch_us']:.1f} | "
              f"{r['ratio']:.2f} |" for r in rows]
    (args.out / f"{args.device}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
