"""Where the time of one conv2d layer goes, kernel by kernel, on a GPU.

    python3 bench/conv2d_breakdown.py [--dtype bfloat16] [--channels-last] [--layer N,C,H,K,k,s[,groups] ...]

For each layer it profiles our conv2d and F.conv2d, forward and forward+backward,
and prints the CUDA kernels with their total time per call.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python_stub"))
import customconv  # noqa: E402

DEFAULT_LAYERS = ["32,64,56,64,3,1", "32,256,56,64,1,1", "32,128,28,128,3,1", "32,2048,7,512,1,1"]


def profile_calls(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0:
            rows.append((e.device_time_total / reps, e.count // reps, e.key))
    return sorted(rows, reverse=True)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--layer", action="append", help="N,C,H,K,kernel,stride[,groups]")
    parser.add_argument("--channels-last", action="store_true", help="channels_last input and weight")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    for spec in args.layer or DEFAULT_LAYERS:
        n, c, h, k, ks, s, *rest = (int(v) for v in spec.split(","))
        g = rest[0] if rest else 1
        fmt = torch.channels_last if args.channels_last else torch.contiguous_format
        x = torch.randn(n, c, h, h, device="cuda", dtype=dtype).to(memory_format=fmt).requires_grad_()
        w = torch.randn(k, c // g, ks, ks, device="cuda", dtype=dtype).to(memory_format=fmt).requires_grad_()
        for name, conv in (("customconv", customconv.conv2d), ("F.conv2d", F.conv2d)):
            def fwd():
                with torch.no_grad():
                    conv(x, w, None, s, ks // 2, 1, g)

            def fwd_bwd():
                out = conv(x, w, None, s, ks // 2, 1, g)
                torch.autograd.grad(out, (x, w), torch.ones_like(out))

            for pass_name, fn in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
                rows = profile_calls(fn, args.reps)
                total = sum(r[0] for r in rows)
                print(f"\n{spec} {args.dtype} {name} {pass_name}: {total / 1e3:.3f} ms of kernels")
                for us, count, key in rows[:8]:
                    print(f"  {us / 1e3:8.3f} ms  x{count:<3} {key[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
