"""conv2d's one-launch route for tiny NCHW problems on CUDA
(ops/conv2d/tiny_direct.h): NCHW input and result, at most 2^20
multiply-adds, against F.conv2d in float64 on random geometries (groups,
stride, padding, dilation, bias or none) in every CUDA dtype, with the
tolerance of an exact float32 (float64) sum; the kernel seen running in the
profiler; a CUDA graph; and the problems it leaves to the other routes
(channels_last data, a channels_last weight, a problem just above the
bound), which still match."""

import random

import pytest
import torch
import torch.nn.functional as F

from testlib import CUDA_DTYPES, assert_matches, capture_and_replay, cuda, dtype_name, make_tensor, ops

pytestmark = [cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TINY_MACS = 1 << 20


def run(x, w, b, stride, padding, dilation, groups):
    """The op's result and whether the tiny kernel ran (None where the
    profiler saw no kernel: under compute-sanitizer)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = ops.conv2d(x, w, b, list(stride), list(padding), list(dilation), groups)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return out, (any("tiny_forward_kernel" in n for n in names) if names else None)


def check(got, x, w, b, stride, padding, dilation, groups, dtype, ctx):
    args = (stride, padding, dilation, groups)
    want = F.conv2d(x.double(), w.double(), None if b is None else b.double(), *args)
    bound = F.conv2d(x.double().abs(), w.double().abs(), None if b is None else b.double().abs(), *args)
    assert got.shape == want.shape and got.dtype == dtype, ctx
    assert_matches(got, want.cpu(), bound.cpu(), dtype, w.shape[1] * w.shape[2] * w.shape[3], "output", ctx)


def random_case(rng: random.Random):
    groups = rng.choice([1, 1, 2, 3])
    # (One input channel a group with groups > 1 is a depthwise layer: the depthwise kernels' route.)
    cg, kg = rng.randint(1 if groups == 1 else 2, 6), rng.randint(1, 5)
    kh, kw = rng.choice([1, 2, 3, 5]), rng.choice([1, 3, 4])
    stride = (rng.choice([1, 2]), rng.choice([1, 2, 3]))
    dilation = (rng.choice([1, 2]), rng.choice([1, 2]))
    padding = (rng.randint(0, (kh - 1) * dilation[0] + 1), rng.randint(0, (kw - 1) * dilation[1] + 1))
    h = max(1, (kh - 1) * dilation[0] + 1 - 2 * padding[0]) + rng.randint(0, 9)
    w = max(1, (kw - 1) * dilation[1] + 1 - 2 * padding[1]) + rng.randint(0, 9)
    return dict(n=rng.randint(1, 3), c=cg * groups, k=kg * groups, h=h, w=w, kernel=(kh, kw), stride=stride,
                padding=padding, dilation=dilation, groups=groups, bias=rng.random() < 0.7)


@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_name)
@pytest.mark.parametrize("idx", range(12))
def test_tiny_nchw_forward_matches_torch_in_one_launch(dtype, idx, gen, seed):
    cfg = random_case(random.Random(seed))
    x = make_tensor((cfg["n"], cfg["c"], cfg["h"], cfg["w"]), dtype, "cuda", gen=gen)
    w = make_tensor((cfg["k"], cfg["c"] // cfg["groups"]) + cfg["kernel"], dtype, "cuda", gen=gen)
    b = make_tensor((cfg["k"],), dtype, "cuda", gen=gen) if cfg["bias"] else None
    args = (cfg["stride"], cfg["padding"], cfg["dilation"], cfg["groups"])
    got, ran = run(x, w, b, *args)
    ctx = f"seed={seed} {cfg}"
    assert got.is_contiguous(), ctx
    assert ran in (True, None), ctx
    check(got, x, w, b, *args, dtype, ctx)


@pytest.mark.parametrize("case", ["1x1", "3x3"])
def test_tiny_route_in_a_cuda_graph(case, gen):
    k = 1 if case == "1x1" else 3
    x = make_tensor((2, 8, 8, 8), torch.float32, "cuda", gen=gen)
    w = make_tensor((8, 8, k, k), torch.float32, "cuda", gen=gen)
    b = make_tensor((8,), torch.float32, "cuda", gen=gen)
    pad = [k // 2] * 2
    outs, graph = capture_and_replay(lambda: (ops.conv2d(x, w, b, [1, 1], pad, [1, 1], 1),), [x], gen)
    check(outs[0], x, w, b, (1, 1), tuple(pad), (1, 1), 1, torch.float32, case)


@pytest.mark.parametrize("case", ["channels_last-input", "channels_last-weight", "above-the-bound"])
def test_problems_the_tiny_route_declines_still_match(case, gen):
    c = k = 8
    size = 8
    if case == "above-the-bound":  # 2 x 64 x 24 x 24 outputs x 64 x 9 taps > 2^20
        c = k = 64
        size = 24
    x = make_tensor((2, c, size, size), torch.float32, "cuda", "channels_last" if case == "channels_last-input"
                    else "contiguous", gen)
    w = make_tensor((k, c, 3, 3), torch.float32, "cuda", "channels_last" if case == "channels_last-weight"
                    else "contiguous", gen)
    assert case != "above-the-bound" or x.shape[0] * k * size * size * c * 9 > TINY_MACS
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # exact float32 on every route, to keep one tolerance
    try:
        got, ran = run(x, w, None, (1, 1), (1, 1), (1, 1), 1)
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    assert ran in (False, None), case
    if case.startswith("channels_last"):
        assert got.is_contiguous(memory_format=torch.channels_last), case
    check(got, x, w, None, (1, 1), (1, 1), (1, 1), 1, torch.float32, case)
