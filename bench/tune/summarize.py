"""Summarizes tile_sweep's CSV: per layer and pass, cuDNN's time, the fastest
sm80-style candidate and the fastest Hopper (sm90) one; then the geometric
means of cuDNN / fastest per dtype and pass, over the layers the engine runs
(1x1 stride-1 layers included: on their own they go to cuBLAS).

    python3 bench/tune/summarize.py tile_sweep.csv [--markdown out.md]
"""

import argparse
import csv
import math
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    groups = defaultdict(list)
    for r in csv.DictReader(open(args.csv)):
        if r["candidate"] == "engine-split":
            continue
        if float(r["rel_err"]) > 2e-2:
            print("wrong result, left out:", r)
            continue
        groups[(r["dtype"], r["layer"], r["pass"])].append(r)
    lines = ["| dtype | layer | pass | cuDNN us | best sm80 us | sm80 tile, split | best sm90 us | sm90 tile, split "
             "| cuDNN / best |", "|---|---|---|---:|---:|---|---:|---|---:|"]
    geo = defaultdict(lambda: [0.0, 0.0, 0])
    for (dtype, layer, pss), rs in groups.items():
        ref = float(rs[0]["cudnn_us"])
        cells = []
        best = float("inf")
        for family in ("sm80", "sm90"):
            fam = [r for r in rs if r["candidate"].startswith("sm90") == (family == "sm90")]
            if fam:
                b = min(fam, key=lambda r: float(r["us"]))
                best = min(best, float(b["us"]))
                cells += [f"{float(b['us']):.1f}", f"{b['candidate'].replace('sm90 ', '')}, {b['split']}"]
                if family == "sm80":
                    geo[(dtype, pss)][0] += math.log(ref / float(b["us"]))
            else:
                cells += ["", ""]
        geo[(dtype, pss)][1] += math.log(ref / best)
        geo[(dtype, pss)][2] += 1
        lines.append(f"| {dtype} | {layer} | {pss} | {ref:.1f} | " + " | ".join(cells) + f" | {ref / best:.2f} |")
    lines += ["", "| dtype | pass | geomean cuDNN / best sm80 | geomean cuDNN / best of all | layers |",
              "|---|---|---:|---:|---:|"]
    for (dtype, pss), (a, b, n) in sorted(geo.items()):
        lines.append(f"| {dtype} | {pss} | {math.exp(a / n):.2f} | {math.exp(b / n):.2f} | {n} |")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        open(args.markdown, "w").write(text + "\n")


if __name__ == "__main__":
    main()
