"""torch.autograd.gradcheck of every op in float64 on small shapes;
gradgradcheck of im2col and col2im (each other's adjoint, so twice
differentiable); the gradients of conv2d, depthwise_conv2d, filter2d and
trilinear_interpolation refuse a second differentiation with a clear error."""

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

from testlib import (
    BORDERS,
    DEVICES,
    TrilinearConfig,
    make_points,
    make_tensor,
    ops,
    random_conv2d_config,
    random_depthwise_config,
    random_filter2d_config,
    random_window_config,
)

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


def small_conv_config(rng, fixed, make=random_conv2d_config):
    # gradcheck perturbs inputs in place: no overlapping (expanded) layouts.
    fixed.setdefault("input_layout", "contiguous")
    fixed.setdefault("weight_layout", "contiguous")
    for _ in range(200):
        cfg = make(rng, **fixed)
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


DEPTHWISE_CASES = {
    "multiplier3": dict(channels=2, multiplier=3, kernel=(3, 2), batch=2, bias=True),
    "strided_dilated_padded": dict(channels=2, multiplier=2, stride=(2, 1), dilation=(1, 2),
                                   padding=(1, 2), kernel=(3, 2), batch=2, size=(5, 6), bias=True),
    "large_kernel_small_input": dict(channels=1, multiplier=2, kernel=(7, 5), padding=(3, 2),
                                     dilation=(1, 1), stride=(1, 1), size=(4, 5), batch=2),
    "unbatched_no_bias": dict(batch=None, bias=False, kernel=(2, 3)),
    "channels_last": dict(batch=2, channels=3, multiplier=1, kernel=(3, 3),
                          input_layout="channels_last", weight_layout="channels_last"),
    "sliced_input": dict(batch=2, kernel=(2, 2), input_layout="sliced", weight_layout="offset"),
}


@pytest.mark.parametrize("case", sorted(DEPTHWISE_CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_depthwise_conv2d_passes_gradcheck(device, case, rng, gen, seed):
    cfg = small_conv_config(rng, dict(DEPTHWISE_CASES[case]), random_depthwise_config)
    x, w, b = conv_inputs(cfg, device, gen)
    stride, padding, dilation, _ = cfg.args()
    inputs = (x, w) if b is None else (x, w, b)

    def fn(*t):
        return ops.depthwise_conv2d(t[0], t[1], t[2] if len(t) > 2 else None, stride, padding,
                                    dilation)

    assert gradcheck(fn, inputs, eps=1e-6, atol=1e-8, rtol=1e-6), f"seed={seed} {cfg}"


FILTER_CASES = {
    **{border: dict(border=border, kernel=(3, 5), size=(4, 5), lead=(2,)) for border in BORDERS},
    "replicate_plane_smaller_than_kernel": dict(border="replicate", kernel=(5, 7), size=(2, 3),
                                                lead=(2,)),
    "circular_padding_equal_to_plane": dict(border="circular", kernel=(7, 5), size=(3, 2),
                                            lead=(2,)),
    "reflect_smallest_plane": dict(border="reflect", kernel=(5, 3), size=(3, 2), lead=(2,)),
    "zeros_no_leading_dims_transposed": dict(border="zeros", kernel=(3, 3), size=(5, 4), lead=(),
                                             input_layout="transposed"),
    "circular_several_leading_dims": dict(border="circular", kernel=(3, 1), size=(3, 4),
                                          lead=(2, 1, 2), input_layout="sliced"),
}


@pytest.mark.parametrize("case", sorted(FILTER_CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_filter2d_passes_gradcheck(device, case, rng, gen, seed):
    fixed = dict(FILTER_CASES[case])
    fixed.setdefault("input_layout", "contiguous")
    cfg = random_filter2d_config(rng, kernel_layout="contiguous", **fixed)
    x = make_tensor(cfg.input_shape, F64, device, cfg.input_layout, gen, True)
    k = make_tensor(cfg.kernel, F64, device, gen=gen, requires_grad=True)
    assert gradcheck(lambda a, b: ops.filter2d(a, b, cfg.border), (x, k)), f"seed={seed} {cfg}"


TRILINEAR_CASES = {
    "inside": TrilinearConfig(n=4, features=3, points="inside"),
    "outside": TrilinearConfig(n=4, features=3, points="outside"),
    "on_corners_edges_faces": TrilinearConfig(n=5, features=2, points="grid"),
    "one_feature_non_contiguous": TrilinearConfig(n=3, features=1, points="normal",
                                                  feats_layout="transposed",
                                                  points_layout="transposed"),
    "offset": TrilinearConfig(n=3, features=5, feats_layout="offset", points_layout="sliced"),
}


@pytest.mark.parametrize("case", sorted(TRILINEAR_CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_trilinear_interpolation_passes_gradcheck(device, case, gen, seed):
    cfg = TRILINEAR_CASES[case]
    feats = make_tensor(cfg.feats_shape, F64, device, cfg.feats_layout, gen, True)
    points = make_points(cfg, F64, device, gen, True)
    assert gradcheck(ops.trilinear_interpolation, (feats, points)), f"seed={seed} {cfg}"


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


# name -> (make(device, gen) -> (output, {wrt: tensor}), the op whose backward refuses)
def _depthwise(device, gen):
    x = make_tensor((2, 3, 5, 5), F64, device, gen=gen, requires_grad=True)
    w = make_tensor((6, 1, 3, 3), F64, device, gen=gen, requires_grad=True)
    b = make_tensor((6,), F64, device, gen=gen, requires_grad=True)
    return ops.depthwise_conv2d(x, w, b, [1, 1], [1, 1], [1, 1]), dict(input=x, weight=w, bias=b)


def _filter2d(device, gen):
    x = make_tensor((2, 5, 6), F64, device, gen=gen, requires_grad=True)
    k = make_tensor((3, 3), F64, device, gen=gen, requires_grad=True)
    return ops.filter2d(x, k, "reflect"), dict(input=x, kernel=k)


def _trilinear(device, gen):
    feats = make_tensor((4, 8, 3), F64, device, gen=gen, requires_grad=True)
    points = make_tensor((4, 3), F64, device, gen=gen, requires_grad=True)
    return ops.trilinear_interpolation(feats, points), dict(feats=feats, points=points)


DIRECT_OPS = {"depthwise_conv2d": _depthwise, "filter2d": _filter2d,
              "trilinear_interpolation": _trilinear}
DIRECT_WRT = [("depthwise_conv2d", "input"), ("depthwise_conv2d", "weight"),
              ("depthwise_conv2d", "bias"), ("filter2d", "input"), ("filter2d", "kernel"),
              ("trilinear_interpolation", "feats"), ("trilinear_interpolation", "points")]


@pytest.mark.parametrize("op,wrt", DIRECT_WRT)
@pytest.mark.parametrize("device", DEVICES)
def test_direct_ops_double_backward_is_refused_with_a_clear_error(device, op, wrt, gen):
    out, inputs = DIRECT_OPS[op](device, gen)
    g = make_tensor(out.shape, F64, device, gen=gen, requires_grad=True)
    (first,) = torch.autograd.grad(out, inputs[wrt], g, create_graph=True)
    assert first.requires_grad, "the first gradient must be differentiable-or-refusing, not detached"
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(first.sum(), list(inputs.values()) + [g], allow_unused=True)


@pytest.mark.parametrize("op", sorted(DIRECT_OPS))
@pytest.mark.parametrize("device", DEVICES)
def test_direct_ops_gradgradcheck_is_refused_with_a_clear_error(device, op, gen):
    _, inputs = DIRECT_OPS[op](device, gen)
    fn = {"depthwise_conv2d": lambda x, w, b: ops.depthwise_conv2d(x, w, b),
          "filter2d": lambda x, k: ops.filter2d(x, k),
          "trilinear_interpolation": ops.trilinear_interpolation}[op]
    with pytest.raises(RuntimeError, match="double backward"):
        gradgradcheck(fn, tuple(inputs.values()))


DIRECT_BACKWARD_OPS = {
    "depthwise_conv2d_grad_input": lambda t: ops.depthwise_conv2d_grad_input(
        t(2, 6, 3, 3), t(2, 3, 5, 5), t(6, 1, 3, 3), [1, 1], [0, 0], [1, 1]),
    "depthwise_conv2d_grad_weight": lambda t: ops.depthwise_conv2d_grad_weight(
        t(2, 6, 3, 3), t(2, 3, 5, 5), t(6, 1, 3, 3), [1, 1], [0, 0], [1, 1]),
    "depthwise_conv2d_grad_weight_bias": lambda t: ops.depthwise_conv2d_grad_weight_bias(
        t(2, 6, 3, 3), t(2, 3, 5, 5), t(6, 1, 3, 3), [1, 1], [0, 0], [1, 1]),
    "filter2d_grad_input": lambda t: ops.filter2d_grad_input(t(2, 5, 6), t(3, 3), "circular"),
    "filter2d_grad_kernel": lambda t: ops.filter2d_grad_kernel(t(2, 5, 6), t(2, 5, 6), t(3, 3),
                                                               "replicate"),
    "trilinear_interpolation_backward": lambda t: ops.trilinear_interpolation_backward(
        t(4, 3), t(4, 8, 3), t(4, 3)),
    "trilinear_interpolation_with_derivatives":
        lambda t: ops.trilinear_interpolation_with_derivatives(t(4, 8, 3), t(4, 3)),
    "trilinear_interpolation_backward_from_derivatives":
        lambda t: ops.trilinear_interpolation_backward_from_derivatives(
            t(4, 3), t(4, 3, 3), t(4, 3)),
    "trilinear_interpolation_grad_feats":
        lambda t: ops.trilinear_interpolation_grad_feats(t(4, 3), t(4, 3)),
}


@pytest.mark.parametrize("op", sorted(DIRECT_BACKWARD_OPS))
@pytest.mark.parametrize("device", DEVICES)
def test_direct_backward_ops_refuse_to_be_differentiated(device, op, gen):
    def t(*shape):
        return make_tensor(shape, F64, device, gen=gen, requires_grad=True)

    res = DIRECT_BACKWARD_OPS[op](t)
    res = res if isinstance(res, tuple) else (res,)
    for r in res:
        assert r.requires_grad
    with pytest.raises(RuntimeError, match=rf"{op}.*double backward"):
        sum(r.sum() for r in res).backward()


def _forward_calls(device, gen):
    """(name, args, call) of each convolution op on fresh float64 inputs."""
    x = make_tensor((2, 4, 6, 5), F64, device, gen=gen)
    w = make_tensor((6, 2, 3, 3), F64, device, gen=gen)
    wd = make_tensor((8, 1, 3, 3), F64, device, gen=gen)
    b6, b8 = make_tensor((6,), F64, device, gen=gen), make_tensor((8,), F64, device, gen=gen)
    k = make_tensor((3, 5), F64, device, gen=gen)
    one = [1, 1]
    return [
        ("conv2d", (x, w, b6), lambda a, c, d: ops.conv2d(a, c, d, one, one, one, 2)),
        ("conv2d_fused", (x, w, b6),
         lambda a, c, d: ops.conv2d_fused(a, c, d, one, one, one, 2, "relu", None)),
        ("depthwise_conv2d", (x, wd, b8), lambda a, c, d: ops.depthwise_conv2d(a, c, d, one, one, one)),
        ("filter2d", (x, k), lambda a, c: ops.filter2d(a, c, "zeros")),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_ops_record_a_graph_only_where_autograd_needs_one(device, gen):
    """Without a graph to record (no_grad, or no argument requiring grad) the
    ops run below autograd: same values, no grad_fn; with one, the same values
    and gradients that flow."""
    for name, args, call in _forward_calls(device, gen):
        plain = call(*args)
        assert plain.grad_fn is None and not plain.requires_grad, name
        leaves = [a.detach().clone().requires_grad_() for a in args]
        with torch.no_grad():
            quiet = call(*leaves)
        assert quiet.grad_fn is None and not quiet.requires_grad, name
        recorded = call(*leaves)
        assert recorded.grad_fn is not None, name
        torch.testing.assert_close(quiet, plain, rtol=0, atol=0)
        torch.testing.assert_close(recorded.detach(), plain, rtol=0, atol=0)
        recorded.sum().backward()
        assert all(leaf.grad is not None for leaf in leaves), name
        # One argument requiring grad is enough, and only it gets a gradient.
        some = [a.detach() for a in args]
        some[1] = some[1].clone().requires_grad_()
        partial = call(*some)
        assert partial.grad_fn is not None, name
        partial.sum().backward()
        assert some[1].grad is not None and some[0].grad is None, name
