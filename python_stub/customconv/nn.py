"""Modules built on the customconv ops, drop-in replacements for torch.nn ones."""

import math
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .functional import ACTIVATIONS, same_padding

__all__ = ["Conv2d", "DepthwiseConv2d", "FusedConv2d", "Filter2d", "TrilinearInterpolation"]


class Conv2d(torch.nn.Conv2d):
    """A drop-in for torch.nn.Conv2d whose convolution runs customconv::conv2d.

    Same constructor arguments (padding "same"/"valid", every padding_mode),
    same parameters and buffers, so a torch.nn.Conv2d's state_dict loads as is.
    """

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        if self.padding_mode == "zeros" and not isinstance(self.padding, str):
            # The common case, with no Python work beyond the call.
            return torch.ops.customconv.conv2d(
                input, weight, bias, self.stride, self.padding, self.dilation, self.groups)
        input, padding = self._apply_padding(input)
        return torch.ops.customconv.conv2d(
            input, weight, bias, [self.stride[0], self.stride[1]], padding,
            [self.dilation[0], self.dilation[1]], self.groups,
        )

    def _apply_padding(self, input: Tensor) -> Tuple[Tensor, List[int]]:
        """The input padded as torch.nn.Conv2d would, and the padding left to the op."""
        if isinstance(self.padding, str):
            # "valid" pads nothing; "same" pads (possibly asymmetrically) by the
            # amounts torch.nn.Conv2d computed at construction.
            if self.padding == "same":
                mode = "constant" if self.padding_mode == "zeros" else self.padding_mode
                input = F.pad(input, self._reversed_padding_repeated_twice, mode=mode)
            padding = [0, 0]
        elif self.padding_mode != "zeros":
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            padding = [0, 0]
        else:
            padding = [self.padding[0], self.padding[1]]
        return input, padding


class DepthwiseConv2d(Conv2d):
    """A drop-in for torch.nn.Conv2d with groups=in_channels, running
    customconv::depthwise_conv2d: same arguments (groups may be left out),
    parameter names and state_dict. out_channels is a multiple of in_channels.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups: Optional[int] = None,
        bias: bool = True,
        padding_mode: str = "zeros",
        device=None,
        dtype=None,
    ) -> None:
        if groups is not None and groups != in_channels:
            raise ValueError(
                f"DepthwiseConv2d: groups must equal in_channels ({in_channels}); got {groups}"
            )
        if out_channels % in_channels != 0:
            raise ValueError(
                f"DepthwiseConv2d: out_channels ({out_channels}) must be a multiple of "
                f"in_channels ({in_channels})"
            )
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         in_channels, bias, padding_mode, device, dtype)

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        if self.padding_mode == "zeros" and not isinstance(self.padding, str):
            return torch.ops.customconv.depthwise_conv2d(
                input, weight, bias, self.stride, self.padding, self.dilation)
        input, padding = self._apply_padding(input)
        return torch.ops.customconv.depthwise_conv2d(
            input, weight, bias, [self.stride[0], self.stride[1]], padding,
            [self.dilation[0], self.dilation[1]],
        )


def _activate(x: Tensor, activation: str) -> Tensor:
    """x through the named activation (one of functional.ACTIVATIONS)."""
    if activation == "relu":
        return torch.relu(x)
    if activation == "relu6":
        return F.hardtanh(x, 0.0, 6.0)
    if activation == "silu":
        return F.silu(x)
    if activation == "hardswish":
        # The formula, as the op computes it (F.hardswish on CUDA scales by 1/6
        # rounded to float32 also in float64).
        return x * (x + 3.0).clamp(0.0, 6.0) / 6.0
    if activation == "gelu":
        return F.gelu(x)
    if activation == "sigmoid":
        return torch.sigmoid(x)
    return x


def _int_pair(v) -> Tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    a, b = v
    return (int(a), int(b))


class FusedConv2d(torch.nn.Module):
    """activation(conv2d(input) + residual) as one customconv::conv2d_fused call:
    a convolution with its bias, an optional residual of the output's shape added
    before the activation (ResNet's order), and one of the activations of
    customconv.functional.ACTIVATIONS ("identity", "relu", "relu6", "silu",
    "hardswish", "gelu" (exact), "sigmoid").

    The constructor takes torch.nn.Conv2d's arguments (padding "same"/"valid"
    and every padding_mode included; the input is padded first where the op's
    zero padding does not say it) plus `activation`. forward(input, residual=None).
    FusedConv2d.from_conv(conv, bn, activation) folds an eval-mode BatchNorm2d
    into a convolution; customconv.fuse(model) does it for a whole model. A
    residual that does not have the output's shape, dtype and device (a
    broadcast add) is added after the convolution instead, with the same result.
    """

    # Fixed per module: TorchScript keeps only the branches they select.
    __constants__ = ["activation", "_pads_input"]

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        activation: str = "identity",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"FusedConv2d: activation must be one of {', '.join(ACTIVATIONS)}; got {activation!r}")
        if padding_mode not in ("zeros", "reflect", "replicate", "circular"):
            raise ValueError(
                "FusedConv2d: padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular'; "
                f"got {padding_mode!r}")
        if groups <= 0 or in_channels % groups or out_channels % groups:
            raise ValueError(
                f"FusedConv2d: in_channels ({in_channels}) and out_channels ({out_channels}) must "
                f"be multiples of groups ({groups})")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _int_pair(kernel_size)
        self.stride = list(_int_pair(stride))
        self.dilation = list(_int_pair(dilation))
        self.groups = groups
        self.padding_mode = padding_mode
        self.activation = activation
        # The padding as given (for repr), the op's zero padding, and what F.pad
        # adds first (left, right, top, bottom) with which mode.
        input_padding = [0, 0, 0, 0]
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(
                    f"FusedConv2d: padding must be 'valid', 'same' or integers; got {padding!r}")
            if padding == "same":
                if self.stride != [1, 1]:
                    raise ValueError(
                        "FusedConv2d: padding='same' needs stride 1, as in torch.nn.Conv2d")
                input_padding = same_padding(self.kernel_size, self.dilation)
            self.padding = padding
        else:
            ph, pw = _int_pair(padding)
            input_padding = [pw, pw, ph, ph]
            self.padding = (ph, pw)
        left, right, top, bottom = input_padding
        if padding_mode == "zeros" and left == right and top == bottom:
            self._op_padding = [top, left]
            input_padding = [0, 0, 0, 0]
        else:
            self._op_padding = [0, 0]
        self._input_padding = input_padding
        self._input_padding_mode = "constant" if padding_mode == "zeros" else padding_mode
        self._pads_input = any(p != 0 for p in input_padding)

        factory = {"device": device, "dtype": dtype}
        kh, kw = self.kernel_size
        self.weight = torch.nn.Parameter(
            torch.empty((out_channels, in_channels // groups, kh, kw), **factory))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_channels, **factory))
        else:
            self.register_parameter("bias", None)
        if self.weight.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch.nn.Conv2d's initialization."""
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.weight.shape[1] * self.weight.shape[2] * self.weight.shape[3]
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor, residual: Optional[Tensor] = None) -> Tensor:
        if self._pads_input:
            input = F.pad(input, self._input_padding, mode=self._input_padding_mode)
        if residual is not None and not self._fits_output(input, residual):
            out = torch.ops.customconv.conv2d_fused(
                input, self.weight, self.bias, self.stride, self._op_padding, self.dilation,
                self.groups, "identity", None)
            return _activate(out + residual, self.activation)
        return torch.ops.customconv.conv2d_fused(
            input, self.weight, self.bias, self.stride, self._op_padding, self.dilation,
            self.groups, self.activation, residual)

    def _fits_output(self, input: Tensor, residual: Tensor) -> bool:
        """Whether residual has the shape, dtype and device of the convolution's
        output for this (already padded) input."""
        n = input.dim()
        if residual.dim() != n or n < 3 or residual.dtype != input.dtype:
            return False
        if residual.device != input.device:
            return False
        for d in range(n - 3):
            if residual.size(d) != input.size(d):
                return False
        if residual.size(n - 3) != self.out_channels:
            return False
        kh, kw = self.kernel_size
        return (residual.size(n - 2) == self._output_length(input.size(n - 2), kh, 0)
                and residual.size(n - 1) == self._output_length(input.size(n - 1), kw, 1))

    def _output_length(self, size: int, kernel: int, axis: int) -> int:
        extent = self.dilation[axis] * (kernel - 1) + 1
        return (size + 2 * self._op_padding[axis] - extent) // self.stride[axis] + 1

    @classmethod
    def from_conv(cls, conv: torch.nn.Conv2d, bn: Optional[torch.nn.Module] = None,
                  activation: str = "identity") -> "FusedConv2d":
        """A FusedConv2d computing activation(bn(conv(x)) + residual).

        conv is a torch.nn.Conv2d (exactly that type) or customconv.nn.Conv2d /
        DepthwiseConv2d, any padding and padding_mode. bn, when given, is an
        eval-mode BatchNorm2d with running statistics, folded into the weight and
        bias (computed in float64, then rounded to the convolution's dtype: the
        weight keeps its dtype, device and memory format, so a channels_last
        weight stays channels_last). Without bn, the new module shares the
        convolution's Parameter objects."""
        if type(conv) not in (torch.nn.Conv2d, Conv2d, DepthwiseConv2d):
            raise TypeError(
                "FusedConv2d.from_conv: conv must be a torch.nn.Conv2d (exactly that type) or a "
                f"customconv.nn.Conv2d / DepthwiseConv2d; got {type(conv).__name__}")
        if isinstance(conv.weight, torch.nn.parameter.UninitializedParameter):
            raise ValueError(
                "FusedConv2d.from_conv: the convolution's weight is not initialized yet (a lazy "
                "module): run the model once first")
        weight, bias = conv.weight, conv.bias
        if bn is not None:
            weight, bias = fold_batch_norm(conv, bn)
        fused = cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                    padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
                    bias=bias is not None, padding_mode=conv.padding_mode, activation=activation,
                    device="meta")
        fused.weight = weight
        fused.bias = bias
        fused.train(conv.training)
        return fused

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"
        s += f", stride={tuple(self.stride)}"
        if self.padding != (0, 0):
            s += f", padding={self.padding!r}"
        if self.dilation != [1, 1]:
            s += f", dilation={tuple(self.dilation)}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode!r}"
        return s + f", activation={self.activation!r}"


def fold_batch_norm(conv: torch.nn.Conv2d,
                    bn: torch.nn.Module) -> Tuple[torch.nn.Parameter, torch.nn.Parameter]:
    """The weight and bias of conv followed by the eval-mode BatchNorm2d bn, as new
    Parameters: w * g / sqrt(var + eps) and (b - mean) * g / sqrt(var + eps) + beta,
    computed in float64 and rounded to conv's weight dtype, with the weight's
    device and memory format."""
    if not isinstance(bn, (torch.nn.BatchNorm2d, torch.nn.SyncBatchNorm)):
        raise TypeError(f"fold_batch_norm: bn must be a BatchNorm2d; got {type(bn).__name__}")
    if bn.training:
        raise ValueError(
            "fold_batch_norm: the BatchNorm2d is in training mode (it would normalize with each "
            "batch's statistics); call .eval() first")
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError(
            "fold_batch_norm: the BatchNorm2d has no running statistics "
            "(track_running_stats=False normalizes every batch with its own), so it cannot be folded")
    if bn.num_features != conv.out_channels:
        raise ValueError(
            f"fold_batch_norm: the BatchNorm2d has {bn.num_features} features, the convolution "
            f"{conv.out_channels} output channels")
    with torch.no_grad():
        f64 = torch.float64
        w = conv.weight.detach().to(f64)
        device = w.device
        b = (conv.bias.detach().to(f64) if conv.bias is not None
             else torch.zeros(conv.out_channels, dtype=f64, device=device))
        gamma = (bn.weight.detach().to(device, f64) if bn.weight is not None
                 else torch.ones(conv.out_channels, dtype=f64, device=device))
        beta = (bn.bias.detach().to(device, f64) if bn.bias is not None
                else torch.zeros(conv.out_channels, dtype=f64, device=device))
        scale = gamma / torch.sqrt(bn.running_var.detach().to(device, f64) + bn.eps)
        w = w * scale.reshape(-1, 1, 1, 1)
        b = (b - bn.running_mean.detach().to(device, f64)) * scale + beta
        # empty_like keeps the weight's dtype, device and strides (memory format).
        weight = torch.empty_like(conv.weight).copy_(w)
        bias = torch.empty(conv.out_channels, dtype=conv.weight.dtype, device=device).copy_(b)
    requires_grad = conv.weight.requires_grad
    return (torch.nn.Parameter(weight, requires_grad=requires_grad),
            torch.nn.Parameter(bias, requires_grad=requires_grad))


class Filter2d(torch.nn.Module):
    """Applies customconv::filter2d with a (kh, kw) kernel held as a parameter
    (trainable when requires_grad=True) to every plane of its input."""

    def __init__(self, kernel: Tensor, border: str = "zeros", requires_grad: bool = False) -> None:
        super().__init__()
        if kernel.dim() != 2:
            raise ValueError(f"Filter2d: kernel must be 2-D (kh, kw); got shape {tuple(kernel.shape)}")
        self.kernel = torch.nn.Parameter(kernel.detach().clone(), requires_grad=requires_grad)
        self.border = border

    def forward(self, input: Tensor) -> Tensor:
        return torch.ops.customconv.filter2d(input, self.kernel, self.border)

    def extra_repr(self) -> str:
        return f"kernel_size={tuple(self.kernel.shape)}, border={self.border!r}"


class TrilinearInterpolation(torch.nn.Module):
    """forward(feats (N, 8, F), points (N, 3)) -> (N, F) through
    customconv::trilinear_interpolation (no parameters)."""

    def forward(self, feats: Tensor, points: Tensor) -> Tensor:
        return torch.ops.customconv.trilinear_interpolation(feats, points)
