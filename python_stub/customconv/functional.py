"""Functional forms of the ops, with the signatures of their torch.nn.functional
counterparts where one exists."""

from typing import List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

IntPair = Union[int, Tuple[int, int], List[int]]


def _pair(v: IntPair) -> List[int]:
    if isinstance(v, int):
        return [v, v]
    return [int(x) for x in v]


def same_padding(kernel_size: IntPair, dilation: IntPair) -> List[int]:
    """F.pad amounts (left, right, top, bottom) that keep H and W at stride 1."""
    kh, kw = _pair(kernel_size)
    dh, dw = _pair(dilation)
    total_h, total_w = dh * (kh - 1), dw * (kw - 1)
    return [total_w // 2, total_w - total_w // 2, total_h // 2, total_h - total_h // 2]


def _resolve_padding(input, weight, stride, padding, dilation):
    """Turns F.conv2d's string paddings into numbers (padding the input for "same")."""
    if not isinstance(padding, str):
        return input, padding
    if padding == "valid":
        return input, 0
    if padding == "same":
        if _pair(stride) != [1, 1]:
            raise ValueError("customconv: padding='same' needs stride 1, as in F.conv2d")
        return F.pad(input, same_padding(weight.shape[-2:], dilation)), 0
    raise ValueError(f"customconv: padding must be 'valid', 'same' or integers; got {padding!r}")


def conv2d(
    input: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    stride: IntPair = 1,
    padding: Union[IntPair, str] = 0,
    dilation: IntPair = 1,
    groups: int = 1,
) -> Tensor:
    """Same as F.conv2d (padding may be "valid" or "same", as there)."""
    input, padding = _resolve_padding(input, weight, stride, padding, dilation)
    return torch.ops.customconv.conv2d(
        input, weight, bias, _pair(stride), _pair(padding), _pair(dilation), groups
    )


def depthwise_conv2d(
    input: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    stride: IntPair = 1,
    padding: Union[IntPair, str] = 0,
    dilation: IntPair = 1,
) -> Tensor:
    """Same as F.conv2d(..., groups=C) with weight (C*m, 1, kh, kw), m >= 1."""
    input, padding = _resolve_padding(input, weight, stride, padding, dilation)
    return torch.ops.customconv.depthwise_conv2d(
        input, weight, bias, _pair(stride), _pair(padding), _pair(dilation)
    )


#: The activations conv2d_fused applies (as torch.nn's modules of those names
#: compute them; "gelu" is the exact, erf form: torch.nn.GELU()'s default).
ACTIVATIONS = ("identity", "relu", "relu6", "silu", "hardswish", "gelu", "sigmoid")


def conv2d_fused(
    input: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    stride: IntPair = 1,
    padding: Union[IntPair, str] = 0,
    dilation: IntPair = 1,
    groups: int = 1,
    activation: str = "identity",
    residual: Optional[Tensor] = None,
) -> Tensor:
    """activation(F.conv2d(input, weight, bias, stride, padding, dilation, groups) + residual)
    in one op (customconv::conv2d_fused). activation is one of ACTIVATIONS;
    residual, when given, has the convolution output's exact shape, dtype and
    device and is added before the activation (ResNet's order). padding may be
    "valid" or "same", as in F.conv2d."""
    input, padding = _resolve_padding(input, weight, stride, padding, dilation)
    return torch.ops.customconv.conv2d_fused(
        input, weight, bias, _pair(stride), _pair(padding), _pair(dilation), groups, activation,
        residual,
    )


def filter2d(input: Tensor, kernel: Tensor, border: str = "zeros") -> Tensor:
    """Correlates every (H, W) plane of input (..., H, W) with one odd-sized
    (kh, kw) kernel; border "zeros", "reflect", "replicate" or "circular" extends
    each plane as F.pad(plane, (kw//2, kw//2, kh//2, kh//2), mode) would."""
    return torch.ops.customconv.filter2d(input, kernel, border)


def trilinear_interpolation(feats: Tensor, points: Tensor) -> Tensor:
    """feats (N, 8, F), points (N, 3) in [-1, 1] -> (N, F): each point blends
    its cube's 8 corner features with trilinear weights (u, v, w = (points + 1) / 2,
    corner c = 4i + 2j + k). Points outside [-1, 1] extrapolate by the same
    formula. Differentiable in feats and points."""
    return torch.ops.customconv.trilinear_interpolation(feats, points)


def im2col(
    input: Tensor,
    kernel_size: IntPair,
    dilation: IntPair = 1,
    padding: IntPair = 0,
    stride: IntPair = 1,
) -> Tensor:
    """Same as F.unfold, with F.unfold's argument order (the op's order differs:
    kernel_size, stride, padding, dilation)."""
    return torch.ops.customconv.im2col(
        input, _pair(kernel_size), _pair(stride), _pair(padding), _pair(dilation)
    )


def col2im(
    input: Tensor,
    output_size: IntPair,
    kernel_size: IntPair,
    dilation: IntPair = 1,
    padding: IntPair = 0,
    stride: IntPair = 1,
) -> Tensor:
    """Same as F.fold, with F.fold's argument order (the op's order differs:
    output_size, kernel_size, stride, padding, dilation)."""
    return torch.ops.customconv.col2im(
        input, _pair(output_size), _pair(kernel_size), _pair(stride), _pair(padding),
        _pair(dilation)
    )
