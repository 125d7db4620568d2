"""The host's time to issue a float32 training step, PyTorch eager against
customconv.convert(model), split into its parts: the forward with the loss,
the backward (zero_grad included) and optimizer.step.

At N=32 the training steps of resnet50, mobilenet_v2 and efficientnet_b0 are
bound by the host on both sides (the device runs each kernel as soon as it
is queued), so the step's time is the host's. Back-to-back timings then
follow the host's speed, which on a shared machine moves by 10-20% from one
minute to the next. Here the device
is held in a sleep kernel, longer than the step takes to issue, while the
host issues one step: the time until the last call returns is the host's
cost alone, with no wait on the device. The two sides' steps are taken in
turn, round after round, and each part's ratio is the median of the rounds'
ratios, so a slow stretch of the host falls on both.

    python3 bench/step_host.py [--models resnet50,mobilenet_v2,efficientnet_b0,convnext_tiny]
                               [--layouts nchw,channels_last] [--batch 32] [--rounds 15]
                               [--out bench/results/step_host]

Writes <out>/cuda.{json,md}: per model and layout, the median ms of each
part for both sides and converted / PyTorch (below 1: ours issues faster).
"""

import argparse
import copy
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
from bench import sleep_cycles_per_us  # noqa: E402  (bench/ is the script's directory)
from e2e import LAYOUTS, MODELS, make_base  # noqa: E402

PARTS = ("forward", "backward", "optimizer", "step")


def stepper(model: torch.nn.Module, x: torch.Tensor,
            y: torch.Tensor) -> Callable[[], Dict[str, float]]:
    """One SGD step of `model`, returning each part's host time in ms."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step() -> Dict[str, float]:
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        return {"forward": (t1 - t0) * 1e3, "backward": (t2 - t1) * 1e3,
                "optimizer": (t3 - t2) * 1e3, "step": (t3 - t0) * 1e3}

    return step


def held_back(step: Callable[[], Dict[str, float]], sleep_ms: float, cycles_per_us: float):
    """`step` issued while the device sleeps for sleep_ms."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(sleep_ms * 1e3 * cycles_per_us))
    parts = step()
    torch.cuda.synchronize()
    return parts


def measure(name: str, layout: str, batch: int, rounds: int, cycles_per_us: float) -> dict:
    fmt = LAYOUTS[layout]
    base = make_base(name, seed=0)
    theirs = copy.deepcopy(base).cuda().to(memory_format=fmt).train()
    ours = customconv.convert(copy.deepcopy(base)).cuda().to(memory_format=fmt).train()
    torch.manual_seed(1)
    x = torch.randn(batch, 3, 224, 224, device="cuda").contiguous(memory_format=fmt)
    y = torch.randint(0, 1000, (batch,), device="cuda")
    steps = {"torch": stepper(theirs, x, y), "converted": stepper(ours, x, y)}
    for s in steps.values():  # warm-up, and each side's issue time unhidden
        for _ in range(3):
            s()
    torch.cuda.synchronize()
    issue = max(held_back(s, 200.0, cycles_per_us)["step"] for s in steps.values())
    sleep_ms = 3 * issue + 20.0  # the device stays behind the whole step
    times: Dict[str, Dict[str, List[float]]] = {k: {p: [] for p in PARTS} for k in steps}
    for _ in range(rounds):
        for side, s in steps.items():
            for p, v in held_back(s, sleep_ms, cycles_per_us).items():
                times[side][p].append(v)
    # A round whose step took most of the sleep waited on the device inside a
    # call (a synchronizing one): it measures the device, not the host.
    waited = [side for side, t in times.items() if any(v > 0.8 * sleep_ms for v in t["step"])]
    row = dict(model=name, layout=layout, batch=batch, rounds=rounds, sleep_ms=sleep_ms,
               waited=waited)
    for p in PARTS:
        a, b = times["converted"][p], times["torch"][p]
        row[p] = dict(torch=statistics.median(b), converted=statistics.median(a),
                      ratio=statistics.median(u / v for u, v in zip(a, b)),
                      step_spread=(min(b), max(b)))
    return row


def markdown(rows: List[dict], device_name: str, batch: int, rounds: int) -> str:
    lines = [f"# Host time to issue a float32 training step on {device_name} (N={batch})", "",
             f"The device held in a sleep kernel while one step is issued, so no wait on it falls "
             f"inside; {rounds} rounds, the two sides' steps taken in turn. ms: the median over "
             f"rounds; converted / PyTorch: the median of the rounds' ratios (below 1: the "
             f"converted model costs the host less). PyTorch step range: its fastest and "
             f"slowest round.", "",
             "| model | layout | forward ms PyTorch / converted | backward ms | optimizer ms | "
             "step ms | step converted / PyTorch | PyTorch step range ms |",
             "|---|---|---|---|---|---|---:|---|"]
    for r in rows:
        if r.get("waited"):
            sides = " and ".join("PyTorch's" if w == "torch" else "the converted model's"
                                 for w in r["waited"])
            parts = ", ".join(f"{p} {r[p]['torch']:.2f} / {r[p]['converted']:.2f}" for p in PARTS)
            lines.append(f"| {r['model']} | {r['layout']} | {sides} step waited on the device "
                         f"(the sleep fell inside a call): not compared; ms PyTorch / converted: "
                         f"{parts} | | | | | |")
            continue
        cells = [f"{r[p]['torch']:.2f} / {r[p]['converted']:.2f} ({r[p]['ratio']:.2f})"
                 for p in PARTS]
        lo, hi = r["step"]["step_spread"]
        lines.append(f"| {r['model']} | {r['layout']} | " + " | ".join(cells) +
                     f" | {r['step']['ratio']:.2f} | {lo:.1f}-{hi:.1f} |")
    ratios = [r["step"]["ratio"] for r in rows if not r.get("waited")]
    if ratios:
        geo = statistics.geometric_mean(ratios)
        lines += ["", f"Step, converted / PyTorch: geomean {geo:.2f}, "
                      f"range {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} cases."]
    return "\n".join(lines) + "\n"


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--layouts", default="nchw,channels_last")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "step_host")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("step_host.py needs a CUDA device", file=sys.stderr)
        return 1
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default for convolutions
    cycles = sleep_cycles_per_us()
    rows = []
    for name in args.models.split(","):
        for layout in args.layouts.split(","):
            r = measure(name, layout, args.batch, args.rounds, cycles)
            rows.append(r)
            print(f"{name:16s} {layout:13s} step ms PyTorch {r['step']['torch']:6.2f} converted "
                  f"{r['step']['converted']:6.2f} ({r['step']['ratio']:.2f}); forward "
                  f"{r['forward']['ratio']:.2f} backward {r['backward']['ratio']:.2f}", flush=True)
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name()
    (args.out / "cuda.json").write_text(json.dumps(dict(device=name, rows=rows), indent=1))
    (args.out / "cuda.md").write_text(markdown(rows, name, args.batch, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
