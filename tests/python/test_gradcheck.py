"""torch.autograd.gradcheck of every op in float64 on small shapes;
gradgradcheck of im2col and col2im (each other's adjoint, so twice
differentiable); conv2d's gradients refuse a second differentiation with a
clear error."""

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

from testlib import DEVICES, make_tensor, ops, random_conv2d_config, random_window_config

F64 = torch.float64

CONV_CASES = {
    "plain": dict(kind="plain", batch=2, bias=True),
    "grouped_strided_dilated": dict(groups=2, in_channels=4, out_channels=6, stride=(2, 1),
                                    dilation=(1, 2), padding=(1, 2), kernel=(3, 2), batch=2,
                                    size=(5, 6), bias=True),
    "depthwise_multiplier": dict(groups=3, in_channels=3, out_channels=6, kernel=(2, 3), batch=1),
    "unbatched_no_bias": dict(batch=None, bias=False),
    "channels_last": dict(batch=2, input_layout="channels_last", weight_layout="channels_last"),
    "sliced_input": dict(batch=2, input_layout="sliced", weight_layout="transposed"),
}


def small(cfg):
    return cfg.in_channels * cfg.size[0] * cfg.size[1] <= 120


def small_conv_config(rng, fixed):
    # gradcheck perturbs inputs in place: no overlapping (expanded) layouts.
    fixed.setdefault("input_layout", "contiguous")
    fixed.setdefault("weight_layout", "contiguous")
    for _ in range(200):
        cfg = random_conv2d_config(rng, **fixed)
        if small(cfg) and cfg.out_channels <= 6:
            return cfg
    raise AssertionError(f"no small config for {fixed}")


def conv_inputs(cfg, device, gen):
    x = make_tensor(cfg.input_shape, F64, device, cfg.input_layout, gen, True)
    w = make_tensor(cfg.weight_shape, F64, device, cfg.weight_layout, gen, True)
    b = make_tensor((cfg.out_channels,), F64, device, gen=gen, requires_grad=True) if cfg.bias else None
    return x, w, b


@pytest.mark.parametrize("case", sorted(CONV_CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_conv2d_passes_gradcheck(device, case, rng, gen, seed):
    cfg = small_conv_config(rng, dict(CONV_CASES[case]))
    x, w, b = conv_inputs(cfg, device, gen)
    stride, padding, dilation, groups = cfg.args()
    inputs = (x, w) if b is None else (x, w, b)

    def fn(*t):
        return ops.conv2d(t[0], t[1], t[2] if len(t) > 2 else None, stride, padding, dilation, groups)

    assert gradcheck(fn, inputs, eps=1e-6, atol=1e-8, rtol=1e-6), f"seed={seed} {cfg}"


WINDOW_CASES = {
    "plain": dict(kernel=(2, 2), stride=(1, 1), padding=(0, 0), dilation=(1, 1), batch=2),
    "strided_padded_dilated": dict(kernel=(3, 2), stride=(2, 1), padding=(1, 2), dilation=(1, 2),
                                   batch=2, size=(5, 4)),
    "overlapping_unbatched": dict(kernel=(2, 3), stride=(1, 2), padding=(1, 0), batch=None,
                                  size=(4, 5), dilation=(1, 1)),
    "non_contiguous": dict(batch=2, layout="transposed", size=(4, 5), kernel=(2, 2)),
}


def window_config(rng, case):
    fixed = dict(WINDOW_CASES[case])
    fixed.setdefault("channels", 2)
    fixed.setdefault("layout", "contiguous")
    return random_window_config(rng, **fixed)


def im2col_fn(cfg):
    return lambda x: ops.im2col(x, list(cfg.kernel), list(cfg.stride), list(cfg.padding),
                                list(cfg.dilation))


def col2im_fn(cfg):
    return lambda c: ops.col2im(c, list(cfg.size), list(cfg.kernel), list(cfg.stride),
                                list(cfg.padding), list(cfg.dilation))


@pytest.mark.parametrize("case", sorted(WINDOW_CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_im2col_passes_gradcheck_and_gradgradcheck(device, case, rng, gen, seed):
    cfg = window_config(rng, case)
    x = make_tensor(cfg.image_shape, F64, device, cfg.layout, gen, True)
    assert gradcheck(im2col_fn(cfg), (x,)), f"seed={seed} {cfg}"
    assert gradgradcheck(im2col_fn(cfg), (x,)), f"seed={seed} {cfg}"


@pytest.mark.parametrize("case", sorted(WINDOW_CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_col2im_passes_gradcheck_and_gradgradcheck(device, case, rng, gen, seed):
    cfg = window_config(rng, case)
    c = make_tensor(cfg.columns_shape, F64, device, cfg.layout, gen, True)
    assert gradcheck(col2im_fn(cfg), (c,)), f"seed={seed} {cfg}"
    assert gradgradcheck(col2im_fn(cfg), (c,)), f"seed={seed} {cfg}"


@pytest.mark.parametrize("device", DEVICES)
def test_im2col_gradient_is_col2im_and_back(device, gen):
    # The backward of im2col is col2im and vice versa: the graph of a gradient
    # computed with create_graph=True goes through the other op.
    x = make_tensor((2, 3, 5, 6), F64, device, gen=gen, requires_grad=True)
    cols = ops.im2col(x, [2, 3], [1, 2], [1, 0], [1, 1])
    g = make_tensor(cols.shape, F64, device, gen=gen, requires_grad=True)
    (gx,) = torch.autograd.grad(cols, x, g, create_graph=True)
    expected = ops.col2im(g.detach(), [5, 6], [2, 3], [1, 2], [1, 0], [1, 1])
    torch.testing.assert_close(gx.detach(), expected, rtol=0, atol=0)
    # d<gx, v>/dg = im2col(v)
    v = make_tensor(gx.shape, F64, device, gen=gen)
    (gg,) = torch.autograd.grad(gx, g, v)
    torch.testing.assert_close(gg, ops.im2col(v, [2, 3], [1, 2], [1, 0], [1, 1]), rtol=0, atol=0)


@pytest.mark.parametrize("wrt", ["input", "weight", "bias"])
@pytest.mark.parametrize("device", DEVICES)
def test_conv2d_double_backward_is_refused_with_a_clear_error(device, wrt, gen):
    x = make_tensor((2, 4, 5, 5), F64, device, gen=gen, requires_grad=True)
    w = make_tensor((6, 2, 3, 3), F64, device, gen=gen, requires_grad=True)
    b = make_tensor((6,), F64, device, gen=gen, requires_grad=True)
    out = ops.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 2)
    g = make_tensor(out.shape, F64, device, gen=gen, requires_grad=True)
    target = {"input": x, "weight": w, "bias": b}[wrt]
    (first,) = torch.autograd.grad(out, target, g, create_graph=True)
    assert first.requires_grad, "the first gradient must be differentiable-or-refusing, not detached"
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(first.sum(), [x, w, g], allow_unused=True)


@pytest.mark.parametrize("device", DEVICES)
def test_conv2d_gradgradcheck_is_refused_with_a_clear_error(device, gen):
    x = make_tensor((1, 2, 4, 4), F64, device, gen=gen, requires_grad=True)
    w = make_tensor((2, 2, 2, 2), F64, device, gen=gen, requires_grad=True)
    with pytest.raises(RuntimeError, match="double backward"):
        gradgradcheck(lambda a, k: ops.conv2d(a, k), (x, w))


@pytest.mark.parametrize("op", ["conv2d_grad_input", "conv2d_grad_weight", "conv2d_grad_bias"])
@pytest.mark.parametrize("device", DEVICES)
def test_backward_ops_refuse_to_be_differentiated(device, op, gen):
    x = make_tensor((2, 4, 5, 5), F64, device, gen=gen, requires_grad=True)
    w = make_tensor((6, 4, 3, 3), F64, device, gen=gen, requires_grad=True)
    go = make_tensor((2, 6, 3, 3), F64, device, gen=gen, requires_grad=True)
    if op == "conv2d_grad_bias":
        res = ops.conv2d_grad_bias(go)
    else:
        res = getattr(ops, op)(go, x, w, [1, 1], [0, 0], [1, 1], 1)
    assert res.requires_grad
    with pytest.raises(RuntimeError, match=rf"{op}.*double backward"):
        res.sum().backward()
