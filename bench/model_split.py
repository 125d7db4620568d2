"""A whole model's host cost and GPU time, apart, for PyTorch eager and
customconv.convert(model), inference on CUDA:

    python3 bench/model_split.py [--models resnet50,mobilenet_v2] [--dtypes float32,float16]
        [--layouts nchw,channels_last] [--batch 32]

host: wall time per forward on a 1x3x64x64 input, where the GPU idles, so
that the time is what the host needs to issue the forward; GPU: a CUDA graph
of the forward at --batch, 224x224, replayed (no host work); wall: the
forward at --batch, called back to back. A model whose host time exceeds its
GPU time is bound by the host at that batch.
"""

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python_stub"))
import customconv  # noqa: E402
from e2e import make_base  # noqa: E402


def wall_ms(model, x, calls):
    """The best of three rounds of `calls` forwards, ms per forward."""
    with torch.no_grad():
        for _ in range(5):
            model(x)
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(calls):
                model(x)
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t) / calls * 1e3)
    return best


def graph_replay_ms(fn, replays=20):
    """ms per replay of a CUDA graph of fn(), captured after three warm-up
    calls on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays


def graph_ms(model, x, replays=20):
    """ms per replay of a CUDA graph of one forward."""
    with torch.no_grad():
        return graph_replay_ms(lambda: model(x), replays)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet50,mobilenet_v2,efficientnet_b0")
    p.add_argument("--dtypes", default="float32,float16")
    p.add_argument("--layouts", default="nchw,channels_last")
    p.add_argument("--batch", type=int, default=32)
    a = p.parse_args(argv)
    print(f"{torch.cuda.get_device_name()}: ms per forward, eager / converted")
    for name in a.models.split(","):
        for dtype_name in a.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            for layout in a.layouts.split(","):
                fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
                base = make_base(name, 0)
                models = {"eager": copy.deepcopy(base), "converted": customconv.convert(copy.deepcopy(base))}
                tiny = torch.randn(1, 3, 64, 64, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
                big = torch.randn(a.batch, 3, 224, 224, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
                r = {}
                for label, m in models.items():
                    m = m.to("cuda", dtype).to(memory_format=fmt)
                    r[label] = (wall_ms(m, tiny, 50), graph_ms(m, big), wall_ms(m, big, 10))
                e, c = r["eager"], r["converted"]
                print(f"{name:16s} {dtype_name:8s} {layout:13s} host {e[0]:6.2f} / {c[0]:6.2f}   "
                      f"GPU N={a.batch} {e[1]:6.2f} / {c[1]:6.2f}   wall N={a.batch} {e[2]:6.2f} / {c[2]:6.2f}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
