"""Modules built on the customconv ops, drop-in replacements for torch.nn ones."""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["Conv2d"]


class Conv2d(torch.nn.Conv2d):
    """A drop-in for torch.nn.Conv2d whose convolution runs customconv::conv2d.

    Same constructor arguments (padding "same"/"valid", every padding_mode),
    same parameters and buffers, so a torch.nn.Conv2d's state_dict loads as is.
    """

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
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
        return torch.ops.customconv.conv2d(
            input, weight, bias, [self.stride[0], self.stride[1]], padding,
            [self.dilation[0], self.dilation[1]], self.groups,
        )
