"""conv2d's input gradient of stems on CUDA cores
(ops/conv2d/stem_grad_input_cuda.cu): 1 to 4 input channels, any window,
stride, padding and dilation, grad_output and the input in any layout,
float16, bfloat16 and float32 against PyTorch's gradient in float64; the result in F.conv2d's gradient
memory format, with no column buffer. Layers the route declines (5 input
channels, groups, channels_last gradients of a number of output channels
that 4 does not divide, NCHW gradients of windows of more than 16 taps) keep
the other routes and the same results."""

import pytest
import torch
import torch.nn.functional as F

from testlib import capture_and_replay, cuda, kernels_launched, make_tensor, ops

pytestmark = cuda

KERNEL = "stem_grad_input_kernel"
DTYPES = [pytest.param(torch.float16, id="f16"), pytest.param(torch.bfloat16, id="bf16"),
          pytest.param(torch.float32, id="f32")]
# Relative to the largest gradient: one rounding of a float32 sum of a few
# thousand terms (float32 is exact arithmetic here, not TF32).
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-5}
LAYOUTS = ["contiguous", "channels_last", "sliced", "transposed"]


def grad_reference(go, x, w, stride, padding, dilation, groups=1):
    return torch.nn.grad.conv2d_input(x.shape, w.double(), go.double(), stride, padding, dilation,
                                      groups)


def check(got, want, dtype, ctx, tf32=False):
    """tf32: the result may come from the other routes (TF32 in float32)."""
    tol = 4 * TOL[dtype] if tf32 and dtype != torch.float32 else 2e-3 if tf32 else TOL[dtype]
    scale = max(want.abs().max().item(), 1.0)
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * scale,
                               msg=lambda m: f"{ctx}\n{m}")


def torch_format(x, w, go, stride, padding, dilation):
    """The memory format of PyTorch's own input gradient for these tensors."""
    xr = x.detach().clone(memory_format=torch.preserve_format).requires_grad_()
    y = F.conv2d(xr, w, None, stride, padding, dilation)
    (g,) = torch.autograd.grad(y, xr, go)
    if g.is_contiguous(memory_format=torch.channels_last) and not g.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


def random_layer(dtype, rng, gen, seed, **fixed):
    p = dict(c=rng.randint(1, 4), k=4 * rng.randint(1, 18), n=rng.randint(1, 3),
             kh=rng.randint(1, 7), kw=rng.randint(1, 7),
             stride=(rng.randint(1, 3), rng.randint(1, 3)),
             dilation=(rng.randint(1, 2), rng.randint(1, 2)),
             layout=rng.choice(LAYOUTS), go_layout=rng.choice(LAYOUTS),
             weight_layout=rng.choice(LAYOUTS))
    p.update(fixed)
    kh, kw = p["kh"], p["kw"]
    dh, dw = p["dilation"]
    padding = (rng.randint(0, dh * (kh - 1)), rng.randint(0, dw * (kw - 1)))
    h = rng.randint(dh * (kh - 1) + 1, 48)
    w_ = rng.randint(dw * (kw - 1) + 1, 48)
    x = make_tensor((p["n"], p["c"], h, w_), dtype, "cuda", p["layout"], gen)
    w = make_tensor((p["k"], p["c"], kh, kw), dtype, "cuda", p["weight_layout"], gen)
    stride, dilation = list(p["stride"]), list(p["dilation"])
    oh = (h + 2 * padding[0] - dh * (kh - 1) - 1) // stride[0] + 1
    ow = (w_ + 2 * padding[1] - dw * (kw - 1) - 1) // stride[1] + 1
    go = make_tensor((p["n"], p["k"], oh, ow), dtype, "cuda", p["go_layout"], gen)
    ctx = (f"seed={seed} n={p['n']} c={p['c']} k={p['k']} {h}x{w_} window {kh}x{kw} "
           f"s={stride} p={padding} d={dilation} input {p['layout']} grad_output "
           f"{p['go_layout']} weight {p['weight_layout']}")
    return go, x, w, stride, list(padding), dilation, ctx


@pytest.mark.parametrize("idx", range(24))
@pytest.mark.parametrize("dtype", DTYPES)
def test_stem_grad_input_matches_torch_on_random_layers(dtype, idx, rng, gen, seed):
    go, x, w, stride, padding, dilation, ctx = random_layer(dtype, rng, gen, seed)
    call = lambda: ops.conv2d_grad_input(go, x, w, stride, padding, dilation, 1)  # noqa: E731
    fmt = torch_format(x, w, go, stride, padding, dilation)
    # (NCHW gradients of windows of more than 16 taps keep the column route.)
    direct = fmt == torch.channels_last or w.shape[2] * w.shape[3] <= 16
    if direct:
        assert KERNEL in kernels_launched(call), ctx
    gi = call()
    check(gi, grad_reference(go, x, w, stride, padding, dilation), dtype, ctx, tf32=not direct)
    assert gi.is_contiguous(memory_format=fmt), ctx


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_resnet_stem_backward_runs_on_the_direct_kernel(dtype, layout, gen):
    # ResNet's stem (3 -> 64, 7x7, stride 2, padding 3) through autograd.
    x = make_tensor((2, 3, 224, 224), dtype, "cuda", layout, gen).requires_grad_()
    w = make_tensor((64, 3, 7, 7), dtype, "cuda", gen=gen)
    args = ([2, 2], [3, 3], [1, 1])
    out = ops.conv2d(x, w, None, *args, 1)
    go = make_tensor(tuple(out.shape), dtype, "cuda", layout, gen)
    names = kernels_launched(lambda: torch.autograd.grad(out, x, go, retain_graph=True))
    if layout == "channels_last":  # (NCHW keeps the column route for 7x7 windows)
        assert KERNEL in names and "col2im" not in names, names[:300]
    (gi,) = torch.autograd.grad(out, x, go)
    check(gi, grad_reference(go, x, w, *args), dtype, layout, tf32=layout != "channels_last")
    assert gi.is_contiguous(memory_format=torch_format(x, w, go, *args))


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_wide_stem_grad_input(dtype, layout, rng, gen, seed):
    # More output channels than a warp's lanes take at once, not a multiple of
    # them (in NCHW not even of 4), on windows of at most 16 taps.
    k = rng.choice([100, 132, 260]) + (layout == "contiguous")
    go, x, w, stride, padding, dilation, ctx = random_layer(
        dtype, rng, gen, seed, k=k, kh=rng.randint(1, 4), kw=rng.randint(1, 4), layout=layout,
        go_layout=layout, weight_layout="contiguous")
    call = lambda: ops.conv2d_grad_input(go, x, w, stride, padding, dilation, 1)  # noqa: E731
    assert KERNEL in kernels_launched(call), ctx
    check(call(), grad_reference(go, x, w, stride, padding, dilation), dtype, ctx)


@pytest.mark.parametrize("dtype", DTYPES)
def test_stem_grad_input_allocates_only_its_result(dtype, gen):
    # N=8 at 224x224: the column route's buffer would be 8*112*112*147 elements.
    x = make_tensor((8, 3, 224, 224), dtype, "cuda", "channels_last", gen)
    w = make_tensor((64, 3, 7, 7), dtype, "cuda", gen=gen)
    go = make_tensor((8, 64, 112, 112), dtype, "cuda", "channels_last", gen)
    args = ([2, 2], [3, 3], [1, 1], 1)
    ops.conv2d_grad_input(go, x, w, *args)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    gi = ops.conv2d_grad_input(go, x, w, *args)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before - gi.numel() * gi.element_size()
    assert extra <= 1 << 20, extra


@pytest.mark.parametrize("dtype", [pytest.param(torch.float16, id="f16"),
                                   pytest.param(torch.float32, id="f32")])
def test_nchw_stem_of_many_taps_takes_columns_in_bounded_chunks(dtype, gen):
    # NCHW windows of more than 16 taps keep the column route. Its per-image
    # columns (147 x 12544 elements: 3.5 MiB in float16, 7 in float32) go in
    # chunks of at most 32 MiB, the last one partial: 9 images a chunk in
    # float16, 4 in float32.
    n = 11
    x = make_tensor((n, 3, 224, 224), dtype, "cuda", gen=gen)
    w = make_tensor((64, 3, 7, 7), dtype, "cuda", gen=gen)
    go = make_tensor((n, 64, 112, 112), dtype, "cuda", gen=gen)
    args = ([2, 2], [3, 3], [1, 1])
    ops.conv2d_grad_input(go, x, w, *args, 1)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    gi = ops.conv2d_grad_input(go, x, w, *args, 1)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before - gi.numel() * gi.element_size()
    assert extra <= 33 << 20, extra
    assert gi.is_contiguous()
    check(gi, grad_reference(go, x, w, *args), dtype, "nchw 7x7", tf32=True)


@pytest.mark.parametrize("case", ["channels-5", "groups-2", "channels_last-10-outputs"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_declined_layers_keep_the_other_routes(dtype, case, gen):
    # (10 output channels in channels_last: not whole vectors of 4.)
    c, k, window, groups = {"channels-5": (5, 32, 3, 1), "groups-2": (4, 32, 3, 2),
                            "channels_last-10-outputs": (3, 10, 7, 1)}[case]
    x = make_tensor((2, c, 40, 40), dtype, "cuda", "channels_last", gen)
    w = make_tensor((k, c // groups, window, window), dtype, "cuda", gen=gen)
    args = ([2, 2], [window // 2] * 2, [1, 1])
    oh = (40 + 2 * (window // 2) - window) // 2 + 1
    go = make_tensor((2, k, oh, oh), dtype, "cuda", "channels_last", gen)
    call = lambda: ops.conv2d_grad_input(go, x, w, *args, groups)  # noqa: E731
    assert KERNEL not in kernels_launched(call), case
    check(call(), grad_reference(go, x, w, *args, groups), dtype, case, tf32=True)


def test_stem_grad_input_of_empty_tensors_and_in_a_cuda_graph(gen):
    w = make_tensor((64, 3, 7, 7), torch.float16, "cuda", gen=gen)
    args = ([2, 2], [3, 3], [1, 1], 1)
    empty_x = torch.empty((0, 3, 32, 32), dtype=torch.float16, device="cuda")
    empty_go = torch.empty((0, 64, 16, 16), dtype=torch.float16, device="cuda")
    assert ops.conv2d_grad_input(empty_go, empty_x, w, *args).shape == (0, 3, 32, 32)
    x = make_tensor((4, 3, 64, 64), torch.float16, "cuda", "channels_last", gen)
    go = make_tensor((4, 64, 32, 32), torch.float16, "cuda", "channels_last", gen)
    (gi,), _graph = capture_and_replay(lambda: (ops.conv2d_grad_input(go, x, w, *args),), [go],
                                       gen)
    check(gi, grad_reference(go, x, w, *args[:3]), torch.float16, "graph")


def test_bad_stem_grad_input_arguments_get_clear_errors(gen):
    x = make_tensor((2, 3, 32, 32), torch.float16, "cuda", gen=gen)
    w = make_tensor((64, 3, 7, 7), torch.float16, "cuda", gen=gen)
    go = make_tensor((2, 64, 16, 16), torch.float16, "cuda", gen=gen)
    args = ([2, 2], [3, 3], [1, 1], 1)
    with pytest.raises(RuntimeError, match="grad_output"):
        ops.conv2d_grad_input(go[:, :32], x, w, *args)
    with pytest.raises(RuntimeError, match="weight"):
        ops.conv2d_grad_input(go, x, w.float(), *args)
    with pytest.raises(RuntimeError, match="grad_output"):
        ops.conv2d_grad_input(go.cpu(), x, w, *args)
