"""customconv::filter2d against F.pad + F.conv2d per plane: forward and the
gradients of input and kernel for every border, odd kernels 1x1 to 31x31
(square or not), planes smaller than the kernel where the border allows it,
no / one / several / zero-sized leading dims and non-contiguous tensors, on
every supported device and dtype; its backward ops called directly;
deterministic gradients; and customconv.nn.Filter2d."""

import dataclasses

import pytest
import torch

import customconv
from testlib import (
    BORDERS,
    DEVICE_DTYPES,
    DEVICES,
    FilterConfig,
    assert_deterministic,
    capture_and_replay,
    check_against_reference,
    check_under_no_grad_and_inference_mode,
    cuda,
    f64,
    filter2d_reductions,
    filter2d_reference,
    filter2d_torch,
    make_tensor,
    min_plane_size,
    ops,
    random_filter2d_config,
)

N_RANDOM = 30


def run_filter2d_case(cfg, device, dtype, gen, ctx, call="ops", need=("x", "k")):
    """Runs cfg forward and backward; checks every result against filter2d_torch."""
    x = make_tensor(cfg.input_shape, dtype, device, cfg.input_layout, gen, "x" in need)
    k = make_tensor(cfg.kernel, dtype, device, cfg.kernel_layout, gen, "k" in need)

    def filter2d(input, kernel):
        if call == "ops":
            return ops.filter2d(input, kernel, cfg.border)
        if call == "ops-kwargs":
            return ops.filter2d(input, kernel=kernel, border=cfg.border)
        return customconv.filter2d(input, kernel, cfg.border)

    out = check_against_reference(filter2d, dict(input=x, kernel=k),
                                  lambda g: filter2d_reference(cfg, x, k, g),
                                  filter2d_reductions(cfg), dtype, device, gen, ctx,
                                  cfg.grad_layout)
    assert out.shape == x.shape, ctx


@pytest.mark.parametrize("idx", range(N_RANDOM))
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_filter2d_matches_torch_on_random_configs(device, dtype, idx, rng, gen, seed):
    cfg = random_filter2d_config(rng)
    call = rng.choice(["ops", "ops", "ops-kwargs", "functional"])
    ctx = f"seed={seed} {device} {dtype} call={call} {cfg}"
    run_filter2d_case(cfg, device, dtype, gen, ctx, call)


def smallest(kernel):
    """The smallest plane each border allows for `kernel` (a callable of the border)."""
    return lambda border: dict(kernel=kernel, size=tuple(min_plane_size(border, k) for k in kernel))


# name -> a callable(border) -> the pinned config fields.
CONTIGUOUS = dict(input_layout="contiguous", grad_layout="contiguous")

EDGE_CASES = {
    "kernel_1x1": lambda b: dict(kernel=(1, 1)),
    "kernel_1x1_plane_1x1": lambda b: dict(kernel=(1, 1), size=(1, 1)),
    "kernel_3x3_plane_1x1_or_smallest": smallest((3, 3)),
    "kernel_7x7_smallest_plane": smallest((7, 7)),
    "kernel_31x31_smallest_plane": smallest((31, 31)),
    "kernel_31x31_plane_16x17": lambda b: dict(kernel=(31, 31), size=(16, 17), lead=(2,)),
    "kernel_31x1": lambda b: dict(kernel=(31, 1), size=(20, 5)),
    "kernel_1x31": lambda b: dict(kernel=(1, 31), size=(3, 16)),
    "kernel_3x17": lambda b: dict(kernel=(3, 17), size=(6, 9)),
    "kernel_17x5": lambda b: dict(kernel=(17, 5), size=(9, 7)),
    # 5x5 and 7x7 with the zero border: the CUDA kernel with taps in shared
    # memory, on 8-element vectors, quads and scalar loads.
    "kernel_7x7_plane_26x48": lambda b: dict(kernel=(7, 7), size=(26, 48), lead=(3,)),
    "kernel_7x7_plane_17x36": lambda b: dict(kernel=(7, 7), size=(17, 36), lead=(2,)),
    "kernel_5x5_plane_30x64": lambda b: dict(kernel=(5, 5), size=(30, 64), lead=(2,)),
    # The tensor-core CUDA kernel (float16 and bfloat16, widths of a multiple
    # of 8, planes that fill at least half of the 64-row tiles they take; 3
    # taps on planes 1024 wide): several tiles along x and y, partial at the
    # edges.
    "tensor_cores_7x7_plane_120x200": lambda b: dict(kernel=(7, 7), size=(120, 200), lead=(2,),
                                                    **CONTIGUOUS),
    "tensor_cores_5x5_plane_100x200": lambda b: dict(kernel=(5, 5), size=(100, 200), lead=(3,),
                                                    **CONTIGUOUS),
    "tensor_cores_3x3_plane_33x2048": lambda b: dict(kernel=(3, 3), size=(33, 2048), lead=(),
                                                     **CONTIGUOUS),
    # float32 7x7 with the zero border on planes holding a whole 64 x 128 tile:
    # the staged-tile CUDA kernel (three tiles each way, partial at the edges).
    "staged_tile_7x7_plane_136x260": lambda b: dict(kernel=(7, 7), size=(136, 260), lead=(2,),
                                                   **CONTIGUOUS),
    # Tall kernels: the column-streaming CUDA kernel with the zero border
    # (several warps and tiles along x and y, kernels wider than tall).
    "kernel_13x13_plane_70x90": lambda b: dict(kernel=(13, 13), size=(70, 90), lead=(2,)),
    "kernel_9x21_plane_48x33": lambda b: dict(kernel=(9, 21), size=(48, 33)),
    "kernel_31x31_plane_80x130": lambda b: dict(kernel=(31, 31), size=(80, 130)),
    "plane_smaller_than_kernel": lambda b: dict(
        kernel=(9, 11), size=(max(2, min_plane_size(b, 9)), max(3, min_plane_size(b, 11)))),
    "plane_1xW": lambda b: dict(kernel=(1, 5), size=(1, 7)),
    "plane_Hx1": lambda b: dict(kernel=(5, 1), size=(6, 1)),
    "no_leading_dims": lambda b: dict(lead=()),
    "one_leading_dim": lambda b: dict(lead=(3,)),
    "several_leading_dims": lambda b: dict(lead=(2, 1, 3)),
    "zero_sized_leading_dim": lambda b: dict(lead=(0,)),
    "zero_sized_among_several": lambda b: dict(lead=(2, 0, 3)),
    "channels_last": lambda b: dict(lead=(2, 3), input_layout="channels_last"),
    "transposed_input_and_kernel": lambda b: dict(lead=(2,), input_layout="transposed",
                                                  kernel_layout="transposed"),
    "sliced_input_and_grad": lambda b: dict(lead=(3,), input_layout="sliced",
                                            grad_layout="sliced"),
    "expanded_input_and_grad": lambda b: dict(lead=(3, 2), input_layout="expanded",
                                              grad_layout="expanded"),
    "offset_everything": lambda b: dict(lead=(2,), input_layout="offset", kernel_layout="offset",
                                        grad_layout="offset"),
    "unbatched_transposed": lambda b: dict(lead=(), input_layout="transposed",
                                           grad_layout="transposed"),
}


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
@pytest.mark.parametrize("border", BORDERS)
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_filter2d_matches_torch_on_edge_cases(device, dtype, border, case, rng, gen, seed):
    cfg = random_filter2d_config(rng, border=border, **EDGE_CASES[case](border))
    ctx = f"seed={seed} {device} {dtype} case={case} {cfg}"
    run_filter2d_case(cfg, device, dtype, gen, ctx)


LARGE_CASES = {
    # On CUDA, more than 65535 tile rows: the kernel without tiles.
    "tall_plane": FilterConfig(lead=(), size=(1_048_600, 1), kernel=(5, 1), border="zeros"),
    # More than 65535 planes (the grid's z limit on CUDA).
    "many_planes": FilterConfig(lead=(70_000,), size=(3, 2), kernel=(3, 3), border="zeros"),
    "many_planes_tall_kernel": FilterConfig(lead=(70_000,), size=(25, 3), kernel=(11, 3),
                                            border="zeros"),
}


def stack_for_streamed_tiles(tiles_per_plane):
    """Planes enough that float32 7x7 on CUDA takes the streamed-tile kernel,
    which needs at least three 64 x 128 tiles per SM."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return -(-3 * sms // tiles_per_plane)


@cuda
@pytest.mark.parametrize("border", ["zeros", "reflect"])
def test_filter2d_float32_7x7_on_many_tiles_matches_torch(border, gen, seed):
    # 136 x 260 planes hold 3 x 3 tiles (partial at the right and bottom);
    # with the zero border the forward and the adjoint take the streamed-tile
    # kernel (the TMA unit zero-fills outside the plane), each block walking
    # several tiles; reflect takes the other kernels, for comparison.
    cfg = FilterConfig(lead=(stack_for_streamed_tiles(9),), size=(136, 260), kernel=(7, 7),
                       border=border)
    run_filter2d_case(cfg, "cuda", torch.float32, gen, f"seed={seed} {cfg}")


@pytest.mark.parametrize("border", BORDERS)
@pytest.mark.parametrize("case", sorted(LARGE_CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_filter2d_matches_torch_on_large_inputs(device, case, border, gen, seed):
    cfg = dataclasses.replace(LARGE_CASES[case], border=border)
    run_filter2d_case(cfg, device, torch.float32, gen, f"seed={seed} {device} {cfg}")


@pytest.mark.parametrize("need", [("x",), ("k",), ()])
@pytest.mark.parametrize("device", DEVICES)
def test_filter2d_gradients_only_of_inputs_that_require_grad(device, need, rng, gen, seed):
    cfg = random_filter2d_config(rng, lead=(2, 3))
    ctx = f"seed={seed} {device} requires_grad={need} {cfg}"
    run_filter2d_case(cfg, device, torch.float64, gen, ctx, need=need)


@pytest.mark.parametrize("border", BORDERS)
@pytest.mark.parametrize("device", DEVICES)
def test_filter2d_backward_ops_called_directly_match_torch(device, border, rng, gen, seed):
    cfg = random_filter2d_config(rng, border=border, lead=(2,), kernel=(5, 3))
    x = make_tensor(cfg.input_shape, torch.float64, device, cfg.input_layout, gen)
    k = make_tensor(cfg.kernel, torch.float64, device, cfg.kernel_layout, gen)
    go = make_tensor(cfg.input_shape, torch.float64, device, cfg.grad_layout, gen)
    ref = filter2d_reference(cfg, x, k, go)
    got = {"grad_input": ops.filter2d_grad_input(go, k, border),
           "grad_kernel": ops.filter2d_grad_kernel(go, x, k, border)}
    for name, g in got.items():
        torch.testing.assert_close(g.cpu(), ref[name][0], rtol=1e-10, atol=1e-10,
                                   msg=lambda m: f"seed={seed} {name} {cfg}: {m}")


@pytest.mark.parametrize("device", DEVICES)
def test_filter2d_kernel_gradient_takes_65535_taps_and_refuses_more(device, gen):
    # The limit is checked with the other filter2d checks, so every device (and
    # the meta kernel) reports it alike; 257 x 255 is the largest odd kernel under it.
    x = make_tensor((1, 3, 4), torch.float64, device, gen=gen)
    go = make_tensor((1, 3, 4), torch.float64, device, gen=gen)
    k = make_tensor((257, 255), torch.float64, device, gen=gen)
    cfg = FilterConfig(size=(3, 4), kernel=(257, 255), border="zeros", lead=(1,))
    want = filter2d_reference(cfg, x, k, go)["grad_kernel"][0]
    torch.testing.assert_close(ops.filter2d_grad_kernel(go, x, k, "zeros").cpu(), want,
                               rtol=1e-10, atol=1e-10)
    big = make_tensor((257, 257), torch.float64, device, gen=gen)
    for d in (device, "meta"):
        with pytest.raises(RuntimeError, match=r"66049 taps; the kernel gradient supports at most "
                                               r"65535 taps"):
            ops.filter2d_grad_kernel(go.to(d), x.to(d), big.to(d), "zeros")


@pytest.mark.parametrize("device", DEVICES)
def test_filter2d_border_defaults_to_zeros(device, gen):
    x = make_tensor((2, 5, 6), torch.float64, device, gen=gen)
    k = make_tensor((3, 5), torch.float64, device, gen=gen)
    want = filter2d_torch(f64(x), f64(k), "zeros")
    for got in (ops.filter2d(x, k), ops.filter2d(input=x, kernel=k), customconv.filter2d(x, k),
                customconv.nn.Filter2d(k)(x)):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_filter2d_under_inference_mode_and_no_grad_matches_torch(device, gen):
    x = make_tensor((3, 2, 6, 7), torch.float64, device, "channels_last", gen, True)
    k = make_tensor((3, 3), torch.float64, device, gen=gen, requires_grad=True)
    want = filter2d_torch(f64(x), f64(k), "replicate")
    check_under_no_grad_and_inference_mode(lambda: ops.filter2d(x, k, "replicate"), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("device", DEVICES)
def test_filter2d_gradients_are_deterministic(device, dtype, gen):
    if dtype == torch.float16 and device == "cpu":
        dtype = torch.bfloat16
    # ~1M samples: the kernel gradient is summed in many chunks on CUDA.
    x = make_tensor((4, 4, 256, 256), dtype, device, gen=gen, requires_grad=True)
    k = make_tensor((5, 3), dtype, device, gen=gen, requires_grad=True)
    g = make_tensor(x.shape, dtype, device, gen=gen)

    for border in BORDERS:
        def grads():
            out = ops.filter2d(x, k, border)
            return (out,) + torch.autograd.grad(out, (x, k), g)

        assert_deterministic(grads, f"filter2d border={border} on {device} in {dtype}")


# ---------------------------------------------------------------- customconv.nn.Filter2d


@pytest.mark.parametrize("border", BORDERS)
@pytest.mark.parametrize("device", DEVICES)
def test_nn_filter2d_matches_the_op_and_trains_its_kernel_when_asked(device, border, gen, seed):
    kernel = make_tensor((3, 5), torch.float64, "cpu", gen=gen)
    frozen = customconv.nn.Filter2d(kernel, border).to(device)
    trained = customconv.nn.Filter2d(kernel, border=border, requires_grad=True).to(device)
    assert isinstance(frozen.kernel, torch.nn.Parameter) and not frozen.kernel.requires_grad
    assert trained.kernel.requires_grad
    assert frozen.kernel.data_ptr() != kernel.data_ptr(), "the module must own a copy"
    assert list(frozen.state_dict()) == ["kernel"]
    assert frozen.extra_repr() == f"kernel_size=(3, 5), border={border!r}"

    x = make_tensor((2, 3, 6, 7), torch.float64, device, gen=gen, requires_grad=True)
    cfg = FilterConfig(lead=(2, 3), size=(6, 7), kernel=(3, 5), border=border)
    g = make_tensor(x.shape, torch.float64, device, gen=gen)
    ref = filter2d_reference(cfg, x, kernel, g)
    out = frozen(x)
    torch.testing.assert_close(out.cpu(), ref["output"][0], rtol=1e-12, atol=1e-12)
    (gx,) = torch.autograd.grad(out, x, g)
    torch.testing.assert_close(gx.cpu(), ref["grad_input"][0], rtol=1e-12, atol=1e-12)
    out = trained(x)
    gx, gk = torch.autograd.grad(out, (x, trained.kernel), g)
    torch.testing.assert_close(gx.cpu(), ref["grad_input"][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gk.cpu(), ref["grad_kernel"][0], rtol=1e-10, atol=1e-10,
                               msg=lambda m: f"seed={seed}: {m}")

    # state_dict round trip into a module made with another kernel.
    other = customconv.nn.Filter2d(torch.zeros(3, 5, dtype=torch.float64), border).to(device)
    other.load_state_dict(trained.state_dict(), strict=True)
    torch.testing.assert_close(other(x), trained(x), rtol=0, atol=0)


def test_nn_filter2d_refuses_a_kernel_that_is_not_2d():
    with pytest.raises(ValueError, match=r"Filter2d: kernel must be 2-D \(kh, kw\); got shape \(1, 3, 3\)"):
        customconv.nn.Filter2d(torch.ones(1, 3, 3))


@pytest.mark.parametrize("device", DEVICES)
def test_nn_filter2d_in_float32_matches_float64_reference(device, gen):
    kernel = make_tensor((5, 5), torch.float32, "cpu", gen=gen)
    module = customconv.nn.Filter2d(kernel, "circular", requires_grad=True).to(device)
    x = make_tensor((4, 9, 8), torch.float32, device, gen=gen)
    want = filter2d_torch(f64(x), f64(kernel), "circular")
    torch.testing.assert_close(module(x).double().cpu(), want, rtol=1e-5, atol=1e-5)


@cuda
def test_filter2d_captures_into_a_cuda_graph_and_replays_with_new_inputs(gen):
    dt = torch.float64
    x = make_tensor((3, 9, 40), dt, "cuda", gen=gen)
    k = make_tensor((5, 3), dt, "cuda", gen=gen)
    go = make_tensor((3, 9, 40), dt, "cuda", gen=gen)

    def step():
        return (ops.filter2d(x, k, "reflect"), ops.filter2d_grad_input(go, k, "reflect"),
                ops.filter2d_grad_kernel(go, x, k, "reflect"))

    results, _graph = capture_and_replay(step, (x, go), gen)
    cfg = FilterConfig(lead=(3,), size=(9, 40), kernel=(5, 3), border="reflect")
    ref = filter2d_reference(cfg, x, k, go)
    for i, (got, name) in enumerate(zip(results, ("output", "grad_input", "grad_kernel"))):
        torch.testing.assert_close(got.cpu(), ref[name][0], rtol=1e-10, atol=1e-10,
                                   msg=lambda m: f"result {i}: {m}")


@cuda
def test_filter2d_float32_7x7_on_many_tiles_captures_into_a_cuda_graph(gen):
    # The streamed-tile kernel's tensor map (built on the host at capture) names
    # the captured input, so a replay filters whatever that buffer then holds.
    lead = stack_for_streamed_tiles(9)
    x = make_tensor((lead, 136, 260), torch.float32, "cuda", gen=gen)
    k = make_tensor((7, 7), torch.float32, "cuda", gen=gen)
    go = make_tensor((lead, 136, 260), torch.float32, "cuda", gen=gen)

    def step():
        return ops.filter2d(x, k, "zeros"), ops.filter2d_grad_input(go, k, "zeros")

    (out, grad_in), _graph = capture_and_replay(step, (x, k, go), gen)
    torch.testing.assert_close(out, ops.filter2d(x, k, "zeros"), rtol=0, atol=0)
    torch.testing.assert_close(grad_in, ops.filter2d_grad_input(go, k, "zeros"), rtol=0, atol=0)
    want = filter2d_torch(f64(x), f64(k), "zeros")
    torch.testing.assert_close(out.double().cpu(), want.cpu(), rtol=1e-4, atol=1e-4)
