"""customconv.convert(model): torch.nn.Conv2d modules swapped for customconv's."""

import torch

from . import nn

__all__ = ["convert"]


def convert(module: torch.nn.Module) -> torch.nn.Module:
    """Replaces every torch.nn.Conv2d in `module` (the module itself included)
    by its customconv twin and returns the converted module.

    A convolution with groups == in_channels becomes a customconv.nn.DepthwiseConv2d
    (customconv::depthwise_conv2d), any other a customconv.nn.Conv2d
    (customconv::conv2d). The replacement takes over the original's parameters
    (the same Parameter objects, so an optimizer that holds them keeps working),
    its stride, padding (numbers, "same" or "valid"), dilation, groups,
    padding_mode (all four: zeros, reflect, replicate, circular) and training
    flag. Children are replaced in place, like torch.nn.SyncBatchNorm's
    convert_sync_batchnorm does; convert the model before scripting or
    compiling it.

    Only modules whose type is exactly torch.nn.Conv2d are converted:
    subclasses may compute something else in their forward (quantization-aware,
    parametrized, ... convolutions) and are left as they are; customconv's own
    modules are left alone too. A torch.nn.LazyConv2d not yet run (whose weight
    has no shape) is refused. Hooks registered on a replaced module are not
    carried over.
    """
    if isinstance(module, torch.nn.LazyConv2d):  # becomes a torch.nn.Conv2d on its first call
        raise ValueError(
            "customconv.convert: a LazyConv2d whose weight is not initialized yet; run the "
            "model once (or initialize it) before converting")
    if type(module) is torch.nn.Conv2d:
        return _converted_conv(module)
    for name, child in module.named_children():
        converted = convert(child)
        if converted is not child:
            setattr(module, name, converted)
    return module


def _converted_conv(conv: torch.nn.Conv2d) -> torch.nn.Conv2d:
    depthwise = conv.groups == conv.in_channels
    cls = nn.DepthwiseConv2d if depthwise else nn.Conv2d
    # Built on the meta device (no memory, no initialization), then given the
    # original's parameters.
    out = cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
              padding=conv.padding, dilation=conv.dilation,
              **({} if depthwise else {"groups": conv.groups}),
              bias=conv.bias is not None, padding_mode=conv.padding_mode, device="meta")
    out.weight = conv.weight
    out.bias = conv.bias
    out.train(conv.training)
    return out
