"""Each pass of conv2d on 3x3 layers, ours against cuDNN's, on a GPU.

    python3 bench/conv2d_passes.py [--layers grouped,resnet50] [--dtypes float16,bfloat16] [--batch 32]

For ResNeXt-50 32x4d's and RegNetY-400MF's grouped layers and ResNet-50's
3x3 layers (channels_last, no bias) it times the forward (ours: conv2d; PyTorch: F.conv2d), the weight
gradient and the input gradient (ours: conv2d_grad_weight and
conv2d_grad_input; PyTorch: aten.convolution_backward with one output) apart,
each as 50 calls captured in a CUDA graph and replayed (the best of 5
replays, in microseconds per call): the device's time, no host time.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python_stub"))
import customconv  # noqa: E402,F401

ops = torch.ops.customconv

# (C, groups, stride, input size), as many output channels as input ones.
LAYERS = {}
# ResNeXt-50 32x4d's grouped 3x3 layers and RegNetY-400MF's.
LAYERS["grouped"] = [(128, 32, 1, 56), (256, 32, 2, 56), (256, 32, 1, 28), (512, 32, 2, 28), (512, 32, 1, 14),
          (1024, 32, 2, 14), (1024, 32, 1, 7), (48, 6, 2, 112), (104, 13, 2, 56), (104, 13, 1, 28),
          (208, 26, 2, 28), (208, 26, 1, 14), (440, 55, 2, 14), (440, 55, 1, 7)]
# ResNet-50's 3x3 layers.
LAYERS["resnet50"] = [(64, 1, 1, 56), (128, 1, 2, 56), (128, 1, 1, 28), (256, 1, 2, 28), (256, 1, 1, 14),
                      (512, 1, 2, 14), (512, 1, 1, 7)]


def graph_us(fn, reps: int = 50) -> float:
    """Microseconds per call of fn, as reps calls in a CUDA graph (best of 5 replays)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(reps):
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / reps)
    return best * 1e3


def main(argv) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="grouped,resnet50", help="grouped, resnet50 or both")
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 1
    print("| dtype | C | groups | stride | size | fwd ours | fwd cuDNN | gw ours | gw cuDNN | gi ours | gi cuDNN |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        for c, groups, s, h in [layer for group in args.layers.split(",") for layer in LAYERS[group]]:
            cl = torch.channels_last
            x = torch.randn(args.batch, c, h, h, device="cuda", dtype=dtype).to(memory_format=cl)
            w = torch.randn(c, c // groups, 3, 3, device="cuda", dtype=dtype).to(memory_format=cl)
            o = (h - 1) // s + 1
            go = torch.randn(args.batch, c, o, o, device="cuda", dtype=dtype).to(memory_format=cl)
            conv = ([s, s], [1, 1], [1, 1], groups)

            def backward(mask):
                return lambda: torch.ops.aten.convolution_backward(go, x, w, None, [s, s], [1, 1], [1, 1], False,
                                                                   [0, 0], groups, mask)

            times = [graph_us(lambda: ops.conv2d(x, w, None, *conv)),
                     graph_us(lambda: F.conv2d(x, w, None, s, 1, 1, groups)),
                     graph_us(lambda: ops.conv2d_grad_weight(go, x, w, *conv)),
                     graph_us(backward([False, True, False])),
                     graph_us(lambda: ops.conv2d_grad_input(go, x, w, *conv)),
                     graph_us(backward([True, False, False]))]
            cells = " | ".join(f"{t:.1f}" for t in times)
            print(f"| {name} | {c} | {groups} | {s} | {h} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
