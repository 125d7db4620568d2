"""The layout changes between NCHW and channels_last on CUDA
(ops/common/relayout_cuda.h): the kernels that read channels_last take NCHW
data through one transpose kernel, and give NCHW results back through it.
Here through grouped layers of 3 and 5 channels a group (the forward on the
grouped direct kernels, exact), whose result and gradients on NCHW tensors
must equal, bit for bit, those on the same values stored channels_last: channel and plane sizes even and odd (the
kernel moves 8 bytes of neighbouring elements at a time where both are
multiples of 4 elements in 16-bit, of 2 in float32, and the data aligned,
single elements otherwise, and one launch can do both: the input and the
weight together), data one element off its alignment, planes of several
tiles."""

import pytest
import torch
import torch.nn.functional as F

from testlib import cuda, make_tensor, ops

pytestmark = cuda

DTYPES = [pytest.param(torch.float16, id="f16"), pytest.param(torch.bfloat16, id="bf16"),
          pytest.param(torch.float32, id="f32")]
# (N, C, H, W, groups): C and H * W multiples of 4, even, odd, and mixed;
# several tiles of 64 x 64, and (the last) more tiles than the device holds
# blocks at once, so that each block moves several; all above the tiny
# problems' bound (tiny_direct.h), whose one-launch kernels read NCHW in
# place.
SHAPES = [(2, 96, 24, 20, 32), (2, 132, 30, 30, 44), (2, 66, 20, 24, 22), (4, 9, 63, 65, 3), (3, 130, 9, 15, 26),
          (2, 27, 40, 40, 9), (1, 192, 33, 34, 64), (8, 132, 7, 7, 44), (40, 64, 48, 50, 1)]


@pytest.mark.parametrize("offset", [False, True], ids=["aligned", "offset"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES)
def test_nchw_results_equal_channels_last_ones_bit_for_bit(dtype, shape, offset, gen):
    n, c, h, w, groups = shape
    layout = "offset" if offset else "contiguous"
    x = make_tensor((n, c, h, w), dtype, "cuda", layout, gen, requires_grad=True)
    wt = make_tensor((c, c // groups, 3, 3), dtype, "cuda", layout, gen, requires_grad=True)
    go = make_tensor((n, c, h, w), dtype, "cuda", layout, gen)
    assert x.is_contiguous() and wt.is_contiguous()
    args = ([1, 1], [1, 1], [1, 1], groups)

    out = ops.conv2d(x, wt, None, *args)
    gx, gw = torch.autograd.grad(out, (x, wt), go)

    xc = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    wc = wt.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    out_c = ops.conv2d(xc, wc, None, *args)
    gx_c, gw_c = torch.autograd.grad(out_c, (xc, wc), go.contiguous(memory_format=torch.channels_last))

    assert out.is_contiguous() and gx.is_contiguous()
    for got, want in ((out, out_c), (gx, gx_c), (gw, gw_c)):
        assert torch.equal(got, want)
    want = F.conv2d(x.double(), wt.double(), None, 1, 1, 1, groups)
    tol = {torch.float16: 1e-2, torch.bfloat16: 4e-2}.get(dtype, 1e-5)
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol * float(want.abs().max()))
