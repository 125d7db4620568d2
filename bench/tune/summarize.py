"""Summarizes tile_sweep's CSV: per layer and pass, cuDNN's time, the engine's
current configuration and the fastest candidate; then geometric means.

    python3 bench/tune/summarize.py tile_sweep.csv [--sms 132] [--markdown out.md]
"""

import argparse
import csv
import math
from collections import defaultdict

CURRENT = {  # the engine's configuration per dtype and pass (implicit_gemm_kernels.cuh)
    ("float16", "narrow"): "128x64x64 s4", ("float16", "large"): "128x128x64 s3",
    ("float32", "narrow"): "128x64x32 s4", ("float32", "large"): "128x128x32 s3",
    ("float16", "wgrad"): "128x128x32 s4", ("float32", "wgrad"): "128x128x32 s3",
}


def parse_layer(name):
    parts = name.split()
    c = int(parts[0][1:]); h = int(parts[1].split("x")[0]); k = int(parts[2][1:])
    ks = int(parts[3][1:]); s = int(parts[4][1:])
    return c, h, k, ks, s


def wgrad_split(c, h, k, ks, s, n, sms, tm=128, tn=128):
    p = (h + 2 * (ks // 2) - ks) // s + 1
    tiles = -(-k // tm) * -(-(ks * ks * c) // tn)
    wanted = -(-2 * sms // tiles)
    return max(1, min(wanted, n * p * p // 1024, (48 << 20) // (k * ks * ks * c * 4), 256))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--markdown")
    args = ap.parse_args()
    rows = list(csv.DictReader(open(args.csv)))
    groups = defaultdict(list)
    engine_split = {}
    for r in rows:
        key = (r["dtype"], r["layer"], r["pass"])
        if r["candidate"] == "engine-split":
            engine_split[key] = int(r["split"])
            continue
        if float(r["rel_err"]) > 2e-2:
            print("BAD", r)
            continue
        groups[key].append(r)
    lines = ["| dtype | layer | pass | cuDNN us | current us | best us | best | cuDNN/current | cuDNN/best |",
             "|---|---|---|---:|---:|---:|---|---:|---:|"]
    geo = defaultdict(lambda: [0.0, 0.0, 0])
    for key, rs in groups.items():
        dtype, layer, pss = key
        c, h, k, ks, s = parse_layer(layer)
        pointwise = ks == 1 and s == 1
        if pss == "fprop":
            want = CURRENT[(dtype, "narrow" if k <= 64 else "large")]
            split = engine_split.get(key, 1)
        elif pss == "dgrad":
            want = CURRENT[(dtype, "narrow" if c <= 64 else "large")]
            split = 1
        else:
            want = CURRENT[(dtype, "wgrad")]
            split = wgrad_split(c, h, k, ks, s, args.batch, args.sms)
        cur = [r for r in rs if r["candidate"] == want and int(r["split"]) == split]
        cur_us = float(cur[0]["us"]) if cur else float("nan")
        best = min(rs, key=lambda r: float(r["us"]))
        ref = float(best["cudnn_us"])
        b_us = float(best["us"])
        tag = " (pointwise: cuBLAS today)" if pointwise and pss != "wgrad" else ""
        lines.append(f"| {dtype} | {layer}{tag} | {pss} | {ref:.1f} | {cur_us:.1f} | {b_us:.1f} | "
                     f"{best['candidate']} sk{best['split']} | {ref / cur_us:.2f} | {ref / b_us:.2f} |")
        g = geo[(dtype, pss)]
        if cur:
            g[0] += math.log(ref / cur_us)
        g[1] += math.log(ref / b_us)
        g[2] += 1
    lines += ["", "| dtype | pass | geomean cuDNN/current | geomean cuDNN/best | layers |", "|---|---|---:|---:|---:|"]
    for (dtype, pss), (a, b, n) in sorted(geo.items()):
        lines.append(f"| {dtype} | {pss} | {math.exp(a / n):.2f} | {math.exp(b / n):.2f} | {n} |")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        open(args.markdown, "w").write(text + "\n")


if __name__ == "__main__":
    main()
