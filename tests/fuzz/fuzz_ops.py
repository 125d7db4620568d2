"""Differential fuzzing of every op against PyTorch's reference.

For each op it draws random valid configurations (shapes, strides, paddings,
dilations, groups, channel multipliers, filter2d borders, dtypes,
non-contiguous layouts, batch 0, unbatched input: the generators of
tests/python/testlib.py), runs the op forward and backward on the chosen
device and dtype, and compares the output and every gradient with the float64
reference on the CPU (the checks of the pytest suite, with its dtype-aware
tolerances).

Configuration `index` of op `op` under `--seed S` depends on (S, op, index)
alone, so one failing configuration reruns by itself:

    python3 tests/fuzz/fuzz_ops.py --device cpu --ops conv2d --seed S --index I

Exit status: 0 when every configuration matched, 1 when one failed, 2 on bad
arguments, 77 when the device is not available (a skip for ctest). `--json FILE` writes a summary (configurations per op and dtype,
failures with their reproducers, times).
"""

import argparse
import collections
import json
import os
import random
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import torch  # noqa: E402

import testlib  # noqa: E402
from test_depthwise_conv2d import run_depthwise_case  # noqa: E402
from test_filter2d import run_filter2d_case  # noqa: E402
from test_im2col_col2im_match_torch import run_col2im_case, run_im2col_case  # noqa: E402
from test_trilinear_interpolation import run_trilinear_case  # noqa: E402


def run_conv2d_case(cfg, device, dtype, gen, ctx):
    testlib.check_conv_case(
        lambda input, weight, bias: testlib.ops.conv2d(input, weight, bias, *cfg.args()),
        cfg, device, dtype, gen, ctx)


# op -> (random configuration of rng, run(cfg, device, dtype, gen, ctx)).
OPS = {
    "conv2d": (testlib.random_conv2d_config, run_conv2d_case),
    "im2col": (testlib.random_window_config, run_im2col_case),
    "col2im": (testlib.random_window_config, run_col2im_case),
    "depthwise_conv2d": (testlib.random_depthwise_config, run_depthwise_case),
    "filter2d": (testlib.random_filter2d_config, run_filter2d_case),
    "trilinear_interpolation": (testlib.random_trilinear_config, run_trilinear_case),
}

DTYPES = {"cpu": testlib.CPU_DTYPES, "cuda": testlib.CUDA_DTYPES}


def draw(op: str, seed: int, index: int, device: str):
    """Configuration `index` of `op` under `seed`: (cfg, dtype, tensor generator)."""
    key = testlib.seed_for(f"fuzz:{seed}:{op}:{index}")
    rng = random.Random(key)
    dtype = rng.choice(DTYPES[device])
    cfg = OPS[op][0](rng)
    return cfg, dtype, torch.Generator().manual_seed(key)


def run_one(op: str, seed: int, index: int, device: str):
    """Runs one configuration; returns its dtype and None, or a failure record."""
    cfg, dtype, gen = draw(op, seed, index, device)
    ctx = f"fuzz {op} seed={seed} index={index} {device} {dtype} {cfg}"
    try:
        OPS[op][1](cfg, device, dtype, gen, ctx)
        testlib.sync(device)
    except Exception as e:  # noqa: BLE001  (assertion or error from the op: both are failures)
        return dtype, {
            "op": op, "index": index, "dtype": str(dtype), "config": repr(cfg),
            "error": f"{type(e).__name__}: {e}"[:4000],
            "traceback": traceback.format_exc()[-4000:],
            "reproduce": (f"python3 tests/fuzz/fuzz_ops.py --device {device} --ops {op} "
                          f"--seed {seed} --index {index}"),
        }
    return dtype, None


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=sorted(DTYPES))
    p.add_argument("--ops", default=",".join(OPS),
                   help="comma-separated ops (default: all): " + ", ".join(OPS))
    p.add_argument("--configs", type=int, default=100, help="configurations per op (default 100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--index", type=int, action="append",
                   help="run only this configuration index (repeatable): a reproducer")
    p.add_argument("--time-limit", type=float, default=0,
                   help="seconds for the whole run; ops share it equally and each stops drawing "
                        "configurations when its share is spent (0: no limit)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads (0: PyTorch's default)")
    p.add_argument("--max-failures", type=int, default=20,
                   help="stop an op after this many failures (default 20)")
    p.add_argument("--json", help="write the summary to this file")
    args = p.parse_args(argv)
    args.ops = [o for o in args.ops.split(",") if o]
    unknown = [o for o in args.ops if o not in OPS]
    if unknown:
        p.error(f"unknown ops {unknown}; choose from {list(OPS)}")
    if args.configs < 1:
        p.error("--configs must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("fuzz: skipped, --device cuda but torch.cuda.is_available() is False")
        return 77
    if args.threads:
        torch.set_num_threads(args.threads)
    # float32 at float32's precision (conv2d follows F.conv2d's TF32 policy on GPUs).
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    indices = args.index or range(args.configs)
    share = args.time_limit / len(args.ops) if args.time_limit else 0
    summary = {"device": args.device, "seed": args.seed, "torch": torch.__version__,
               "library": str(testlib.customconv.LIBRARY_PATH), "threads": torch.get_num_threads(),
               "ops": {}, "failures": []}
    if args.device == "cuda":
        summary["gpu"] = torch.cuda.get_device_name()
    start = time.monotonic()
    for op in args.ops:
        t0 = time.monotonic()
        ran, failed, dtypes = 0, 0, collections.Counter()
        for index in indices:
            if share and time.monotonic() - t0 > share:
                break
            dtype, failure = run_one(op, args.seed, index, args.device)
            ran += 1
            dtypes[testlib.dtype_name(dtype)] += 1
            if failure:
                failed += 1
                summary["failures"].append(failure)
                print(f"FAIL {op} index {index}: {failure['error'].splitlines()[0][:300]}")
                print(f"  reproduce: {failure['reproduce']}", flush=True)
                if failed >= args.max_failures:
                    print(f"  {op}: stopping after {failed} failures")
                    break
        seconds = time.monotonic() - t0
        summary["ops"][op] = {"configs": ran, "failed": failed, "seconds": round(seconds, 1),
                              "dtypes": dict(sorted(dtypes.items()))}
        print(f"{op:24s} {args.device}: {ran} configs, {failed} failed, {seconds:.1f} s "
              f"({', '.join(f'{k} {v}' for k, v in sorted(dtypes.items()))})", flush=True)
    summary["seconds"] = round(time.monotonic() - start, 1)
    total = sum(o["configs"] for o in summary["ops"].values())
    failures = len(summary["failures"])
    print(f"fuzz {args.device} seed {args.seed}: {total} configs, {failures} failed, "
          f"{summary['seconds']} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
