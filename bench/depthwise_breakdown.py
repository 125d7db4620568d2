"""Where depthwise_conv2d's forward+backward time goes on a GPU: the forward,
the input gradient and the weight gradient timed one by one, for customconv
and for PyTorch (aten::convolution_backward with one output at a time), on
the depthwise shapes of bench.py.

    python3 bench/depthwise_breakdown.py [--dtypes float32,float16] [--out FILE]
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python_stub"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import customconv  # noqa: E402,F401
from bench import Timer, depthwise_cases, warm_up_device  # noqa: E402

ops = torch.ops.customconv


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="float32,float16,bfloat16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    timer = Timer("cuda", max_reps=50, warmup=5)  # bench.py's timing: L2 evicted, best of 3 medians
    warm_up_device("cuda")
    lines = ["| shape | dtype | part | ours ms | PyTorch NCHW ms | speedup |",
             "|---|---|---|---:|---:|---:|"]
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        for model, (n, c, h, w), k, s in depthwise_cases(False):
            x = torch.randn(n, c, h, w, device="cuda", dtype=dtype)
            wt = torch.randn(c, 1, k, k, device="cuda", dtype=dtype)
            st, pd, dl = [s, s], [k // 2, k // 2], [1, 1]
            y = F.conv2d(x, wt, None, s, k // 2, 1, c)
            go = torch.randn_like(y)
            parts = {
                "forward": (lambda: ops.depthwise_conv2d(x, wt, None, st, pd, dl),
                            lambda: F.conv2d(x, wt, None, s, k // 2, 1, c)),
                "grad input": (
                    lambda: ops.depthwise_conv2d_grad_input(go, x, wt, st, pd, dl),
                    lambda: torch.ops.aten.convolution_backward(
                        go, x, wt, None, st, pd, dl, False, [0, 0], c, [True, False, False])),
                "grad weight": (
                    lambda: ops.depthwise_conv2d_grad_weight(go, x, wt, st, pd, dl),
                    lambda: torch.ops.aten.convolution_backward(
                        go, x, wt, None, st, pd, dl, False, [0, 0], c, [False, True, False])),
            }
            shape = f"{model} N{n} C{c} {h}x{w} k{k} s{s}"
            for part, (ours, theirs) in parts.items():
                a, b = timer(ours), timer(theirs)
                lines.append(f"| {shape} | {name} | {part} | {a:.3f} | {b:.3f} | {b / a:.2f}x |")
            print(lines[-3], lines[-2], lines[-1], sep="\n", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
