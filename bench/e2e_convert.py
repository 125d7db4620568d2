"""Whole-model latency of customconv.convert(model) against the same model in
PyTorch eager: torchvision's ResNet-50, ResNeXt-50 32x4d and MobileNetV2
(`--models`; the first two by default), inference at N=32,
224x224, in float32 (TF32 as PyTorch's default for convolutions) and float16,
NCHW and channels_last. Each side is timed with CUDA events around `--iters`
forward calls after a warm-up (median of 5 rounds, the two sides taking turns
round by round); both run the same weights,
and the converted model's output is checked against the original's.

At N=32 both sides can be bound by the host's launch rate rather than by the
device (a forward of a few ms queues some 200 kernels from Python), and the
back-to-back times then follow the host's speed. On CUDA each side is also
timed as bench.py times an op (`Timer`): the device parked in a sleep kernel
while the host queues one whole forward, then timed by events around it, so
that no host gap falls inside: the device's own time per forward.

    python3 bench/e2e_convert.py [--device cuda] [--batch 32] [--iters 20]
                                 [--out bench/results/e2e]

Writes <out>/<device>.{json,md}: ms per forward for each model, dtype and
layout, and the speedup (PyTorch ms / ours ms; above 1: ours is faster), plus
the speedup against PyTorch's faster layout for that model and dtype; on CUDA
the same for the device's own time.
"""

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python_stub"))
import customconv  # noqa: E402
from bench import Timer  # noqa: E402  (bench/ is the script's directory)
from e2e import Timer as RoundTimer  # noqa: E402  (rounds of back-to-back calls)
from e2e import make_base, rel_err  # noqa: E402

MODELS = ("resnet50", "resnext50_32x4d", "mobilenet_v2")
DEFAULT_MODELS = "resnet50,resnext50_32x4d"


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--dtypes", default="float32,float16")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "e2e")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    device_timer = Timer("cuda", max_reps=50, warmup=2) if args.device == "cuda" else None
    rounds = RoundTimer(args.device, iters=args.iters, rounds=5, round_ms=0.0, warmup_calls=3,
                        warmup_s=0.0, min_iters=1)
    rows = []
    for name in args.models.split(","):
        if name not in MODELS:
            parser.error(f"--models: unknown model {name!r}; known: {', '.join(MODELS)}")
        # Random batch-norm statistics: torchvision's defaults make MobileNetV2's
        # logits ~1e-9, which float16 rounds to zero.
        base = make_base(name, seed=0)
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            theirs = copy.deepcopy(base).to(args.device, dtype)
            ours = customconv.convert(copy.deepcopy(base)).to(args.device, dtype)
            x = torch.randn(args.batch, 3, 224, 224, device=args.device, dtype=dtype)
            for layout in ("NCHW", "channels_last"):
                fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
                theirs, ours = theirs.to(memory_format=fmt), ours.to(memory_format=fmt)
                xin = x.contiguous(memory_format=fmt)
                with torch.inference_mode():
                    err = rel_err(ours(xin), theirs(xin))
                    # The two sides take turns round by round (RoundTimer.ms_per_call_each).
                    t = rounds.ms_per_call_each({"theirs": lambda: theirs(xin),
                                                 "ours": lambda: ours(xin)})
                    t_theirs, t_ours = t["theirs"], t["ours"]
                    row = dict(model=name, dtype=dtype_name, layout=layout, ours_ms=t_ours,
                               torch_ms=t_theirs, speedup=t_theirs / t_ours, rel_err=err)
                    line = (f"{name:16s} {dtype_name:8s} {layout:13s} ours {t_ours:7.2f} ms  "
                            f"PyTorch {t_theirs:7.2f} ms  {t_theirs / t_ours:5.2f}x")
                    if device_timer is not None:
                        d_theirs = device_timer(lambda: theirs(xin))
                        d_ours = device_timer(lambda: ours(xin))
                        row.update(ours_device_ms=d_ours, torch_device_ms=d_theirs,
                                   device_speedup=d_theirs / d_ours)
                        line += (f"  device: ours {d_ours:7.2f} ms  PyTorch {d_theirs:7.2f} ms  "
                                 f"{d_theirs / d_ours:5.2f}x")
                rows.append(row)
                print(f"{line}  max rel err {err:.1e}", flush=True)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    dev = device_timer is not None
    lines = [f"# convert(model) inference on {device_name}, N={args.batch}, 224x224", "",
             "Speedup: PyTorch eager ms / ours ms (above 1: ours is faster); the best-layout "
             "row compares each side's faster layout. Back to back: `--iters` calls queued "
             "one after another from Python (the host's launch rate included)."
             + (" Device: one call queued whole behind a sleep kernel, then timed on the "
                "device (the host's time hidden)." if dev else ""), "",
             "| model | dtype | layout | ours ms | PyTorch ms | speedup |"
             + (" device: ours ms | PyTorch ms | speedup |" if dev else "") + " max rel err |",
             "|---|---|---|---:|---:|---:|" + ("---:|---:|---:|" if dev else "") + "---:|"]

    def cells(ours_ms: float, torch_ms: float) -> str:
        return f" {ours_ms:.2f} | {torch_ms:.2f} | {torch_ms / ours_ms:.2f}x |"

    for r in rows:
        device_cells = cells(r["ours_device_ms"], r["torch_device_ms"]) if dev else ""
        lines.append(f"| {r['model']} | {r['dtype']} | {r['layout']} |"
                     f"{cells(r['ours_ms'], r['torch_ms'])}{device_cells} {r['rel_err']:.1e} |")
    for name in args.models.split(","):
        for dtype_name in args.dtypes.split(","):
            sel = [r for r in rows if r["model"] == name and r["dtype"] == dtype_name]
            best = cells(min(r["ours_ms"] for r in sel), min(r["torch_ms"] for r in sel))
            if dev:
                best += cells(min(r["ours_device_ms"] for r in sel),
                              min(r["torch_device_ms"] for r in sel))
            lines.append(f"| {name} | {dtype_name} | best of each |{best} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.device}.json").write_text(json.dumps(
        dict(device=device_name, batch=args.batch, rows=rows), indent=1))
    (args.out / f"{args.device}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
