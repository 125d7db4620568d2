"""customconv::depthwise_conv2d against F.conv2d(..., groups=C): forward and
the gradients of input, weight and bias, on random and hand-picked
configurations (kernels up to 31x31, channel multipliers 1-4, stride,
dilation, padding, non-contiguous tensors, empty batches), for every supported
device and dtype; its backward ops called directly; deterministic gradients;
and customconv.nn.DepthwiseConv2d as a drop-in for torch.nn.Conv2d(groups=C)."""

import pytest
import torch
import torch.nn.functional as F

import customconv
from testlib import (
    DEVICE_DTYPES,
    DEVICES,
    assert_deterministic,
    capture_and_replay,
    check_conv_case,
    check_drop_in_matches,
    check_drop_in_state_dict,
    check_float32_drop_in_matches_float64,
    check_trains_alike,
    check_under_no_grad_and_inference_mode,
    conv2d_reference,
    cuda,
    make_tensor,
    ops,
    random_depthwise_config,
)

# torch.nn.Conv2d and F.conv2d warn about padding="same" with even kernels; so be it.
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same'")

N_RANDOM = 30


def run_depthwise_case(cfg, device, dtype, gen, ctx, call="ops", need=("x", "w", "b")):
    """Runs cfg forward and backward; checks every result against F.conv2d."""
    stride, padding, dilation, _ = cfg.args()

    def depthwise(input, weight, bias):
        if call == "ops":
            return ops.depthwise_conv2d(input, weight, bias, stride, padding, dilation)
        if call == "ops-kwargs":
            return ops.depthwise_conv2d(input, weight, bias=bias, stride=stride, padding=padding,
                                        dilation=dilation)
        # The functional wrapper: F.conv2d's signature without groups, tuples.
        return customconv.depthwise_conv2d(input, weight, bias, cfg.stride, cfg.padding,
                                           cfg.dilation)

    check_conv_case(depthwise, cfg, device, dtype, gen, ctx, need)


@pytest.mark.parametrize("idx", range(N_RANDOM))
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_depthwise_conv2d_matches_torch_on_random_configs(device, dtype, idx, rng, gen, seed):
    cfg = random_depthwise_config(rng)
    call = rng.choice(["ops", "ops", "ops-kwargs", "functional"])
    ctx = f"seed={seed} {device} {dtype} call={call} {cfg}"
    run_depthwise_case(cfg, device, dtype, gen, ctx, call)


# The tensor-core kernel's conditions besides the kernel, padding and plane:
# stride 1, dilation 1, contiguous (aligned) input and grad output.
TENSOR_CORES = dict(stride=(1, 1), dilation=(1, 1), input_layout="contiguous",
                    grad_layout="contiguous")

EDGE_CASES = {
    "batch0": dict(batch=0),
    "batch0_large_kernel": dict(batch=0, kernel=(9, 7)),
    "batch1": dict(batch=1),
    "unbatched": dict(batch=None),
    "unbatched_channels_last": dict(batch=None, input_layout="channels_last"),
    "multiplier1": dict(multiplier=1, channels=4),
    "multiplier2": dict(multiplier=2, channels=3),
    "multiplier3": dict(multiplier=3, channels=2),
    "multiplier4": dict(multiplier=4, channels=3),
    "one_channel_multiplier4": dict(channels=1, multiplier=4),
    "many_channels": dict(channels=40, multiplier=1, batch=2, kernel=(3, 3), size=(9, 11)),
    "kernel_1x1": dict(kernel=(1, 1)),
    "kernel_31x31": dict(kernel=(31, 31), padding=(15, 15), dilation=(1, 1), stride=(1, 1),
                         size=(20, 33)),
    "kernel_31x31_no_padding": dict(kernel=(31, 31), padding=(0, 0), dilation=(1, 1),
                                    size=(33, 31), batch=2),
    "kernel_31x1": dict(kernel=(31, 1), padding=(2, 0), dilation=(1, 1), size=(30, 6)),
    "kernel_1x31": dict(kernel=(1, 31), padding=(0, 15), dilation=(1, 1), size=(5, 17)),
    "kernel_3x17": dict(kernel=(3, 17), padding=(1, 8), dilation=(2, 1), stride=(1, 2)),
    "kernel_17x5_strided": dict(kernel=(17, 5), padding=(8, 2), stride=(3, 2), dilation=(1, 1)),
    "kernel_2x4_even": dict(kernel=(2, 4), padding=(1, 2)),
    "kernel_covers_whole_input": dict(kernel=(5, 4), size=(5, 4), padding=(0, 0),
                                      dilation=(1, 1)),
    "stride_larger_than_kernel": dict(kernel=(2, 1), stride=(3, 4), padding=(0, 0),
                                      dilation=(1, 1), size=(10, 9)),
    "dilation_3x2": dict(kernel=(5, 3), dilation=(3, 2), padding=(2, 1)),
    "dilated_large_kernel": dict(kernel=(11, 9), dilation=(2, 3), padding=(4, 5)),
    "padding_larger_than_kernel": dict(kernel=(2, 3), padding=(4, 3), size=(2, 2),
                                       dilation=(1, 1)),
    "output_1x1": dict(kernel=(3, 3), stride=(5, 5), padding=(1, 1), dilation=(1, 1),
                       size=(2, 2)),
    "no_bias": dict(bias=False),
    "channels_last_input_and_weight": dict(input_layout="channels_last",
                                           weight_layout="channels_last", batch=3),
    "transposed_input": dict(input_layout="transposed", batch=2),
    "sliced_input_and_grad": dict(input_layout="sliced", grad_layout="sliced", batch=2),
    "expanded_input_and_grad": dict(input_layout="expanded", grad_layout="expanded", batch=3),
    "offset_input_weight_grad": dict(input_layout="offset", weight_layout="offset",
                                     grad_layout="offset", batch=2),
    # "Same" padding on widths of a multiple of 4: the CUDA kernels' vector loads
    # and stores (aligned quads; 16-bit data with 3 or 5 taps on widths of a
    # multiple of 8 takes 8-element vectors); the offset layouts take the
    # scalar path.
    "same_3x3_quads_width12": dict(kernel=(3, 3), padding=(1, 1), stride=(1, 1),
                                   dilation=(1, 1), size=(5, 12), batch=2),
    "same_5x5_eights": dict(kernel=(5, 5), padding=(2, 2), stride=(1, 1), dilation=(1, 1),
                            size=(11, 24), batch=2),
    "same_3x3_quads": dict(kernel=(3, 3), padding=(1, 1), stride=(1, 1), dilation=(1, 1),
                           size=(9, 16), batch=2),
    "same_5x5_quads_multiplier2": dict(kernel=(5, 5), padding=(2, 2), stride=(1, 1),
                                       dilation=(1, 1), size=(7, 12), multiplier=2),
    "same_7x7_quads": dict(kernel=(7, 7), padding=(3, 3), stride=(1, 1), dilation=(1, 1),
                           size=(10, 8), batch=2),
    # Planes of more than 24 rows: the blocked CUDA weight gradient cuts them into
    # strips of 16 grad-output rows (the last one shorter), on the vector path
    # and on the scalar one (widths not a multiple of 4, padding other than "same").
    "tall_3x3_strips": dict(kernel=(3, 3), padding=(1, 1), stride=(1, 1), dilation=(1, 1),
                            size=(37, 16), batch=2),
    "tall_5x5_eights_multiplier2": dict(kernel=(5, 5), padding=(2, 2), stride=(1, 1),
                                        dilation=(1, 1), size=(45, 24), multiplier=2),
    "tall_7x7_width14": dict(kernel=(7, 7), padding=(3, 3), stride=(1, 1), dilation=(1, 1),
                             size=(30, 14), batch=2),
    "tall_5x5_unpadded": dict(kernel=(5, 5), padding=(0, 0), stride=(1, 1), dilation=(1, 1),
                              size=(33, 21), batch=2),
    "tall_3x3_uneven_padding": dict(kernel=(3, 3), padding=(2, 0), stride=(1, 1),
                                    dilation=(1, 1), size=(27, 10)),
    # Stride 2 with "same" padding: vectors on widths of a multiple of 4 (8 for
    # 16-bit data with 3 or 5 taps), scalar loads elsewhere.
    "tall_3x3_stride2_quads": dict(kernel=(3, 3), padding=(1, 1), stride=(2, 2),
                                   dilation=(1, 1), size=(67, 32), batch=2),
    "tall_5x5_stride2_width14": dict(kernel=(5, 5), padding=(2, 2), stride=(2, 2),
                                     dilation=(1, 1), size=(40, 14), batch=2),
    "stride2_7x7_quads": dict(kernel=(7, 7), padding=(3, 3), stride=(2, 2), dilation=(1, 1),
                              size=(31, 16), batch=2),
    "stride2_5x5_eights_multiplier2": dict(kernel=(5, 5), padding=(2, 2), stride=(2, 2),
                                           dilation=(1, 1), size=(19, 32), multiplier=2),
    # Stride-2 input gradients off the vector path: odd and even paddings on
    # either axis (the kernel's rows and columns start by the padding's parity),
    # padding wider than the kernel, misaligned tensors.
    "stride2_3x3_unpadded_odd_sizes": dict(kernel=(3, 3), padding=(0, 0), stride=(2, 2),
                                           dilation=(1, 1), size=(23, 17), batch=2),
    "stride2_5x5_uneven_padding": dict(kernel=(5, 5), padding=(3, 1), stride=(2, 2),
                                       dilation=(1, 1), size=(21, 19), multiplier=2),
    "stride2_7x7_width12": dict(kernel=(7, 7), padding=(3, 3), stride=(2, 2), dilation=(1, 1),
                                size=(18, 12), batch=2),
    "stride2_3x3_wide_padding": dict(kernel=(3, 3), padding=(4, 3), stride=(2, 2),
                                     dilation=(1, 1), size=(9, 10), batch=2),
    "stride2_3x3_quads_offset": dict(kernel=(3, 3), padding=(1, 1), stride=(2, 2),
                                     dilation=(1, 1), size=(9, 16), input_layout="offset",
                                     grad_layout="offset"),
    "same_3x3_quads_offset": dict(kernel=(3, 3), padding=(1, 1), stride=(1, 1), dilation=(1, 1),
                                  size=(6, 8), input_layout="offset", grad_layout="offset"),
    # 7x7 (and 5x5 on the vector path) at stride 1 take the CUDA kernel with
    # taps staged in shared memory: 8-element vectors for 16-bit data on widths
    # of a multiple of 8, quads, scalar loads; many small planes per block (and
    # too many for it: 20x8 planes of 8x8), uneven row padding, a multiplier
    # (the forward reads channel oc / m; its input gradient sums m planes and
    # stays on the other kernel).
    "shared_taps_7x7_eights_multiplier2": dict(kernel=(7, 7), padding=(3, 3), stride=(1, 1),
                                               dilation=(1, 1), size=(13, 24), multiplier=2),
    "shared_taps_7x7_many_planes": dict(kernel=(7, 7), padding=(3, 3), stride=(1, 1),
                                        dilation=(1, 1), size=(9, 20), batch=4, channels=16,
                                        multiplier=1),
    "shared_taps_7x7_tiny_planes": dict(kernel=(7, 7), padding=(3, 3), stride=(1, 1),
                                        dilation=(1, 1), size=(8, 8), batch=20, channels=8,
                                        multiplier=1),
    "shared_taps_7x7_uneven_rows": dict(kernel=(7, 7), padding=(1, 3), stride=(1, 1),
                                        dilation=(1, 1), size=(15, 16), batch=2),
    "shared_taps_7x7_unpadded": dict(kernel=(7, 7), padding=(0, 0), stride=(1, 1),
                                     dilation=(1, 1), size=(19, 13), batch=2),
    "shared_taps_5x5_tiles": dict(kernel=(5, 5), padding=(2, 2), stride=(1, 1), dilation=(1, 1),
                                  size=(21, 40), batch=3),
    # float16 and bfloat16 with 5 or 7 taps (3 on planes 1024 wide), "same"
    # column padding and widths of a multiple of 8, on planes that fill at
    # least half of the tiles they take, take the tensor-core CUDA kernel:
    # tiles of 64 rows and 64 or 128 columns (several along x and y, partial
    # at the edges), uneven row
    # padding, multipliers, more tiles than resident blocks (each block walks
    # several, changing channel), the input gradient (taps rotated).
    "tensor_cores_7x7_tiles": dict(kernel=(7, 7), padding=(3, 3), size=(120, 200), batch=2,
                                   channels=3, multiplier=1, **TENSOR_CORES),
    "tensor_cores_5x5_uneven_rows_multiplier2": dict(kernel=(5, 5), padding=(0, 2), size=(53, 48),
                                                     multiplier=2, **TENSOR_CORES),
    "tensor_cores_7x7_rows_padded_past_kernel": dict(kernel=(7, 7), padding=(9, 3), size=(33, 64),
                                                     batch=1, channels=2, multiplier=1,
                                                     **TENSOR_CORES),
    "tensor_cores_5x5_many_planes": dict(kernel=(5, 5), padding=(2, 2), size=(48, 48), batch=8,
                                         channels=160, multiplier=1, **TENSOR_CORES),
    "tensor_cores_3x3_wide": dict(kernel=(3, 3), padding=(1, 1), size=(35, 2056), batch=1,
                                  channels=2, multiplier=1, **TENSOR_CORES),
    # float32 7x7 on planes holding a whole 64 x 128 tile takes the staged-tile
    # CUDA kernel: several tiles each way, partial at the right (4 columns) and
    # bottom edges, uneven row padding, a multiplier (its input gradient sums m
    # planes and stays on the shared-taps kernel), the input gradient.
    "staged_tile_7x7_three_tiles_each_way": dict(kernel=(7, 7), padding=(3, 3), size=(136, 260),
                                                 batch=1, channels=2, multiplier=1,
                                                 **TENSOR_CORES),
    "staged_tile_7x7_uneven_rows_multiplier2": dict(kernel=(7, 7), padding=(1, 3), size=(70, 132),
                                                    batch=1, channels=1, multiplier=2,
                                                    **TENSOR_CORES),
    # Tall kernels (9 to 31 odd tap rows) at stride 1 take the column-streaming
    # CUDA kernel on planes of 21 rows or more (28 per warp, at least three
    # quarters used): several planes per block, several warps and tiles along x
    # and y, windows reaching past the plane, non-square and unpadded kernels,
    # multipliers (its input gradient sums several planes).
    "large_13x13_same_planes_per_block": dict(kernel=(13, 13), padding=(6, 6), stride=(1, 1),
                                              dilation=(1, 1), size=(28, 28), batch=2),
    "large_31x31_same_tiles": dict(kernel=(31, 31), padding=(15, 15), stride=(1, 1),
                                   dilation=(1, 1), size=(80, 70), batch=1, channels=2,
                                   multiplier=1),
    "large_9x5_uneven_padding": dict(kernel=(9, 5), padding=(2, 1), stride=(1, 1),
                                     dilation=(1, 1), size=(50, 45), batch=2),
    "large_11x11_multiplier2": dict(kernel=(11, 11), padding=(5, 5), stride=(1, 1),
                                    dilation=(1, 1), size=(27, 33), multiplier=2),
    "large_15x15_unpadded": dict(kernel=(15, 15), padding=(0, 0), stride=(1, 1),
                                 dilation=(1, 1), size=(40, 33), batch=2),
    "large_31x3_taller_than_plane": dict(kernel=(31, 3), padding=(15, 1), stride=(1, 1),
                                         dilation=(1, 1), size=(24, 9), batch=2),
    "large_17x17_offset": dict(kernel=(17, 17), padding=(8, 8), stride=(1, 1), dilation=(1, 1),
                               size=(26, 24), input_layout="offset", grad_layout="offset"),
}


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_depthwise_conv2d_matches_torch_on_edge_cases(device, dtype, case, rng, gen, seed):
    cfg = random_depthwise_config(rng, **EDGE_CASES[case])
    ctx = f"seed={seed} {device} {dtype} case={case} {cfg}"
    run_depthwise_case(cfg, device, dtype, gen, ctx)


@cuda
@pytest.mark.parametrize("padding,multiplier", [((3, 3), 1), ((1, 3), 1), ((3, 3), 2)],
                         ids=["same", "uneven_rows", "multiplier2"])
def test_depthwise_conv2d_float32_7x7_on_many_tiles_matches_torch(padding, multiplier, rng, gen,
                                                                  seed):
    # Enough 64 x 128 tiles (3 x 3 per 136 x 260 plane, partial at the edges)
    # for three per SM: float32 7x7 at stride 1 takes the streamed-tile CUDA
    # kernel (blocks walk many tiles, changing channel; bias; uneven row
    # padding; the input gradient with the taps rotated, and with a
    # multiplier the forward reading channel oc / m).
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    channels = -(-3 * sms // (9 * multiplier))
    cfg = random_depthwise_config(rng, kernel=(7, 7), padding=padding, size=(136, 260), batch=1,
                                  channels=channels, multiplier=multiplier, bias=True,
                                  **TENSOR_CORES)
    ctx = f"seed={seed} {cfg}"
    run_depthwise_case(cfg, "cuda", torch.float32, gen, ctx)


@pytest.mark.parametrize("need", [("x",), ("w",), ("b",), ("x", "b"), ("w", "b"), ()])
@pytest.mark.parametrize("device", DEVICES)
def test_depthwise_conv2d_gradients_only_of_inputs_that_require_grad(device, need, rng, gen, seed):
    cfg = random_depthwise_config(rng, bias=True, batch=2)
    ctx = f"seed={seed} {device} requires_grad={need} {cfg}"
    run_depthwise_case(cfg, device, torch.float64, gen, ctx, need=need)


@pytest.mark.parametrize("device", DEVICES)
def test_depthwise_backward_ops_called_directly_match_torch(device, rng, gen, seed):
    cfg = random_depthwise_config(rng, batch=2, multiplier=3, kernel=(3, 4), bias=True)
    x = make_tensor(cfg.input_shape, torch.float64, device, cfg.input_layout, gen)
    w = make_tensor(cfg.weight_shape, torch.float64, device, cfg.weight_layout, gen)
    b = make_tensor((cfg.out_channels,), torch.float64, device, gen=gen)
    go = make_tensor(cfg.output_shape, torch.float64, device, cfg.grad_layout, gen)
    stride, padding, dilation, _ = cfg.args()
    ref = conv2d_reference(cfg, x, w, b, go)
    got = {
        "grad_input": ops.depthwise_conv2d_grad_input(go, x, w, stride, padding, dilation),
        "grad_weight": ops.depthwise_conv2d_grad_weight(go, x, w, stride, padding, dilation),
        "grad_bias": ops.conv2d_grad_bias(go),
    }
    gw, gb = ops.depthwise_conv2d_grad_weight_bias(go, x, w, stride, padding, dilation)
    got.update({"grad_weight (with bias)": gw, "grad_bias (with weight)": gb})
    ref.update({"grad_weight (with bias)": ref["grad_weight"],
                "grad_bias (with weight)": ref["grad_bias"]})
    for name, g in got.items():
        torch.testing.assert_close(g.cpu(), ref[name][0], rtol=1e-10, atol=1e-10,
                                   msg=lambda m: f"seed={seed} {name} {cfg}: {m}")


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("device", DEVICES)
def test_depthwise_conv2d_accepts_schema_defaults_and_single_int_pairs(device, gen):
    x = make_tensor((2, 3, 8, 7), torch.float64, device, gen=gen)
    w = make_tensor((6, 1, 3, 2), torch.float64, device, gen=gen)
    b = make_tensor((6,), torch.float64, device, gen=gen)
    xr, wr, br = (t.cpu() for t in (x, w, b))

    def ref(*args, **kwargs):
        return F.conv2d(xr, wr, *args, groups=3, **kwargs)

    cases = [
        (ops.depthwise_conv2d(x, w), ref()),
        (ops.depthwise_conv2d(x, w, b), ref(br)),
        (ops.depthwise_conv2d(x, w, None, 2), ref(None, 2)),
        (ops.depthwise_conv2d(x, w, b, [2], [1], [2]), ref(br, 2, 1, 2)),
        (ops.depthwise_conv2d(x, w, b, padding=[1, 0]), ref(br, padding=(1, 0))),
        (ops.depthwise_conv2d(x, w, dilation=[2, 1]), ref(dilation=(2, 1))),
        (customconv.depthwise_conv2d(x, w, b, padding="same", dilation=(2, 1)),
         ref(br, padding="same", dilation=(2, 1))),
        (customconv.depthwise_conv2d(x, w, b, 2, "valid"), ref(br, 2, "valid")),
        (customconv.depthwise_conv2d(x, w, b, (1, 2), (0, 1), 2), ref(br, (1, 2), (0, 1), 2)),
        (customconv.depthwise_conv2d(x, w, b, 1, 2), ref(br, 1, 2)),
    ]
    for i, (got, want) in enumerate(cases):
        assert got.shape == want.shape, f"case {i}: {tuple(got.shape)} vs {tuple(want.shape)}"
        torch.testing.assert_close(got.cpu(), want, rtol=1e-12, atol=1e-12, msg=f"case {i}")


@pytest.mark.parametrize("device", DEVICES)
def test_depthwise_conv2d_under_inference_mode_and_no_grad_matches_torch(device, gen):
    x = make_tensor((3, 4, 6, 6), torch.float64, device, "channels_last", gen, True)
    w = make_tensor((8, 1, 3, 3), torch.float64, device, gen=gen, requires_grad=True)
    want = F.conv2d(x.detach().cpu(), w.detach().cpu(), None, 1, 1, 1, 4)
    check_under_no_grad_and_inference_mode(
        lambda: ops.depthwise_conv2d(x, w, None, [1, 1], [1, 1], [1, 1]), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("device", DEVICES)
def test_depthwise_conv2d_gradients_are_deterministic(device, dtype, gen):
    if dtype == torch.float16 and device == "cpu":
        dtype = torch.bfloat16
    # Large enough for many CUDA blocks per output channel and many channels.
    x = make_tensor((4, 16, 40, 36), dtype, device, gen=gen, requires_grad=True)
    w = make_tensor((32, 1, 5, 3), dtype, device, gen=gen, requires_grad=True)
    b = make_tensor((32,), dtype, device, gen=gen, requires_grad=True)
    g = make_tensor((4, 32, 20, 36), dtype, device, gen=gen)

    def grads():
        out = ops.depthwise_conv2d(x, w, b, [2, 1], [2, 1], [1, 1])
        return (out,) + torch.autograd.grad(out, (x, w, b), g)

    assert_deterministic(grads, f"depthwise_conv2d on {device} in {dtype}")


# ---------------------------------------------------------------- customconv.nn.DepthwiseConv2d

# Constructor arguments (in_channels, out_channels, kernel_size, **kwargs) and an input size.
MODULE_CASES = {
    "defaults": ((3, 3, 3), {}, (9, 8)),
    "multiplier2_padding": ((4, 8, 3), dict(padding=1), (7, 7)),
    "multiplier4_tuple_args": ((2, 8, (3, 2)), dict(stride=(2, 1), padding=(1, 0),
                                                   dilation=(1, 2)), (9, 10)),
    "groups_given": ((3, 6, 3), dict(groups=3, padding=2), (6, 5)),
    "no_bias": ((3, 9, 2), dict(bias=False), (6, 5)),
    "large_kernel": ((2, 4, (15, 9)), dict(padding=(7, 4)), (12, 10)),
    "padding_valid": ((3, 6, (2, 3)), dict(padding="valid"), (6, 7)),
    "padding_same": ((3, 6, 3), dict(padding="same"), (6, 7)),
    "padding_same_even_dilated": ((2, 4, (4, 2)), dict(padding="same", dilation=(2, 3)), (8, 9)),
    "reflect": ((3, 6, 3), dict(padding=1, padding_mode="reflect"), (6, 7)),
    "replicate": ((3, 3, 3), dict(padding=(2, 1), padding_mode="replicate", stride=2), (6, 7)),
    "circular": ((3, 6, 3), dict(padding=(1, 2), padding_mode="circular"), (6, 7)),
    "same_reflect": ((3, 3, (3, 5)), dict(padding="same", padding_mode="reflect"), (6, 7)),
    "same_circular": ((2, 6, 3), dict(padding="same", padding_mode="circular", dilation=2,
                                       bias=False), (7, 7)),
}


def module_pair(case, device, dtype=torch.float64):
    args, kwargs, _ = MODULE_CASES[case]
    theirs_kwargs = dict(kwargs, groups=args[0])
    theirs = torch.nn.Conv2d(*args, **theirs_kwargs).to(device, dtype)
    ours = customconv.nn.DepthwiseConv2d(*args, **kwargs).to(device, dtype)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs



@pytest.mark.parametrize("case", sorted(MODULE_CASES))
def test_nn_depthwise_conv2d_has_the_parameters_and_state_dict_of_torch_nn_conv2d(case):
    args, kwargs, _ = MODULE_CASES[case]
    theirs = torch.nn.Conv2d(*args, **dict(kwargs, groups=args[0]))
    ours = customconv.nn.DepthwiseConv2d(*args, **kwargs)
    assert ours.groups == args[0]
    check_drop_in_state_dict(ours, theirs, lambda: customconv.nn.DepthwiseConv2d(*args, **kwargs))


@pytest.mark.parametrize("case", sorted(MODULE_CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_nn_depthwise_conv2d_outputs_and_gradients_match_torch_nn_conv2d(device, case, gen, seed):
    ours, theirs = module_pair(case, device)
    check_drop_in_matches(ours, theirs, MODULE_CASES[case][2], device, gen,
                          f"seed={seed} case={case} device={device}")


@pytest.mark.parametrize("case", ["multiplier4_tuple_args", "reflect", "same_circular"])
@pytest.mark.parametrize("device", DEVICES)
def test_nn_depthwise_conv2d_in_float32_matches_torch_nn_conv2d_in_float64(device, case, gen, seed):
    ours, theirs = module_pair(case, device, torch.float32)
    theirs = theirs.double()
    check_float32_drop_in_matches_float64(ours, theirs, MODULE_CASES[case][2], device, gen, seed)


@pytest.mark.parametrize("device", DEVICES)
def test_nn_depthwise_conv2d_accepts_unbatched_input_like_torch_nn_conv2d(device, gen):
    ours, theirs = module_pair("replicate", device)
    x = make_tensor((3, 6, 7), torch.float64, device, gen=gen)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-10, atol=1e-10)


def test_nn_depthwise_conv2d_refuses_what_is_not_depthwise():
    with pytest.raises(ValueError, match=r"DepthwiseConv2d: groups must equal in_channels \(3\)"):
        customconv.nn.DepthwiseConv2d(3, 6, 3, groups=1)
    with pytest.raises(ValueError, match=r"out_channels \(5\) must be a multiple of in_channels \(3\)"):
        customconv.nn.DepthwiseConv2d(3, 5, 3)
    # ... and what torch.nn.Conv2d refuses.
    with pytest.raises(ValueError, match="padding='same'"):
        customconv.nn.DepthwiseConv2d(3, 3, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="padding_mode"):
        customconv.nn.DepthwiseConv2d(3, 3, 3, padding_mode="mirror")


@pytest.mark.parametrize("device", DEVICES)
def test_nn_depthwise_conv2d_trains_like_torch_nn_conv2d(device, gen):
    ours, theirs = module_pair("multiplier2_padding", device)
    check_trains_alike(ours, theirs, (4, 4, 7, 6), (4, 8, 7, 6), device, gen)


@cuda
def test_depthwise_conv2d_captures_into_a_cuda_graph_and_replays_with_new_inputs(gen):
    dt = torch.float64
    x = make_tensor((2, 3, 9, 8), dt, "cuda", gen=gen)
    w = make_tensor((6, 1, 3, 2), dt, "cuda", gen=gen)
    b = make_tensor((6,), dt, "cuda", gen=gen)
    go = make_tensor((2, 6, 5, 6), dt, "cuda", gen=gen)
    args = ([2, 1], [1, 0], [1, 2])

    def step():
        return (ops.depthwise_conv2d(x, w, b, *args),
                ops.depthwise_conv2d_grad_input(go, x, w, *args),
                ops.depthwise_conv2d_grad_weight(go, x, w, *args))

    results, _graph = capture_and_replay(step, (x, go), gen)
    xr, wr, br = (t.cpu().requires_grad_() for t in (x, w, b))
    ref = F.conv2d(xr, wr, br, (2, 1), (1, 0), (1, 2), 3)
    gx, gw = torch.autograd.grad(ref, (xr, wr), go.cpu())
    for i, (got, want) in enumerate(zip(results, (ref.detach(), gx, gw))):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10,
                                   msg=lambda m: f"result {i}: {m}")
