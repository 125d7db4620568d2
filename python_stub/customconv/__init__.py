"""customconv: convolution-family ops for PyTorch with CPU and CUDA kernels.

Importing the package loads the compiled library, which registers the ops as
``torch.ops.customconv.*`` together with their autograd and meta (fake-tensor)
kernels. The functional wrappers and ``customconv.nn`` modules call those ops.
"""

import torch

from ._library import library_version, load_library

LIBRARY_PATH = load_library()

from . import functional, nn  # noqa: E402  (the ops must be registered first)
from .convert import convert  # noqa: E402
from .functional import (  # noqa: E402
    col2im,
    conv2d,
    conv2d_fused,
    depthwise_conv2d,
    filter2d,
    im2col,
    trilinear_interpolation,
)
from .fuse import FuseReport, fuse, fuse_report  # noqa: E402

#: The library's version: the CMake project's, as customconv::version() and the
#: CMake package (find_package(customconv)) report it.
__version__ = library_version(LIBRARY_PATH)

#: Every op of the library, forward and backward.
OPS = (
    "conv2d",
    "conv2d_fused",
    "depthwise_conv2d",
    "filter2d",
    "trilinear_interpolation",
    "im2col",
    "col2im",
    "conv2d_grad_input",
    "conv2d_grad_weight",
    "conv2d_grad_bias",
    "depthwise_conv2d_grad_input",
    "depthwise_conv2d_grad_weight",
    "depthwise_conv2d_grad_weight_bias",
    "filter2d_grad_input",
    "filter2d_grad_kernel",
    "trilinear_interpolation_backward",
    "trilinear_interpolation_with_derivatives",
    "trilinear_interpolation_backward_from_derivatives",
    "trilinear_interpolation_grad_feats",
)


def _check_fake_kernels():
    # The fake (meta) kernels are registered by the library itself, from the
    # same C++ checks and shape arithmetic as the CPU and CUDA kernels, so
    # torch.compile / torch.export see exactly the kernels' rules.
    for name in OPS:
        if not torch._C._dispatch_has_kernel_for_dispatch_key("customconv::" + name, "Meta"):
            raise ImportError(f"customconv: {LIBRARY_PATH} registers no meta kernel for {name}")


_check_fake_kernels()

__all__ = ["convert", "fuse", "fuse_report", "FuseReport", "conv2d", "conv2d_fused", "depthwise_conv2d", "filter2d", "trilinear_interpolation", "im2col", "col2im", "functional", "nn", "OPS", "LIBRARY_PATH", "__version__"]
