"""torch.library.opcheck for every op of the library, the backward ops
included: schema, autograd registration, fake (meta) kernels against the real
ones, and AOT dispatch with dynamic shapes; on CPU and CUDA, with and without
requires_grad, with omitted defaulted arguments and single-int pairs."""

import pytest
import torch

import customconv
from testlib import DEVICES, make_tensor, ops

ALL_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor",
             "test_aot_dispatch_dynamic")
# The backward ops are differentiable once only (differentiating them is a
# clear error, see test_gradcheck.py), so AOT dispatch with inputs that require
# grad, which differentiates them, does not apply to them.
ONCE_DIFFERENTIABLE_TESTS = ALL_TESTS[:3]

F64, F32 = torch.float64, torch.float32


def low_precision(device):
    return torch.bfloat16 if device == "cpu" else torch.float16


# name -> (op, builder(device, dtype, requires_grad, t) -> (args, kwargs)), where
# t(shape, layout="contiguous") makes a tensor.
SAMPLES = {
    "conv2d-grouped-strided": ("conv2d", lambda t: (
        (t((2, 4, 7, 6)), t((6, 2, 3, 2)), t((6,)), [2, 1], [1, 2], [1, 2], 2), {})),
    "conv2d-defaults": ("conv2d", lambda t: ((t((2, 3, 5, 5)), t((4, 3, 2, 2))), {})),
    "conv2d-kwargs-single-ints": ("conv2d", lambda t: (
        (t((2, 2, 6, 5)), t((4, 1, 3, 3))), dict(bias=t((4,)), stride=[2], padding=[1], groups=2))),
    "conv2d-unbatched": ("conv2d", lambda t: ((t((3, 6, 5)), t((2, 3, 2, 3)), t((2,))), {})),
    "conv2d-channels_last": ("conv2d", lambda t: (
        (t((2, 4, 5, 6), "channels_last"), t((4, 1, 3, 3)), None, [1, 1], [1, 1], [1, 1], 4), {})),
    "conv2d-batch0": ("conv2d", lambda t: ((t((0, 2, 5, 5)), t((3, 2, 2, 2)), t((3,))), {})),
    "conv2d_fused-residual-silu": ("conv2d_fused", lambda t: (
        (t((2, 4, 7, 6)), t((6, 2, 3, 2)), t((6,)), [2, 1], [1, 2], [1, 2], 2, "silu",
         t((2, 6, 4, 8))), {})),
    "conv2d_fused-defaults": ("conv2d_fused", lambda t: ((t((2, 3, 5, 5)), t((4, 3, 2, 2))), {})),
    "conv2d_fused-channels_last-relu6": ("conv2d_fused", lambda t: (
        (t((2, 4, 5, 6), "channels_last"), t((4, 1, 3, 3))),
        dict(padding=[1, 1], groups=4, activation="relu6"))),
    "conv2d_fused-unbatched-gelu": ("conv2d_fused", lambda t: (
        (t((3, 6, 5)), t((2, 3, 2, 3)), t((2,))), dict(activation="gelu", residual=t((2, 5, 3))))),
    "im2col": ("im2col", lambda t: ((t((2, 3, 7, 6)), [3, 2], [2, 1], [1, 0], [1, 2]), {})),
    "im2col-defaults": ("im2col", lambda t: ((t((2, 3, 5, 5)), [2]), {})),
    "im2col-unbatched-transposed": ("im2col", lambda t: (
        (t((3, 6, 5), "transposed"), [2, 3]), dict(padding=[1, 1]))),
    "col2im": ("col2im", lambda t: ((t((2, 18, 16)), [7, 6], [3, 2], [2, 1], [1, 0], [1, 2]), {})),
    "col2im-defaults": ("col2im", lambda t: ((t((2, 12, 16)), [5, 5], [2]), {})),
    "col2im-unbatched-sliced": ("col2im", lambda t: (
        (t((6, 24), "sliced"), [4, 5], [1, 2]), dict(dilation=[2, 1], padding=[1, 0]))),
    "conv2d_grad_input": ("conv2d_grad_input", lambda t: (
        (t((2, 6, 4, 8)), t((2, 4, 7, 6)), t((6, 2, 3, 2)), [2, 1], [1, 2], [1, 2], 2), {})),
    "conv2d_grad_input-unbatched": ("conv2d_grad_input", lambda t: (
        (t((2, 4, 3)), t((3, 6, 5)), t((2, 3, 3, 3)), [1, 1], [0, 0], [1, 1], 1), {})),
    "conv2d_grad_weight": ("conv2d_grad_weight", lambda t: (
        (t((2, 6, 4, 8)), t((2, 4, 7, 6)), t((6, 2, 3, 2)), [2, 1], [1, 2], [1, 2], 2), {})),
    "conv2d_grad_weight-unbatched": ("conv2d_grad_weight", lambda t: (
        (t((2, 4, 3)), t((3, 6, 5)), t((2, 3, 3, 3)), [1], [0], [1], 1), {})),
    "conv2d_grad_bias": ("conv2d_grad_bias", lambda t: ((t((2, 6, 4, 5)),), {})),
    "conv2d_grad_bias-unbatched": ("conv2d_grad_bias", lambda t: ((t((6, 4, 5), "transposed"),), {})),
    # ---------------------------------------------------------------- depthwise_conv2d
    "depthwise_conv2d-strided-dilated": ("depthwise_conv2d", lambda t: (
        (t((2, 3, 7, 6)), t((6, 1, 3, 2)), t((6,)), [2, 1], [1, 2], [1, 2]), {})),
    "depthwise_conv2d-defaults": ("depthwise_conv2d", lambda t: ((t((2, 3, 5, 5)), t((3, 1, 2, 2))), {})),
    "depthwise_conv2d-kwargs-single-ints": ("depthwise_conv2d", lambda t: (
        (t((2, 2, 6, 5)), t((8, 1, 3, 3))), dict(bias=t((8,)), stride=[2], padding=[1]))),
    "depthwise_conv2d-unbatched-large-kernel": ("depthwise_conv2d", lambda t: (
        (t((2, 9, 8)), t((4, 1, 7, 5)), t((4,))), dict(padding=[3, 2]))),
    "depthwise_conv2d-channels_last": ("depthwise_conv2d", lambda t: (
        (t((2, 4, 5, 6), "channels_last"), t((4, 1, 3, 3)), None, [1, 1], [1, 1], [1, 1]), {})),
    "depthwise_conv2d-batch0": ("depthwise_conv2d", lambda t: (
        (t((0, 2, 5, 5)), t((4, 1, 2, 2)), t((4,))), {})),
    "depthwise_conv2d_grad_input": ("depthwise_conv2d_grad_input", lambda t: (
        (t((2, 6, 4, 8)), t((2, 3, 7, 6)), t((6, 1, 3, 2)), [2, 1], [1, 2], [1, 2]), {})),
    "depthwise_conv2d_grad_input-unbatched": ("depthwise_conv2d_grad_input", lambda t: (
        (t((4, 3, 3)), t((2, 5, 5)), t((4, 1, 3, 3)), [1], [0], [1]), {})),
    "depthwise_conv2d_grad_weight": ("depthwise_conv2d_grad_weight", lambda t: (
        (t((2, 6, 4, 8)), t((2, 3, 7, 6), "channels_last"), t((6, 1, 3, 2)), [2, 1], [1, 2],
         [1, 2]), {})),
    "depthwise_conv2d_grad_weight-batch0": ("depthwise_conv2d_grad_weight", lambda t: (
        (t((0, 4, 3, 3)), t((0, 2, 5, 5)), t((4, 1, 3, 3)), [1, 1], [0, 0], [1, 1]), {})),
    "depthwise_conv2d_grad_weight_bias": ("depthwise_conv2d_grad_weight_bias", lambda t: (
        (t((2, 6, 4, 8)), t((2, 3, 7, 6), "channels_last"), t((6, 1, 3, 2)), [2, 1], [1, 2],
         [1, 2]), {})),
    "depthwise_conv2d_grad_weight_bias-same-3x3": ("depthwise_conv2d_grad_weight_bias", lambda t: (
        (t((2, 4, 8, 8)), t((2, 4, 8, 8)), t((4, 1, 3, 3)), [1, 1], [1, 1], [1, 1]), {})),
    "depthwise_conv2d_grad_weight_bias-unbatched": ("depthwise_conv2d_grad_weight_bias", lambda t: (
        (t((4, 3, 3)), t((2, 5, 5)), t((4, 1, 3, 3)), [1], [0], [1]), {})),
    "depthwise_conv2d_grad_weight_bias-batch0": ("depthwise_conv2d_grad_weight_bias", lambda t: (
        (t((0, 4, 3, 3)), t((0, 2, 5, 5)), t((4, 1, 3, 3)), [1, 1], [0, 0], [1, 1]), {})),
    # ---------------------------------------------------------------- filter2d
    "filter2d-zeros-3d": ("filter2d", lambda t: ((t((2, 5, 6)), t((3, 5)), "zeros"), {})),
    "filter2d-defaults-2d": ("filter2d", lambda t: ((t((6, 7)), t((3, 3))), {})),
    "filter2d-reflect-4d-channels_last": ("filter2d", lambda t: (
        (t((2, 3, 5, 6), "channels_last"), t((5, 3))), dict(border="reflect"))),
    "filter2d-replicate-plane-smaller-than-kernel": ("filter2d", lambda t: (
        (t((2, 2, 3)), t((7, 5)), "replicate"), {})),
    "filter2d-circular-transposed": ("filter2d", lambda t: (
        (t((3, 6, 5), "transposed"), t((3, 3)), "circular"), {})),
    "filter2d-zero-sized-leading-dim": ("filter2d", lambda t: (
        (t((0, 3, 4, 5)), t((3, 3)), "reflect"), {})),
    "filter2d_grad_input": ("filter2d_grad_input", lambda t: (
        (t((2, 5, 6)), t((3, 5)), "reflect"), {})),
    "filter2d_grad_input-circular-2d": ("filter2d_grad_input", lambda t: (
        (t((5, 6), "transposed"), t((5, 3)), "circular"), {})),
    "filter2d_grad_kernel": ("filter2d_grad_kernel", lambda t: (
        (t((2, 5, 6)), t((2, 5, 6)), t((3, 5)), "replicate"), {})),
    "filter2d_grad_kernel-zeros-4d": ("filter2d_grad_kernel", lambda t: (
        (t((2, 2, 4, 5)), t((2, 2, 4, 5), "sliced"), t((3, 3)), "zeros"), {})),
    # ---------------------------------------------------------------- trilinear_interpolation
    "trilinear_interpolation": ("trilinear_interpolation", lambda t: (
        (t((5, 8, 7)), t((5, 3))), {})),
    "trilinear_interpolation-non-contiguous": ("trilinear_interpolation", lambda t: (
        (t((6, 8, 5), "transposed"), t((6, 3), "sliced")), {})),
    "trilinear_interpolation-n0": ("trilinear_interpolation", lambda t: (
        (t((0, 8, 4)), t((0, 3))), {})),
    "trilinear_interpolation_backward": ("trilinear_interpolation_backward", lambda t: (
        (t((5, 7)), t((5, 8, 7)), t((5, 3))), {})),
    "trilinear_interpolation_backward-non-contiguous": ("trilinear_interpolation_backward",
                                                        lambda t: ((t((6, 5), "transposed"),
                                                                    t((6, 8, 5), "offset"),
                                                                    t((6, 3), "transposed")), {})),
    "trilinear_interpolation_with_derivatives": ("trilinear_interpolation_with_derivatives",
                                                 lambda t: ((t((5, 8, 7)), t((5, 3))), {})),
    "trilinear_interpolation_with_derivatives-non-contiguous": (
        "trilinear_interpolation_with_derivatives",
        lambda t: ((t((6, 8, 5), "transposed"), t((6, 3), "sliced")), {})),
    "trilinear_interpolation_backward_from_derivatives": (
        "trilinear_interpolation_backward_from_derivatives",
        lambda t: ((t((5, 7)), t((5, 3, 7)), t((5, 3))), {})),
    "trilinear_interpolation_backward_from_derivatives-non-contiguous": (
        "trilinear_interpolation_backward_from_derivatives",
        lambda t: ((t((6, 5), "transposed"), t((6, 3, 5), "offset"), t((6, 3), "transposed")),
                   {})),
    "trilinear_interpolation_grad_feats": ("trilinear_interpolation_grad_feats",
                                           lambda t: ((t((5, 7)), t((5, 3))), {})),
    "trilinear_interpolation_grad_feats-non-contiguous": (
        "trilinear_interpolation_grad_feats",
        lambda t: ((t((6, 5), "transposed"), t((6, 3), "sliced")), {})),
}

BACKWARD_OPS = {"conv2d_grad_input", "conv2d_grad_weight", "conv2d_grad_bias",
                "depthwise_conv2d_grad_input", "depthwise_conv2d_grad_weight",
                "depthwise_conv2d_grad_weight_bias", "filter2d_grad_input", "filter2d_grad_kernel", "trilinear_interpolation_backward",
                "trilinear_interpolation_with_derivatives",
                "trilinear_interpolation_backward_from_derivatives",
                "trilinear_interpolation_grad_feats"}


def test_every_op_has_an_opcheck_sample():
    names = {op for op, _ in SAMPLES.values()}
    expected = {"conv2d", "conv2d_fused", "im2col", "col2im", "depthwise_conv2d", "filter2d",
                "trilinear_interpolation"} | BACKWARD_OPS
    assert expected == set(customconv.OPS)
    assert expected <= names
    for op in expected:
        assert hasattr(ops, op), f"torch.ops.customconv.{op} is not registered"


def build(sample, device, dtype, requires_grad, gen):
    op, builder = SAMPLES[sample]

    def t(shape, layout="contiguous"):
        return make_tensor(shape, dtype, device, layout, gen, requires_grad)

    args, kwargs = builder(t)
    return getattr(ops, op), op, args, kwargs


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "requires_grad"])
@pytest.mark.parametrize("sample", sorted(SAMPLES))
@pytest.mark.parametrize("device", DEVICES)
def test_every_op_passes_opcheck(device, sample, requires_grad, gen):
    op, name, args, kwargs = build(sample, device, F64, requires_grad, gen)
    tests = ONCE_DIFFERENTIABLE_TESTS if requires_grad and name in BACKWARD_OPS else ALL_TESTS
    result = torch.library.opcheck(op, args, kwargs, test_utils=tests)
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.parametrize("sample", ["conv2d-grouped-strided", "conv2d_fused-residual-silu",
                                    "im2col", "col2im",
                                    "conv2d_grad_input", "conv2d_grad_weight", "conv2d_grad_bias",
                                    "depthwise_conv2d-strided-dilated",
                                    "depthwise_conv2d_grad_input", "depthwise_conv2d_grad_weight",
                                    "depthwise_conv2d_grad_weight_bias-same-3x3",
                                    "filter2d-reflect-4d-channels_last", "filter2d_grad_input",
                                    "filter2d_grad_kernel", "trilinear_interpolation",
                                    "trilinear_interpolation_backward",
                                    "trilinear_interpolation_grad_feats"])
@pytest.mark.parametrize("device", DEVICES)
def test_every_op_passes_opcheck_in_float32_and_half_precision(device, sample, gen):
    for dtype in (F32, low_precision(device)):
        op, _, args, kwargs = build(sample, device, dtype, False, gen)
        result = torch.library.opcheck(op, args, kwargs, test_utils=ALL_TESTS)
        assert all(v == "SUCCESS" for v in result.values()), (dtype, result)
