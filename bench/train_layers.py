"""Where a float32 training step's convolution time goes, layer by layer, on
CUDA: one SGD step of a torchvision model (forward, cross-entropy, backward,
optimizer step), eager PyTorch against customconv.convert(model), in the
model, as it trains:

    python3 bench/train_layers.py [--model resnet50] [--layouts nchw,channels_last]
        [--batch 32] [--reps 5] [--inference [--dtype float16]]

With --inference it times an inference forward (eval mode, no autograd) in
--dtype instead, so only the forward columns are filled.

Each convolution's kernels are summed under the operator that launched them
(torch.profiler, CUDA activity, input shapes recorded): PyTorch's
`aten::cudnn_convolution` (forward) and `aten::convolution_backward` (both
gradients) against customconv's `conv2d`, `conv2d_grad_input` and
`conv2d_grad_weight`, so that layout changes made inside an operator count
as its time on both sides. A row is a layer shape, (input, weight), with its
count in the model; times are us a step (a forward with --inference), summed
over the layers of that shape. The header gives all kernels a step,
convolutions or not.
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
from model_breakdown import train_step  # noqa: E402

# Operator -> the pass it times, and where its input and weight are among its arguments.
OPS = {
    "aten::cudnn_convolution": ("fwd", 0, 1),
    "aten::convolution_backward": ("bwd", 1, 2),
    "customconv::conv2d": ("fwd", 0, 1),
    "customconv::conv2d_grad_input": ("gi", 1, 2),
    "customconv::conv2d_grad_weight": ("gw", 1, 2),
}


def inference(model):
    """An inference forward of `model`, as a callable of the input."""
    def step(x):
        with torch.inference_mode():
            model(x)
    return step


def per_layer(step, x, reps):
    """{(input shape, weight shape): {pass: us a step, "n": layers}}, and all
    kernels' us a step."""
    for _ in range(3):
        step(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(reps):
            step(x)
        torch.cuda.synchronize()
    layers = {}
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key not in OPS:
            continue
        what, xi, wi = OPS[e.key]
        key = (tuple(e.input_shapes[xi]), tuple(e.input_shapes[wi]))
        row = layers.setdefault(key, {})
        row[what] = row.get(what, 0.0) + e.device_time_total / reps
        if what == "fwd":
            row["n"] = e.count // reps
    total = sum(e.self_device_time_total for e in prof.key_averages()
                if e.device_type == torch.autograd.DeviceType.CUDA) / reps
    return layers, total


def report(model_name, what, per, layout, eager, ours):
    (e, e_total), (o, o_total) = eager, ours
    print(f"\n### {model_name} {what}, {layout}: all kernels eager "
          f"{e_total / 1000:.3f} ms, converted {o_total / 1000:.3f} ms a {per}\n")
    print("| input | weight | layers | forward eager / ours | backward eager / ours (grad_input, grad_weight) |")
    print("|---|---|---:|---:|---:|")
    sums = [0.0] * 5
    for key in sorted(set(e) | set(o), key=lambda k: (-k[0][1], k[1])):
        re, ro = e.get(key, {}), o.get(key, {})
        cells = [re.get("fwd", 0.0), ro.get("fwd", 0.0), re.get("bwd", 0.0), ro.get("gi", 0.0), ro.get("gw", 0.0)]
        sums = [a + b for a, b in zip(sums, cells)]
        fe, fo, be, gi, gw = cells
        print(f"| {list(key[0])} | {list(key[1])} | {ro.get('n', re.get('n', 0))} | {fe:.1f} / {fo:.1f} | "
              f"{be:.1f} / {gi + gw:.1f} ({gi:.1f}, {gw:.1f}) |")
    fe, fo, be, gi, gw = sums
    print(f"| all | | | {fe:.1f} / {fo:.1f} | {be:.1f} / {gi + gw:.1f} ({gi:.1f}, {gw:.1f}) |")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--layouts", default="nchw,channels_last")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--inference", action="store_true", help="an inference forward instead of a training step")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                   help="the data type of --inference (training steps are float32)")
    a = p.parse_args(argv)
    if a.dtype != "float32" and not a.inference:
        p.error("--dtype applies to --inference only")
    if not torch.cuda.is_available():
        sys.exit("train_layers.py needs a CUDA device")
    print(f"{a.model}, N={a.batch}, 224x224, on {torch.cuda.get_device_name()}; "
          f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}")
    base = make_base(a.model, 0)
    labels = torch.randint(0, 1000, (a.batch,), device="cuda")
    for layout in a.layouts.split(","):
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        dtype = getattr(torch, a.dtype)
        x = torch.randn(a.batch, 3, 224, 224, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
        runs = []
        for model in (copy.deepcopy(base), customconv.convert(copy.deepcopy(base))):
            model = model.to("cuda", dtype).to(memory_format=fmt)
            step = inference(model.eval()) if a.inference else train_step(model.train(), labels)
            runs.append(per_layer(step, x, a.reps))
        what = f"{a.dtype} inference" if a.inference else "float32 training step"
        report(a.model, what, "forward" if a.inference else "step", layout, *runs)


if __name__ == "__main__":
    main(sys.argv[1:])
