"""customconv::im2col against F.unfold and customconv::col2im against F.fold:
forward and gradients, on random and hand-picked geometries, for every
supported device and dtype. im2col (and col2im's gradient) only moves data, so
it must be bitwise equal to the reference; col2im sums overlapping windows."""

import pytest
import torch
import torch.nn.functional as F

import customconv
from testlib import (
    DEVICE_DTYPES,
    DEVICES,
    assert_exact,
    assert_matches,
    cuda,
    f64,
    make_tensor,
    ops,
    random_window_config,
    sync,
    tolerance_factor,
    unfold_args,
)

N_RANDOM = 40


def call_im2col(x, cfg, call):
    if call == "ops":
        return ops.im2col(x, list(cfg.kernel), list(cfg.stride), list(cfg.padding),
                          list(cfg.dilation))
    return customconv.im2col(x, **unfold_args(cfg))  # F.unfold's argument names


def call_col2im(c, cfg, call):
    if call == "ops":
        return ops.col2im(c, list(cfg.size), list(cfg.kernel), list(cfg.stride),
                          list(cfg.padding), list(cfg.dilation))
    return customconv.col2im(c, cfg.size, **unfold_args(cfg))  # F.fold's argument names


def run_im2col_case(cfg, device, dtype, gen, ctx, call="ops"):
    x = make_tensor(cfg.image_shape, dtype, device, cfg.layout, gen, requires_grad=True)
    out = call_im2col(x, cfg, call)
    assert out.dtype == dtype and out.device == x.device, ctx
    x64 = f64(x).requires_grad_()
    ref = F.unfold(x64, **unfold_args(cfg))
    assert_exact(out, ref.detach(), "im2col output", ctx)

    g = make_tensor(out.shape, dtype, device, cfg.grad_layout, gen)
    (gx,) = torch.autograd.grad(out, x, g)
    sync(device)
    (ref_gx,) = torch.autograd.grad(ref, x64, f64(g))
    bound = F.fold(f64(g).abs(), cfg.size, **unfold_args(cfg))
    assert_matches(gx, ref_gx, bound, dtype, cfg.overlap, "im2col grad_input", ctx, device)


def run_col2im_case(cfg, device, dtype, gen, ctx, call="ops"):
    c = make_tensor(cfg.columns_shape, dtype, device, cfg.layout, gen, requires_grad=True)
    out = call_col2im(c, cfg, call)
    c64 = f64(c).requires_grad_()
    ref = F.fold(c64, cfg.size, **unfold_args(cfg))
    bound = F.fold(f64(c).abs(), cfg.size, **unfold_args(cfg))
    assert_matches(out, ref.detach(), bound, dtype, cfg.overlap, "col2im output", ctx, device)

    g = make_tensor(out.shape, dtype, device, cfg.grad_layout, gen)
    (gc,) = torch.autograd.grad(out, c, g)
    sync(device)
    (ref_gc,) = torch.autograd.grad(ref, c64, f64(g))
    assert gc.dtype == dtype, ctx
    assert_exact(gc, ref_gc, "col2im grad_columns", ctx)


@pytest.mark.parametrize("idx", range(N_RANDOM))
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_im2col_matches_unfold_on_random_configs(device, dtype, idx, rng, gen, seed):
    cfg = random_window_config(rng)
    call = rng.choice(["ops", "functional"])
    run_im2col_case(cfg, device, dtype, gen, f"seed={seed} {device} {dtype} call={call} {cfg}", call)


@pytest.mark.parametrize("idx", range(N_RANDOM))
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_col2im_matches_fold_on_random_configs(device, dtype, idx, rng, gen, seed):
    cfg = random_window_config(rng)
    call = rng.choice(["ops", "functional"])
    run_col2im_case(cfg, device, dtype, gen, f"seed={seed} {device} {dtype} call={call} {cfg}", call)


EDGE_CASES = {
    "batch0": dict(batch=0),
    "batch1": dict(batch=1),
    "unbatched": dict(batch=None),
    "unbatched_transposed": dict(batch=None, layout="transposed", grad_layout="transposed"),
    "kernel_1x1": dict(kernel=(1, 1)),
    # Every plane one row of the columns (a strided copy of rows on CUDA);
    # odd and 16-byte multiple planes.
    "kernel_1x1_unit_stride": dict(kernel=(1, 1), stride=(1, 1), padding=(0, 0), size=(7, 7),
                                   batch=3, channels=5),
    "kernel_1x1_unit_stride_vectors": dict(kernel=(1, 1), stride=(1, 1), padding=(0, 0),
                                           size=(4, 8), batch=2, channels=3),
    "kernel_1x4_dilated": dict(kernel=(1, 4), dilation=(3, 2), size=(3, 8)),
    "kernel_covers_whole_image": dict(kernel=(3, 5), size=(3, 5), padding=(0, 0),
                                      dilation=(1, 1)),
    "stride_skips_pixels": dict(kernel=(1, 2), stride=(3, 4), padding=(0, 0), dilation=(1, 1),
                                size=(7, 9)),
    "padding_larger_than_kernel": dict(kernel=(2, 1), padding=(3, 2), size=(2, 3)),
    "overlapping_windows": dict(kernel=(4, 3), stride=(1, 1), dilation=(1, 2), size=(6, 7)),
    "channels_last": dict(layout="channels_last", batch=2),
    "sliced": dict(layout="sliced", grad_layout="sliced", batch=3),
    "expanded": dict(layout="expanded", grad_layout="expanded", batch=3),
    "many_channels": dict(channels=9, batch=2),
}


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_im2col_matches_unfold_on_edge_cases(device, dtype, case, rng, gen, seed):
    cfg = random_window_config(rng, **EDGE_CASES[case])
    run_im2col_case(cfg, device, dtype, gen, f"seed={seed} {device} {dtype} case={case} {cfg}")


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_col2im_matches_fold_on_edge_cases(device, dtype, case, rng, gen, seed):
    cfg = random_window_config(rng, **EDGE_CASES[case])
    run_col2im_case(cfg, device, dtype, gen, f"seed={seed} {device} {dtype} case={case} {cfg}")


@pytest.mark.parametrize("idx", range(5))
@pytest.mark.parametrize("device", DEVICES)
def test_im2col_and_col2im_are_adjoint(device, idx, rng, gen, seed):
    # <im2col(x), c> == <x, col2im(c)> for every x and c.
    cfg = random_window_config(rng, batch=2)
    x = make_tensor(cfg.image_shape, torch.float64, device, cfg.layout, gen)
    c = make_tensor(cfg.columns_shape, torch.float64, device, cfg.grad_layout, gen)
    lhs = (call_im2col(x, cfg, "ops") * c).sum()
    rhs = (x * call_col2im(c, cfg, "ops")).sum()
    scale = (x.abs().sum() * c.abs().max()).item()
    assert abs(lhs.item() - rhs.item()) <= 1e-12 * scale, f"seed={seed} {cfg}: {lhs} vs {rhs}"


@pytest.mark.parametrize("device", DEVICES)
def test_im2col_col2im_accept_schema_defaults_and_torch_argument_order(device, gen):
    x = make_tensor((2, 3, 7, 8), torch.float64, device, gen=gen)
    xr = x.cpu()
    # im2col: the op's order (kernel_size, stride, padding, dilation) with defaults,
    # single-int pairs, and the wrapper with F.unfold's order (kernel_size, dilation, padding, stride).
    pairs = [
        (ops.im2col(x, [2, 3]), F.unfold(xr, (2, 3))),
        (ops.im2col(x, [2]), F.unfold(xr, 2)),
        (ops.im2col(x, [3, 2], [2, 1]), F.unfold(xr, (3, 2), stride=(2, 1))),
        (ops.im2col(x, [3, 2], 2, 1, 2), F.unfold(xr, (3, 2), 2, 1, 2)),
        (ops.im2col(x, kernel_size=[2, 2], dilation=[2, 1]), F.unfold(xr, 2, dilation=(2, 1))),
        (customconv.im2col(x, (3, 2), (2, 1), (1, 0), (1, 2)), F.unfold(xr, (3, 2), (2, 1), (1, 0), (1, 2))),
        (customconv.im2col(x, 3, 1, 1, 2), F.unfold(xr, 3, 1, 1, 2)),
    ]
    cols = F.unfold(xr, (3, 2), (2, 1), (1, 0), (1, 2))
    cols_dev = cols.to(device)
    pairs += [
        (ops.col2im(cols_dev, [7, 8], [3, 2], [1, 2], [1, 0], [2, 1]),
         F.fold(cols, (7, 8), (3, 2), (2, 1), (1, 0), (1, 2))),
        (customconv.col2im(cols_dev, (7, 8), (3, 2), (2, 1), (1, 0), (1, 2)),
         F.fold(cols, (7, 8), (3, 2), (2, 1), (1, 0), (1, 2))),
    ]
    c2 = F.unfold(xr, 2)
    pairs += [
        (ops.col2im(c2.to(device), [7, 8], [2]), F.fold(c2, (7, 8), 2)),
        (customconv.col2im(c2.to(device), (7, 8), 2), F.fold(c2, (7, 8), 2)),
    ]
    for i, (got, want) in enumerate(pairs):
        assert got.shape == want.shape, f"case {i}: {tuple(got.shape)} vs {tuple(want.shape)}"
        torch.testing.assert_close(got.cpu(), want, rtol=1e-12, atol=1e-12, msg=f"case {i}")


@cuda
def test_im2col_and_col2im_index_past_2_pow_31_elements_on_cuda(seed):
    # Columns of 2.3e9 elements: offsets past 2**31 must not wrap (64-bit indexing).
    if torch.cuda.get_device_properties(0).total_memory < 48 * 2**30:
        pytest.skip("needs a GPU with 48 GiB of memory")
    cuda_gen = torch.Generator("cuda").manual_seed(seed)
    kernel, size = (24, 24), (1024, 1024)
    x = torch.randn((1, 4) + size, generator=cuda_gen, device="cuda", dtype=torch.float16)
    cols = ops.im2col(x, list(kernel), [1, 1], [0, 0], [1, 1])
    assert cols.numel() > 2**31
    ref = F.unfold(x, kernel)
    assert torch.equal(cols, ref), f"seed={seed}: im2col differs from F.unfold past 2**31 elements"
    del cols, ref

    c = torch.randn((1, 4 * 24 * 24, 1001 * 1001), generator=cuda_gen, device="cuda")
    assert c.numel() > 2**31
    out = ops.col2im(c, list(size), list(kernel), [1, 1], [0, 0], [1, 1]).double()
    bound = F.fold(c.abs(), size, kernel).double()
    ref = F.fold(c.double(), size, kernel)
    del c
    err = (out - ref).abs()
    tol = tolerance_factor(torch.float32, kernel[0] * kernel[1]) * bound
    assert bool((err <= tol).all()), (
        f"seed={seed}: col2im past 2**31 elements: max error {err.max().item():.3g}"
    )
