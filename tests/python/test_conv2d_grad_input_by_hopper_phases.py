"""conv2d_grad_input of ungrouped strided layers by stride phases on the
Hopper forward kernel (implicit_gemm.cpp, grad_input_by_hopper_phases;
wgmma_plan.h's stride_phases; rotated_weight.h's phase_weight_cuda): one
launch computes each stride phase's input positions as a stride-1 forward of
grad_output with that phase's taps, in float32 as TF32, float16 and bfloat16.
Against the float64 input gradient: random windows (every side at least its
stride), strides of 2 on one or both axes, paddings, odd and even planes,
weight layouts, each type; ResNet-50's 512-channel stride-2 layer; the route
seen running in the profiler; the memory format of the result; a CUDA graph;
the layers it declines (dilation, fewer than 512 output channels, windows
narrower than the stride, float32 without TF32) still right. Skipped on devices other than
sm_90, where the sm80-style strided input gradient runs these cases
(test_conv2d_implicit_gemm.py)."""

import re

import pytest
import torch
import torch.nn.functional as F

from testlib import capture_and_replay, cuda, kernels_launched, make_tensor, ops

pytestmark = [cuda, pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                       reason="the Hopper kernels run on sm_90 devices only")]

# The bound of an error against the products' magnitudes: TF32's and the
# 16-bit types' operands rounded, float32 sums, the result rounded once.
TOL = {torch.float32: 2.0**-8, torch.float16: 2.0**-8, torch.bfloat16: 2.0**-6}
# The route's kernels: the phases' weight, then the Hopper forward.
KERNELS = ("transposed_taps_kernel", "fprop_tma_kernel")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
IDS = ["f32", "f16", "bf16"]


def grad_input_and_kernels(go, x, w, stride, padding, dilation, tf32=True):
    """conv2d_grad_input with PyTorch's TF32 policy for convolutions set to
    tf32, and the names of the kernels it launched (testlib.kernels_launched;
    empty under compute-sanitizer)."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        got = []
        names = kernels_launched(lambda: got.append(
            ops.conv2d_grad_input(go, x, w, list(stride), list(padding), list(dilation), 1)))
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    return got[0], names


def grad_input_and_route(go, x, w, stride, padding, dilation):
    """conv2d_grad_input under TF32 and whether the phases' kernels ran (None
    where the profiler saw no kernel: under compute-sanitizer)."""
    got, names = grad_input_and_kernels(go, x, w, stride, padding, dilation)
    return got, (all(k in names for k in KERNELS) if names else None)


def check(got, go, x, w, stride, padding, dilation, ctx):
    def grad(x, w, go):
        x = x.double().requires_grad_()
        out = F.conv2d(x, w.double(), None, stride, padding, dilation)
        return torch.autograd.grad(out, x, go.double())[0]

    want = grad(x, w, go)
    bound = grad(x, w.abs(), go.abs())
    assert got.shape == want.shape and got.dtype == x.dtype, ctx
    err = (got.double() - want).abs() - TOL[x.dtype] * bound
    assert (err <= 1e-5).all(), (ctx, float(err.max()))


def make_layer(gen, dtype, n, c, k, size, kernel, stride, padding, dilation=(1, 1), layout="channels_last",
               weight_layout="contiguous"):
    x = make_tensor((n, c, *size), dtype, "cuda", layout, gen)
    w = make_tensor((k, c, *kernel), dtype, "cuda", weight_layout, gen)
    oh, ow = ((size[a] + 2 * padding[a] - dilation[a] * (kernel[a] - 1) - 1) // stride[a] + 1 for a in (0, 1))
    go = make_tensor((n, k, oh, ow), dtype, "cuda", layout, gen)
    return go, x, w


@pytest.mark.parametrize("idx", range(24))
def test_random_strided_layers(idx, rng, gen, seed):
    dtype = DTYPES[idx % len(DTYPES)]
    stride = rng.choice([(2, 2), (2, 2), (2, 1), (1, 2)])
    kernel = tuple(rng.randint(s, 5) for s in stride)
    padding = tuple(rng.randint(0, kk - 1) for kk in kernel)
    size = tuple(max(s, kk - 2 * p) + rng.randint(0, 13) for s, kk, p in zip(stride, kernel, padding))
    c = 8 * rng.randint(1, 24)
    k = 512 + (32 if dtype == torch.float32 else 64) * rng.randint(0, 8)
    layout = rng.choice(["channels_last", "channels_last", "contiguous"])
    weight_layout = rng.choice(["contiguous", "channels_last"])
    go, x, w = make_layer(gen, dtype, rng.randint(1, 4), c, k, size, kernel, stride, padding, layout=layout,
                          weight_layout=weight_layout)
    ctx = f"seed={seed} {dtype} x={tuple(x.shape)} w={tuple(w.shape)} s={stride} p={padding} {layout}/{weight_layout}"
    got, ran = grad_input_and_route(go, x, w, stride, padding, (1, 1))
    assert ran is not False, ctx
    fmt = torch.channels_last if layout == "channels_last" or weight_layout == "channels_last" \
        else torch.contiguous_format
    assert got.is_contiguous(memory_format=fmt), ctx
    check(got, go, x, w, stride, padding, (1, 1), ctx)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_resnet50_512_channel_stride_2_layer(dtype, gen):
    go, x, w = make_layer(gen, dtype, 4, 512, 512, (14, 14), (3, 3), (2, 2), (1, 1))
    got, ran = grad_input_and_route(go, x, w, (2, 2), (1, 1), (1, 1))
    assert ran is not False
    assert got.is_contiguous(memory_format=torch.channels_last)
    check(got, go, x, w, (2, 2), (1, 1), (1, 1), "resnet50 512 stride 2")


def test_float32_phases_on_the_pingpong_kernel(gen):
    # At N=32 the phases' tiles (208) outnumber an H100's or H200's 132
    # multiprocessors, so float32 runs the pingpong variant of the kernel.
    go, x, w = make_layer(gen, torch.float32, 32, 512, 512, (14, 14), (3, 3), (2, 2), (1, 1))
    got, names = grad_input_and_kernels(go, x, w, (2, 2), (1, 1), (1, 1))
    if names:  # (none under compute-sanitizer)
        assert re.search(r"fprop_tma_kernel<float, 128, 128, \d+, true>", names), names
    check(got, go, x, w, (2, 2), (1, 1), (1, 1), "resnet50 512 stride 2, N=32")


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("case", ["dilation", "256 output channels", "1x1 stride 2", "plane under the stride",
                                  "resnet50 128ch", "resnet50 256ch"])
def test_declined_layers_stay_right(case, dtype, gen):
    args = {
        "dilation": dict(c=64, k=512, size=(11, 12), kernel=(3, 3), stride=(2, 2), padding=(2, 2), dilation=(2, 2)),
        "256 output channels": dict(c=64, k=256, size=(13, 10), kernel=(3, 3), stride=(2, 2), padding=(1, 1)),
        "resnet50 128ch": dict(c=128, k=128, size=(56, 56), kernel=(3, 3), stride=(2, 2), padding=(1, 1)),
        "resnet50 256ch": dict(c=256, k=256, size=(28, 28), kernel=(3, 3), stride=(2, 2), padding=(1, 1)),
        "1x1 stride 2": dict(c=64, k=512, size=(14, 14), kernel=(1, 1), stride=(2, 2), padding=(0, 0)),
        "plane under the stride": dict(c=64, k=512, size=(1, 9), kernel=(3, 3), stride=(2, 2), padding=(1, 1)),
    }[case]
    dilation = args.pop("dilation", (1, 1))
    go, x, w = make_layer(gen, dtype, 2, args["c"], args["k"], args["size"], args["kernel"], args["stride"],
                          args["padding"], dilation)
    got, ran = grad_input_and_route(go, x, w, args["stride"], args["padding"], dilation)
    assert ran is not True, case
    check(got, go, x, w, args["stride"], args["padding"], dilation, case)


def test_float32_without_tf32_keeps_the_exact_routes(gen):
    go, x, w = make_layer(gen, torch.float32, 2, 64, 512, (10, 10), (3, 3), (2, 2), (1, 1))
    got, names = grad_input_and_kernels(go, x, w, (2, 2), (1, 1), (1, 1), tf32=False)
    assert "fprop_tma_kernel" not in names
    x64 = x.double().requires_grad_()
    want = torch.autograd.grad(F.conv2d(x64, w.double(), None, 2, 1), x64, go.double())[0]
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_empty_batch():
    x = torch.randn(0, 64, 14, 14, device="cuda").to(memory_format=torch.channels_last)
    w = torch.randn(512, 64, 3, 3, device="cuda")
    go = torch.randn(0, 512, 7, 7, device="cuda").to(memory_format=torch.channels_last)
    got = ops.conv2d_grad_input(go, x, w, [2, 2], [1, 1], [1, 1], 1)
    assert got.shape == x.shape


def test_backward_in_a_cuda_graph(gen):
    x = make_tensor((4, 128, 14, 14), torch.float32, "cuda", "channels_last", gen).requires_grad_()
    w = make_tensor((512, 128, 3, 3), torch.float32, "cuda", "channels_last", gen).requires_grad_()
    go = make_tensor((4, 512, 7, 7), torch.float32, "cuda", "channels_last", gen)

    def step():
        return (torch.autograd.grad(ops.conv2d(x, w, None, [2, 2], [1, 1], [1, 1], 1), x, go)[0],)

    (got,), _graph = capture_and_replay(step, [w.detach(), go], gen)
    assert torch.equal(got, step()[0])
    check(got, go, x.detach(), w.detach(), (2, 2), (1, 1), (1, 1), "graph")
