"""conv2d's forward of RGB stems with 3x3 windows on CUDA cores
(ops/conv2d/stem_direct_cuda.cu): 1 to 4 input channels, 8 to 64 output
channels in steps of 8, any stride, padding and dilation, the input in any
layout, with and without bias, conv2d_fused's activations in the same pass,
float16, bfloat16 and float32 against F.conv2d in float64; the result in
F.conv2d's memory format. Calls the route declines (12 or 72 output
channels, 5 input channels, a 5x5 window; conv2d_fused with a residual,
whose fallback may run the convolution alone here) keep the other routes and
the same results; the gradients are the other routes' too."""

import pytest
import torch
import torch.nn.functional as F

from testlib import capture_and_replay, cuda, kernels_launched, make_tensor, ops

pytestmark = cuda

DTYPES = [pytest.param(torch.float16, id="f16"), pytest.param(torch.bfloat16, id="bf16"),
          pytest.param(torch.float32, id="f32")]
# Relative to the largest output: one rounding of a float32 sum of at most 36 terms.
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}
ACTIVATIONS = {
    "identity": lambda t: t, "relu": F.relu, "relu6": F.relu6, "silu": F.silu,
    "hardswish": lambda t: t * (t + 3).clamp(0, 6) / 6, "gelu": F.gelu, "sigmoid": torch.sigmoid}


def format_of(t):
    """channels_last where t is laid out so (and not also contiguous), else contiguous."""
    cl = torch.channels_last
    if t.is_contiguous(memory_format=cl) and not t.is_contiguous():
        return cl
    return torch.contiguous_format


def check(got, want, dtype, ctx):
    scale = max(want.abs().max().item(), 1.0)
    torch.testing.assert_close(got.double(), want, rtol=TOL[dtype], atol=TOL[dtype] * scale,
                               msg=lambda m: f"{ctx}\n{m}")


def random_stem(dtype, rng, gen, seed, **fixed):
    """A stem drawn from rng (fixed entries win): (x, w, b, stride, padding,
    dilation, description)."""
    p = dict(c=rng.randint(1, 4), k=8 * rng.randint(1, 8), n=rng.randint(1, 3),
             stride=(rng.randint(1, 3), rng.randint(1, 3)),
             dilation=(rng.randint(1, 2), rng.randint(1, 2)),
             layout=rng.choice(["contiguous", "channels_last", "sliced", "transposed"]),
             weight_layout=rng.choice(["contiguous", "channels_last", "sliced", "transposed"]),
             bias=rng.random() < 0.7)
    p.update(fixed)
    padding = tuple(rng.randint(0, 2 * d) for d in p["dilation"])
    h = rng.randint(2 * p["dilation"][0] + 1, 40)
    w_ = rng.randint(2 * p["dilation"][1] + 1, 40)
    x = make_tensor((p["n"], p["c"], h, w_), dtype, "cuda", p["layout"], gen)
    w = make_tensor((p["k"], p["c"], 3, 3), dtype, "cuda", p["weight_layout"], gen)
    # Every other element of a longer vector: a bias with a stride of 2.
    b = make_tensor((2 * p["k"],), dtype, "cuda", gen=gen)[::2] if p["bias"] else None
    ctx = (f"seed={seed} n={p['n']} c={p['c']} k={p['k']} {h}x{w_} s={p['stride']} p={padding} "
           f"d={p['dilation']} {p['layout']} weight {p['weight_layout']} bias={b is not None}")
    return x, w, b, list(p["stride"]), list(padding), list(p["dilation"]), ctx


def reference(x, w, b, stride, padding, dilation, activation="identity"):
    y = F.conv2d(x.double(), w.double(), None if b is None else b.double(), stride, padding,
                 dilation)
    return ACTIVATIONS[activation](y)


@pytest.mark.parametrize("idx", range(24))
@pytest.mark.parametrize("dtype", DTYPES)
def test_stem_matches_torch_on_random_geometries(dtype, idx, rng, gen, seed):
    x, w, b, stride, padding, dilation, ctx = random_stem(dtype, rng, gen, seed)
    out = ops.conv2d(x, w, b, stride, padding, dilation, 1)
    check(out, reference(x, w, b, stride, padding, dilation), dtype, ctx)
    # F.conv2d's memory format in this dtype (its float64 reference keeps NCHW
    # for a channels_last weight).
    fmt = format_of(F.conv2d(x, w, b, stride, padding, dilation))
    assert out.is_contiguous(memory_format=fmt), ctx


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_model_stems_run_on_the_direct_kernel(dtype, layout, gen):
    # MobileNet's, EfficientNet's and RegNet's stem (3 -> 32, 3x3, stride 2)
    # and MobileNetV3's (3 -> 16), at 224x224.
    for k in (32, 16):
        x = make_tensor((2, 3, 224, 224), dtype, "cuda", layout, gen)
        w = make_tensor((k, 3, 3, 3), dtype, "cuda", gen=gen)
        b = make_tensor((k,), dtype, "cuda", gen=gen)
        args = ([2, 2], [1, 1], [1, 1], 1)
        names = kernels_launched(lambda: ops.conv2d(x, w, b, *args))
        assert "stem_forward_kernel" in names, names[:300]
        out = ops.conv2d(x, w, b, *args)
        check(out, reference(x, w, b, *args[:3]), dtype, f"k={k} {layout}")
        assert out.is_contiguous(memory_format=format_of(F.conv2d(x, w, b, *args[:3])))


@pytest.mark.parametrize("dtype", DTYPES)
def test_stem_reads_a_channels_last_weight_and_a_sliced_bias_in_place(dtype, gen):
    cl = torch.channels_last
    x = make_tensor((2, 3, 32, 32), dtype, "cuda", "channels_last", gen)
    w = make_tensor((32, 3, 3, 3), dtype, "cuda", "channels_last", gen)
    b = make_tensor((64,), dtype, "cuda", gen=gen)[::2]
    assert not w.is_contiguous() and w.is_contiguous(memory_format=cl) and not b.is_contiguous()
    args = ([2, 2], [1, 1], [1, 1], 1)
    names = kernels_launched(lambda: ops.conv2d(x, w, b, *args))
    assert "stem_forward_kernel" in names and "copy" not in names, names[:300]
    check(ops.conv2d(x, w, b, *args), reference(x, w, b, *args[:3]), dtype, "channels_last weight")


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_stem_applies_the_fused_activation(dtype, activation, rng, gen, seed):
    x, w, b, stride, padding, dilation, ctx = random_stem(dtype, rng, gen, seed, n=2, k=32)
    x = make_tensor((2, 3, 64, 64), dtype, "cuda", rng.choice(["contiguous", "channels_last"]), gen)
    w = make_tensor((32, 3, 3, 3), dtype, "cuda", gen=gen)
    args = (stride, padding, dilation, 1)
    names = kernels_launched(lambda: ops.conv2d_fused(x, w, b, *args, activation, None))
    assert "stem_forward_kernel" in names, names[:300]
    out = ops.conv2d_fused(x, w, b, *args, activation, None)
    want = reference(x, w, b, stride, padding, dilation, activation)
    check(out, want, dtype, f"{ctx} {activation}")


@pytest.mark.parametrize("case", ["outputs-12", "outputs-72", "channels-5", "window-5x5",
                                  "residual"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_declined_stems_keep_the_other_routes(dtype, case, gen):
    c, k, window = {"outputs-12": (3, 12, 3), "outputs-72": (3, 72, 3),
                    "channels-5": (5, 32, 3), "window-5x5": (3, 32, 5)}.get(case, (3, 32, 3))
    x = make_tensor((2, c, 48, 48), dtype, "cuda", "channels_last", gen)
    w = make_tensor((k, c, window, window), dtype, "cuda", gen=gen)
    b = make_tensor((k,), dtype, "cuda", gen=gen)
    args = ([2, 2], [window // 2] * 2, [1, 1], 1)
    want = reference(x, w, b, *args[:3])
    if case == "residual":
        r = make_tensor(tuple(want.shape), dtype, "cuda", "channels_last", gen)
        call = lambda: ops.conv2d_fused(x, w, b, *args, "relu", r)  # noqa: E731
        want = F.relu(want + r.double())
    else:
        call = lambda: ops.conv2d(x, w, b, *args)  # noqa: E731
    if case != "residual":  # (a residual's fallback may run the convolution alone on it)
        assert "stem_forward_kernel" not in kernels_launched(call), case
    check(call(), want, dtype, case)


@pytest.mark.parametrize("dtype", DTYPES)
def test_stem_gradients_match_torch(dtype, rng, gen, seed):
    # The forward on this route, the gradients on the others: all against float64.
    x, w, b, stride, padding, dilation, ctx = random_stem(dtype, rng, gen, seed, bias=True)
    x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
    out = ops.conv2d(x, w, b, stride, padding, dilation, 1)
    go = make_tensor(tuple(out.shape), dtype, "cuda", "channels_last", gen)
    got = torch.autograd.grad(out, (x, w, b), go)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    y64 = F.conv2d(x64, w64, b64, stride, padding, dilation)
    want = torch.autograd.grad(y64, (x64, w64, b64), go.double())
    for name, g, ref in zip(("grad_input", "grad_weight", "grad_bias"), got, want):
        scale = max(ref.abs().max().item(), 1.0)
        tol = 4 * TOL[dtype] if dtype != torch.float32 else 1e-4
        torch.testing.assert_close(g.double(), ref, rtol=tol, atol=tol * scale,
                                   msg=lambda m, name=name: f"{ctx} {name}\n{m}")


def test_stem_on_an_empty_batch_and_in_a_cuda_graph(gen):
    w = make_tensor((32, 3, 3, 3), torch.float16, "cuda", gen=gen)
    empty = torch.empty((0, 3, 32, 32), dtype=torch.float16, device="cuda")
    assert ops.conv2d(empty, w, None, [2, 2], [1, 1], [1, 1], 1).shape == (0, 32, 16, 16)
    x = make_tensor((4, 3, 64, 64), torch.float16, "cuda", "channels_last", gen)
    args = ([2, 2], [1, 1], [1, 1], 1)
    (out,), _graph = capture_and_replay(lambda: (ops.conv2d(x, w, None, *args),), [x], gen)
    check(out, reference(x, w, None, *args[:3]), torch.float16, "graph")


def test_bad_stem_arguments_get_clear_errors(gen):
    x = make_tensor((2, 3, 32, 32), torch.float16, "cuda", gen=gen)
    w = make_tensor((32, 3, 3, 3), torch.float16, "cuda", gen=gen)
    with pytest.raises(RuntimeError, match="weight"):
        ops.conv2d(x, w.float(), None, [2, 2], [1, 1], [1, 1], 1)
    with pytest.raises(RuntimeError, match="stride"):
        ops.conv2d(x, w, None, [0, 2], [1, 1], [1, 1], 1)
    with pytest.raises(RuntimeError, match="activation"):
        ops.conv2d_fused(x, w, None, [2, 2], [1, 1], [1, 1], 1, "swish", None)
