"""Modules built on the customconv ops, drop-in replacements for torch.nn ones."""

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["Conv2d", "DepthwiseConv2d", "Filter2d", "TrilinearInterpolation"]


class Conv2d(torch.nn.Conv2d):
    """A drop-in for torch.nn.Conv2d whose convolution runs customconv::conv2d.

    Same constructor arguments (padding "same"/"valid", every padding_mode),
    same parameters and buffers, so a torch.nn.Conv2d's state_dict loads as is.
    """

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
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
        input, padding = self._apply_padding(input)
        return torch.ops.customconv.depthwise_conv2d(
            input, weight, bias, [self.stride[0], self.stride[1]], padding,
            [self.dilation[0], self.dilation[1]],
        )


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
