"""torch.autocast: conv2d, depthwise_conv2d and filter2d run in the autocast
dtype like F.conv2d; trilinear_interpolation follows F.grid_sample (float32 on
CPU, the widest argument dtype on CUDA); float64 is never cast. Values equal
the float64 reference on the inputs rounded to the dtype the op ran in, and
gradients reach the float32 leaves."""

import pytest
import torch
import torch.nn.functional as F

import customconv
from testlib import cuda, filter2d_torch, make_tensor, trilinear_torch

AUTOCASTS = [
    pytest.param("cpu", torch.bfloat16, id="cpu-bf16"),
    pytest.param("cpu", torch.float16, id="cpu-f16"),
    pytest.param("cuda", torch.float16, id="cuda-f16", marks=cuda),
    pytest.param("cuda", torch.bfloat16, id="cuda-bf16", marks=cuda),
]

# Relative error of one rounding to the dtype, times a small factor for the
# output's own rounding and float32 accumulation.
TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 3e-2}


def conv_case(device, gen):
    x = make_tensor((2, 4, 9, 10), torch.float32, device, gen=gen, requires_grad=True)
    w = make_tensor((6, 2, 3, 3), torch.float32, device, gen=gen, requires_grad=True)
    b = make_tensor((6,), torch.float32, device, gen=gen, requires_grad=True)
    return (x, w, b), lambda x, w, b: customconv.conv2d(x, w, b, padding=1, groups=2), \
        lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=2)


def depthwise_case(device, gen):
    x = make_tensor((2, 4, 9, 10), torch.float32, device, gen=gen, requires_grad=True)
    w = make_tensor((8, 1, 3, 5), torch.float32, device, gen=gen, requires_grad=True)
    b = make_tensor((8,), torch.float32, device, gen=gen, requires_grad=True)
    return (x, w, b), lambda x, w, b: customconv.depthwise_conv2d(x, w, b, stride=2, padding=1), \
        lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=4)


def filter2d_case(device, gen):
    x = make_tensor((2, 3, 9, 10), torch.float32, device, gen=gen, requires_grad=True)
    k = make_tensor((3, 5), torch.float32, device, gen=gen, requires_grad=True)
    return (x, k), lambda x, k: customconv.filter2d(x, k, "reflect"), \
        lambda x, k: filter2d_torch(x, k, "reflect")


CONV_LIKE = {"conv2d": conv_case, "depthwise_conv2d": depthwise_case, "filter2d": filter2d_case}


@pytest.mark.parametrize("device, dtype", AUTOCASTS)
@pytest.mark.parametrize("op", sorted(CONV_LIKE))
def test_conv_like_ops_run_in_the_autocast_dtype_like_conv2d(op, device, dtype, gen):
    args, ours, reference = CONV_LIKE[op](device, gen)
    with torch.autocast(device, dtype=dtype):
        out = ours(*args)
        x = args[0]
        relative = F.conv2d(x, torch.ones(1, x.shape[1], 1, 1, device=device)).dtype
    assert out.dtype == relative == dtype
    # The float64 reference on the inputs rounded to the autocast dtype.
    rounded = [a.detach().to(dtype).double().requires_grad_() for a in args]
    want = reference(*rounded)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol * want.abs().max().item())

    # Backward through the casts: float32 gradients for the float32 leaves.
    grad = make_tensor(out.shape, torch.float32, device, gen=gen)
    grads = torch.autograd.grad(out, args, grad.to(dtype))
    grads_want = torch.autograd.grad(want, rounded, grad.to(dtype).double())
    for g, gw in zip(grads, grads_want):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g.double(), gw, rtol=tol, atol=tol * gw.abs().max().item())


@pytest.mark.parametrize("device, dtype", AUTOCASTS)
def test_float64_is_not_cast_under_autocast(device, dtype, gen):
    x = make_tensor((2, 4, 7, 7), torch.float64, device, gen=gen)
    w = make_tensor((4, 1, 3, 3), torch.float64, device, gen=gen)
    feats = make_tensor((5, 8, 3), torch.float64, device, gen=gen)
    points = make_tensor((5, 3), torch.float64, device, gen=gen, uniform=(-1, 1))
    with torch.autocast(device, dtype=dtype):
        outs = [customconv.conv2d(x, w, groups=4), customconv.depthwise_conv2d(x, w),
                customconv.filter2d(x, w[0, 0]),
                customconv.trilinear_interpolation(feats, points)]
        assert F.conv2d(x, w, groups=4).dtype == torch.float64
    assert [o.dtype for o in outs] == [torch.float64] * 4
    torch.testing.assert_close(outs[0], F.conv2d(x, w, groups=4), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device, dtype", AUTOCASTS)
@pytest.mark.parametrize("feats_low, points_low", [(False, False), (True, False), (True, True)],
                         ids=["f32-f32", "low-f32", "low-low"])
def test_trilinear_interpolation_casts_like_grid_sample(device, dtype, feats_low, points_low, gen):
    feats = make_tensor((33, 8, 6), torch.float32, device, gen=gen)
    points = make_tensor((33, 3), torch.float32, device, gen=gen, uniform=(-1, 1))
    feats = feats.to(dtype) if feats_low else feats
    points = points.to(dtype) if points_low else points
    feats.requires_grad_()
    points.requires_grad_()
    grid_input = feats.detach().reshape(1, 33, 8, 6).permute(0, 3, 1, 2)[..., None]  # (1, 6, 33, 8, 1)
    grid = points.detach().reshape(1, 33, 1, 1, 3)
    with torch.autocast(device, dtype=dtype):
        out = customconv.trilinear_interpolation(feats, points)
        relative = F.grid_sample(grid_input, grid, align_corners=True).dtype
    assert out.dtype == relative
    if device == "cpu":
        assert out.dtype == torch.float32

    # The op on the arguments cast as autocast did, and the formula in float64.
    ran_in = out.dtype
    want = customconv.trilinear_interpolation(feats.detach().to(ran_in), points.detach().to(ran_in))
    torch.testing.assert_close(out.detach(), want, rtol=0, atol=0)
    ref = trilinear_torch(feats.detach().to(ran_in).double(), points.detach().to(ran_in).double())
    tol = TOLERANCE.get(ran_in, 1e-5)
    torch.testing.assert_close(out.detach().double(), ref, rtol=tol, atol=tol)

    g_feats, g_points = torch.autograd.grad(out, (feats, points), torch.ones_like(out))
    assert g_feats.dtype == feats.dtype and g_points.dtype == points.dtype
