"""Under torch.use_deterministic_algorithms(True) every op's forward and
backward give bitwise identical results over repeated runs, on every device.
None of them raises PyTorch's nondeterminism error: the backward kernels
reduce in a fixed order without atomics (weight, kernel and points
gradients; conv2d's bias gradient is ATen's deterministic sum), and conv2d's
cuBLAS GEMMs run on the current stream's handle."""

import pytest
import torch

from testlib import DEVICES, assert_deterministic, make_tensor, ops

RUNS = 3


@pytest.fixture(autouse=True)
def deterministic_and_two_threads():
    """Deterministic algorithms on, and two CPU threads (the parallel paths)."""
    was, threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(2)
    yield
    torch.use_deterministic_algorithms(was)
    torch.set_num_threads(threads)


def tensors(device, dtype, gen, *shapes):
    return [make_tensor(s, dtype, device, gen=gen, requires_grad=True) for s in shapes]


# op -> inputs(device, dtype, gen) -> (function of the inputs, the inputs). Large
# enough for many CPU tasks / CUDA blocks per reduction.
CASES = {
    "conv2d": lambda d, dt, g: (
        lambda x, w, b: ops.conv2d(x, w, b, [2, 1], [1, 2], [1, 2], 2),
        tensors(d, dt, g, (6, 8, 30, 28), (12, 4, 3, 3), (12,))),
    "conv2d_1x1": lambda d, dt, g: (
        lambda x, w, b: ops.conv2d(x, w, b, [1, 1], [0, 0], [1, 1], 1),
        tensors(d, dt, g, (4, 16, 24, 24), (32, 16, 1, 1), (32,))),
    "im2col": lambda d, dt, g: (
        lambda x: ops.im2col(x, [3, 2], [1, 2], [1, 1], [2, 1]),
        tensors(d, dt, g, (4, 6, 30, 28))),
    "col2im": lambda d, dt, g: (
        lambda c: ops.col2im(c, [30, 28], [3, 3], [1, 1], [1, 1], [1, 1]),
        tensors(d, dt, g, (4, 54, 840))),
    "depthwise_conv2d": lambda d, dt, g: (
        lambda x, w, b: ops.depthwise_conv2d(x, w, b, [1, 2], [2, 1], [1, 1]),
        tensors(d, dt, g, (4, 16, 40, 36), (32, 1, 5, 3), (32,))),
    "filter2d": lambda d, dt, g: (
        lambda x, k: ops.filter2d(x, k, "reflect"),
        tensors(d, dt, g, (3, 5, 40, 44), (7, 5))),
    "trilinear_interpolation": lambda d, dt, g: (
        ops.trilinear_interpolation,
        [make_tensor((3000, 8, 33), dt, d, gen=g, requires_grad=True),
         make_tensor((3000, 3), dt, d, gen=g, requires_grad=True, uniform=(-1.5, 1.5))]),
}

DTYPES = {"cpu": (torch.float32, torch.bfloat16, torch.float64),
          "cuda": (torch.float32, torch.float16, torch.bfloat16, torch.float64)}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_backward_is_bitwise_reproducible_under_deterministic_algorithms(device, case, gen):
    for dtype in DTYPES[device]:
        fn, inputs = CASES[case](device, dtype, gen)
        probe = fn(*inputs)
        grad = make_tensor(probe.shape, dtype, device, gen=gen)

        def run():
            out = fn(*inputs)
            return (out,) + torch.autograd.grad(out, inputs, grad)

        for _ in range(RUNS - 1):
            assert_deterministic(run, f"{case} on {device} in {dtype}")
