"""Every convolution of a torchvision model, one at a time, on CUDA: the host
time to issue one call and the device time of one call, customconv's op
against F.conv2d, inference, at the shapes the layer sees in the model:

    python3 bench/layer_split.py [--model mobilenet_v2] [--dtype float32]
        [--layout nchw|channels_last] [--batch 32] [--top 20]

host: CPU time to issue 20 calls back to back with no synchronize,
per call, while the device is kept busy by a sleep kernel queued first (so
the host never waits for it; the best of 7 rounds); device: a
CUDA graph of 20 calls replayed, per call (no host work). A converted model
is bound by the host where its layers' host times sum above their device
times. Layers are grouped by (shape, op): a row gives the count in the model,
and the sums weigh each row by it.
"""

import argparse
import sys
import time
from collections import OrderedDict
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python_stub"))
import customconv  # noqa: E402
from e2e import make_base  # noqa: E402
from model_split import graph_replay_ms  # noqa: E402


def layer_inputs(model, x):
    """(conv module, its input) for every nn.Conv2d of the model, in call order."""
    seen = []
    hooks = [m.register_forward_pre_hook(lambda m, args: seen.append((m, args[0].detach())))
             for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return seen


def ours_and_theirs(m, x):
    """Callables of one layer: customconv's op (as customconv.convert's module
    calls it) and F.conv2d."""
    w, b = m.weight.detach(), None if m.bias is None else m.bias.detach()
    s, p, d, g = list(m.stride), list(m.padding), list(m.dilation), m.groups
    ops = torch.ops.customconv
    if g == x.shape[1] and g > 1 and w.shape[0] % g == 0:
        ours = lambda: ops.depthwise_conv2d(x, w, b, s, p, d)  # noqa: E731
    else:
        ours = lambda: ops.conv2d(x, w, b, s, p, d, g)  # noqa: E731
    return ours, (lambda: F.conv2d(x, w, b, s, p, d, g))


def host_us(fn, calls=20, rounds=7):
    """CPU time per call to issue `calls` calls while the device is busy."""
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        torch.cuda._sleep(20_000_000)  # ~10 ms of device work queued ahead
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
    torch.cuda.synchronize()
    return best


def device_us(fn, calls=20, replays=10):
    """Device time per call: a CUDA graph of `calls` calls, replayed."""
    def calls_of_fn():
        for _ in range(calls):
            fn()
    return graph_replay_ms(calls_of_fn, replays) * 1e3 / calls


def describe(m, x):
    kind = "dw" if m.groups == x.shape[1] and m.groups > 1 else (f"g{m.groups}" if m.groups > 1 else "")
    return (f"{x.shape[0]}x{x.shape[1]}x{x.shape[2]}x{x.shape[3]} -> {m.out_channels} "
            f"k{m.kernel_size[0]} s{m.stride[0]} {kind}").strip()


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mobilenet_v2")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--layout", default="nchw", choices=["nchw", "channels_last"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--top", type=int, default=20)
    a = p.parse_args(argv)
    dtype = getattr(torch, a.dtype)
    fmt = torch.channels_last if a.layout == "channels_last" else torch.contiguous_format
    model = make_base(a.model, 0).to("cuda", dtype).to(memory_format=fmt)
    x = torch.randn(a.batch, 3, 224, 224, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    groups = OrderedDict()
    for m, inp in layer_inputs(model, x):
        key = describe(m, inp)
        if key in groups:
            groups[key]["count"] += 1
            continue
        ours, theirs = ours_and_theirs(m, inp)
        groups[key] = dict(count=1, host=(host_us(ours), host_us(theirs)),
                           device=(device_us(ours), device_us(theirs)))
    print(f"{a.model} {a.dtype} {a.layout} N={a.batch} on {torch.cuda.get_device_name()}: "
          f"us per call, ours / F.conv2d")
    rows = sorted(groups.items(), key=lambda kv: -kv[1]["count"] * (
        max(kv[1]["host"][0], kv[1]["device"][0]) - max(kv[1]["host"][1], kv[1]["device"][1])))
    print(f"{'layer':40s} {'n':>3s} {'host ours':>10s} {'host F':>8s} {'dev ours':>9s} {'dev F':>8s}")
    for key, r in rows[:a.top]:
        print(f"{key:40s} {r['count']:3d} {r['host'][0]:10.1f} {r['host'][1]:8.1f} "
              f"{r['device'][0]:9.1f} {r['device'][1]:8.1f}")
    tot = lambda i, j: sum(r["count"] * r[i][j] for r in groups.values())  # noqa: E731
    print(f"sums over the model's convolutions, ms: host {tot('host', 0) / 1e3:.3f} / "
          f"{tot('host', 1) / 1e3:.3f}, device {tot('device', 0) / 1e3:.3f} / {tot('device', 1) / 1e3:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
