"""Host cost per forward call of conv2d on torchvision models' own layers: each
distinct convolution of the model (its input, weight, stride, padding, dilation
and groups, at --batch), ours (the op convert()'s module calls for it:
torch.ops.customconv.depthwise_conv2d where groups == in_channels, else
torch.ops.customconv.conv2d) against F.conv2d, under inference_mode, in NCHW
and channels_last.

On CUDA the device is parked in a sleep kernel while the host queues a round of
calls, so that the time per call is the host's alone (argument checks,
routing, allocations, launches) even where each call's kernels take longer; the
two sides' rounds are taken in turn. `bench/host_cost.py` does the same on
tiny inputs, where every route is short; on these shapes the routes are the
ones a converted model runs (layout changes, chunks of images, cuBLAS's
products). Sums weight each layer by how often the model runs it. On the CPU
there is no device to hold: the times are the whole calls'.

    python3 bench/host_cost_layers.py [--device cuda] [--models resnet50,resnext50_32x4d]
                                      [--dtypes float16,float32] [--batch 32]
                                      [--out bench/results/host_cost]

Writes <out>/layers-<device>.{json,md}.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python_stub"))
import customconv  # noqa: E402,F401  (loads the ops)
from bench import sleep_cycles_per_us  # noqa: E402  (bench/ is the script's directory)

LAYOUTS = {"NCHW": torch.contiguous_format, "channels_last": torch.channels_last}


def model_layers(name: str, batch: int) -> List[Tuple[tuple, int]]:
    """The model's distinct convolutions at `batch`, in order of first use, as
    ((input shape, weight shape, stride, padding, dilation, groups), count)."""
    model = getattr(torchvision.models, name)().eval()
    counts: Dict[tuple, int] = {}

    def hook(m, inputs, _):
        key = (tuple(inputs[0].shape), tuple(m.weight.shape), tuple(m.stride), tuple(m.padding),
               tuple(m.dilation), m.groups)
        counts[key] = counts.get(key, 0) + 1

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        model(torch.randn(batch, 3, 224, 224))
    for h in handles:
        h.remove()
    return list(counts.items())


class HostTimer:
    """Host microseconds per call, the two sides' rounds taken in turn; on CUDA
    each round queued behind a sleep kernel that outlasts it."""

    def __init__(self, device: str, calls: int, rounds: int):
        self.device, self.calls, self.rounds = device, calls, rounds
        self.cycles_per_us = sleep_cycles_per_us() if device == "cuda" else 0.0

    def _round(self, fn: Callable[[], object], sleep_us: float) -> float:
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda._sleep(int(sleep_us * self.cycles_per_us))
        t0 = time.perf_counter()
        for _ in range(self.calls):
            fn()
        us = (time.perf_counter() - t0) / self.calls * 1e6
        if self.device == "cuda":
            torch.cuda.synchronize()
        return us

    def paired(self, ours: Callable[[], object], theirs: Callable[[], object]) -> Tuple[float, float]:
        for _ in range(3):
            ours()
            theirs()
        # A first round behind a long sleep sizes the sleep of the others: 1.5x
        # the slower side's round, at least 1 ms.
        first = max(self._round(ours, 20000.0), self._round(theirs, 20000.0))
        sleep_us = max(1000.0, 1.5 * first * self.calls)
        pairs = [(self._round(ours, sleep_us), self._round(theirs, sleep_us))
                 for _ in range(self.rounds)]
        return statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs)


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--models", default="resnet50,resnext50_32x4d")
    parser.add_argument("--dtypes", default="float16,float32")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--calls", type=int, default=20, help="calls a round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "host_cost")
    args = parser.parse_args(argv)
    torch.backends.cudnn.allow_tf32 = True
    timer = HostTimer(args.device, args.calls, args.rounds)
    conv2d, depthwise = torch.ops.customconv.conv2d, torch.ops.customconv.depthwise_conv2d
    rows, sums = [], []
    for model in args.models.split(","):
        layers = model_layers(model, args.batch)
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            for layout, fmt in LAYOUTS.items():
                total_ours = total_torch = 0.0
                for (xs, ws, stride, padding, dilation, groups), count in layers:
                    x = torch.randn(xs, device=args.device, dtype=dtype).contiguous(memory_format=fmt)
                    w = (torch.randn(ws, device=args.device, dtype=dtype) * 0.05).contiguous(
                        memory_format=fmt)
                    if groups == xs[1]:  # convert() makes these depthwise_conv2d
                        call = lambda: depthwise(x, w, None, list(stride), list(padding),  # noqa: E731
                                                 list(dilation))
                    else:
                        call = lambda: conv2d(x, w, None, list(stride), list(padding),  # noqa: E731
                                              list(dilation), groups)
                    with torch.inference_mode():
                        ours, theirs = timer.paired(
                            call, lambda: F.conv2d(x, w, None, stride, padding, dilation, groups))
                    total_ours += ours * count
                    total_torch += theirs * count
                    layer = (f"{xs[1]} -> {ws[0]}, {ws[2]}x{ws[3]}, stride {stride[0]}, "
                             f"groups {groups}, at {xs[2]}x{xs[3]}")
                    rows.append(dict(model=model, dtype=dtype_name, layout=layout, layer=layer,
                                     count=count, ours_us=ours, torch_us=theirs))
                    print(f"{model} {dtype_name} {layout:13s} x{count} {layer:44s} "
                          f"ours {ours:7.1f} us  PyTorch {theirs:7.1f} us", flush=True)
                sums.append(dict(model=model, dtype=dtype_name, layout=layout, ours_us=total_ours,
                                 torch_us=total_torch))
                print(f"{model} {dtype_name} {layout}: sum ours {total_ours:.0f} us, PyTorch "
                      f"{total_torch:.0f} us, {total_ours / total_torch:.2f}x", flush=True)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"layers-{args.device}.json").write_text(json.dumps(
        dict(device=device_name, batch=args.batch, calls=args.calls, rounds=args.rounds,
             sums=sums, rows=rows), indent=1))
    held = "the device held behind a sleep kernel" if args.device == "cuda" else "whole calls"
    lines = [f"# Convolutions' host cost per forward call on models' layers, {device_name}, "
             f"N={args.batch} ({held})", "",
             f"Medians of {args.rounds} rounds of {args.calls} calls a side, taken in turn; sums "
             "weight each layer by its count in the model.", "",
             "| model | dtype | layout | ours us | PyTorch us | ours / PyTorch |",
             "|---|---|---|---:|---:|---:|"]
    lines += [f"| {s['model']} | {s['dtype']} | {s['layout']} | {s['ours_us']:.0f} | "
              f"{s['torch_us']:.0f} | {s['ours_us'] / s['torch_us']:.2f} |" for s in sums]
    lines += ["", "| model | dtype | layout | layer | count | ours us | PyTorch us |",
              "|---|---|---|---|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['dtype']} | {r['layout']} | {r['layer']} | {r['count']} | "
              f"{r['ours_us']:.1f} | {r['torch_us']:.1f} |" for r in rows]
    (args.out / f"layers-{args.device}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
