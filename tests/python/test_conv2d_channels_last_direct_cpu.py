"""conv2d's direct CPU forward over 16 or more input channels
(ops/conv2d/channels_last_direct_cpu.h): float32 layers with groups 1, windows
larger than 1x1 and 1x1 ones on channels_last input, against F.conv2d in float64 on random geometries (odd
sizes, padding, stride, dilation, bias or none, output channels that fill no
whole vector, every input layout) and on ResNet-50's 3x3 layer shapes;
F.conv2d's memory format; the same result with one thread and with two;
layers it declines keep the other routes. The stride-1 input gradient runs
through the same kernel (the forward of grad_output with the rotated
weight), so the backward is checked too."""

import random

import pytest
import torch
import torch.nn.functional as F

from testlib import (ConvConfig, check_conv_case, check_cpu_float32_case, conv2d_call, make_tensor, ops,
                     per_thread_count, random_direct_cpu_config)


def direct_config(rng: random.Random, **fixed) -> ConvConfig:
    kernel = rng.choice([(3, 3), (3, 3), (2, 2), (5, 5), (1, 3), (3, 1), (4, 2)])
    stride = (rng.choice([1, 1, 2]), rng.choice([1, 1, 2, 3]))
    dilation = (rng.choice([1, 1, 2]), rng.choice([1, 1, 2]))
    padding = tuple(rng.randint(0, (k - 1) * d + 1) for k, d in zip(kernel, dilation))
    size = tuple(max(1, (k - 1) * d + 1 - 2 * p) + rng.randint(0, 11)
                 for k, d, p in zip(kernel, dilation, padding))
    window = dict(kernel=kernel, stride=stride, dilation=dilation, padding=padding, size=size,
                  in_channels=rng.choice([16, 17, 24, 32, 40, 64]), out_channels=rng.choice([1, 8, 16, 20, 48, 64, 70, 130]))
    return random_direct_cpu_config(rng, window, **fixed)


@pytest.mark.parametrize("idx", range(40))
def test_channels_last_direct_cpu_matches_torch_on_random_configs(idx, rng, gen, seed):
    cfg = direct_config(rng)
    check_cpu_float32_case(cfg, gen, f"seed={seed} {cfg}")


# ResNet-50's 3x3 layers (C, H, K, stride) on smaller planes.
RESNET_3X3 = [(64, 15, 64, 1), (128, 17, 128, 2), (128, 9, 128, 1), (256, 9, 256, 2),
              (256, 7, 256, 1), (512, 7, 512, 2), (512, 5, 512, 1)]


@pytest.mark.parametrize("layer", RESNET_3X3, ids=[f"c{c}-h{h}-s{s}" for c, h, _, s in RESNET_3X3])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_channels_last_direct_cpu_matches_torch_on_resnet_layers(layer, layout, gen, seed):
    c, h, k, s = layer
    cfg = ConvConfig(batch=2, in_channels=c, out_channels=k, groups=1, kernel=(3, 3),
                     stride=(s, s), padding=(1, 1), dilation=(1, 1), size=(h, h), bias=True,
                     input_layout=layout, weight_layout=layout, grad_layout=layout)
    out = check_conv_case(conv2d_call(cfg), cfg, "cpu", torch.float32, gen, f"seed={seed} {cfg}")
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    assert out.is_contiguous(memory_format=fmt)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_channels_last_direct_cpu_forward_does_not_depend_on_the_thread_count(batch, layout, gen):
    x = make_tensor((batch, 48, 23, 21), torch.float32, "cpu", layout, gen)
    w = make_tensor((136, 48, 3, 3), torch.float32, "cpu", layout, gen)
    b = make_tensor((136,), torch.float32, "cpu", "contiguous", gen)
    saved = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(ops.conv2d(x, w, b, [1, 2], [1, 1], [1, 1], 1))
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(outs[0], outs[1])
    want = F.conv2d(x.double(), w.double(), b.double(), (1, 2), 1)
    torch.testing.assert_close(outs[0].double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_channels_last_direct_cpu_positions_whose_windows_lie_in_the_padding_get_the_bias(gen):
    x = make_tensor((2, 32, 3, 4), torch.float32, "cpu", "channels_last", gen)
    w = make_tensor((24, 32, 2, 2), torch.float32, "cpu", "channels_last", gen)
    b = make_tensor((24,), torch.float32, "cpu", "contiguous", gen)
    got = ops.conv2d(x, w, b, [1, 1], [3, 2], [1, 1], 1)
    want = F.conv2d(x.double(), w.double(), b.double(), 1, (3, 2))
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    torch.testing.assert_close(got[:, :, 0, 0].double(), b.double().expand(2, 24), rtol=0, atol=0)


@pytest.mark.parametrize("case", ["float64", "bfloat16", "grouped", "unbatched", "pointwise-nchw",
                                  "1x1-strided-nchw"])
def test_channels_last_direct_cpu_cases_it_declines_keep_the_other_routes(case, rng, gen, seed):
    fixed = {"float64": {}, "bfloat16": {},
             "grouped": dict(in_channels=32, out_channels=16, groups=2),
             "unbatched": dict(batch=None),
             "pointwise-nchw": dict(kernel=(1, 1), stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                                    input_layout="contiguous", weight_layout="contiguous"),
             "1x1-strided-nchw": dict(kernel=(1, 1), stride=(2, 2), padding=(0, 0),
                                      input_layout="contiguous", weight_layout="contiguous")}[case]
    cfg = direct_config(rng, **fixed)
    dtype = {"float64": torch.float64, "bfloat16": torch.bfloat16}.get(case, torch.float32)
    check_conv_case(conv2d_call(cfg), cfg, "cpu", dtype, gen, f"seed={seed} {case} {cfg}")


@pytest.mark.parametrize("idx", range(8))
def test_channels_last_direct_cpu_matches_torch_on_1x1_windows(idx, rng, gen, seed):
    # Taken on channels_last input only (ResNet's 1x1 layers: pointwise, and
    # the stride-2 projections), ahead of the pointwise GEMM.
    cfg = direct_config(rng, kernel=(1, 1), dilation=(1, 1), input_layout="channels_last",
                        stride=rng.choice([(1, 1), (2, 2), (1, 2), (3, 3)]),
                        padding=rng.choice([(0, 0), (0, 0), (1, 0)]))
    out = check_conv_case(conv2d_call(cfg), cfg, "cpu", torch.float32, gen, f"seed={seed} {cfg}")
    assert out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("channels", [(64, 64), (64, 192), (128, 64)], ids=lambda c: f"{c[0]}to{c[1]}")
@pytest.mark.parametrize("batch", [1, 3])
def test_channels_last_direct_cpu_matches_torch_on_pointwise_layers(channels, batch, gen, seed):
    # Whole 64-channel blocks on both sides: the direct kernel's pointwise
    # route, which walks the input's rows without dividing positions into
    # (n, y, x); odd planes leave partial blocks of positions.
    c, k = channels
    cfg = ConvConfig(batch=batch, in_channels=c, out_channels=k, groups=1, kernel=(1, 1), stride=(1, 1),
                     padding=(0, 0), dilation=(1, 1), size=(13, 7), bias=True, input_layout="channels_last",
                     weight_layout="contiguous", grad_layout="channels_last")
    out = check_conv_case(conv2d_call(cfg), cfg, "cpu", torch.float32, gen, f"seed={seed} {cfg}")
    assert out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("channels", [(16, 96), (24, 144), (32, 16), (96, 24), (144, 32), (160, 960),
                                      (240, 40), (24, 20)],
                         ids=lambda c: f"{c[0]}to{c[1]}")
@pytest.mark.parametrize("fused", ["plain", "relu6", "residual-relu6"])
def test_cpu_pointwise_layers_of_mobilenet_channel_counts_match_torch(channels, fused, gen, seed):
    # MobileNetV2's (and EfficientNet-B0's 40) 1x1 layers: channels that fill
    # no whole 64-channel block. A multiple of 8 output channels goes to the
    # direct kernel (its fused epilogue included), 20 to the GEMM and the
    # epilogue's pass; both match.
    c, k = channels
    x = make_tensor((3, c, 11, 9), torch.float32, "cpu", "channels_last", gen)
    w = make_tensor((k, c, 1, 1), torch.float32, "cpu", "channels_last", gen)
    b = make_tensor((k,), torch.float32, "cpu", gen=gen)
    want = F.conv2d(x.double(), w.double(), b.double())
    one, zero = [1, 1], [0, 0]
    if fused == "plain":
        got = per_thread_count(lambda: ops.conv2d(x, w, b, one, zero, one, 1))
    else:
        r = make_tensor(tuple(want.shape), torch.float32, "cpu", "channels_last", gen) if "residual" in fused else None
        got = per_thread_count(lambda: ops.conv2d_fused(x, w, b, one, zero, one, 1, "relu6", r))
        want = (want + (r.double() if r is not None else 0)).clamp(0, 6)
    for g in got:
        assert g.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(g.double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()),
                                   msg=lambda m: f"seed={seed} {m}")
    if k % 8 == 0:  # the direct kernel sums in the same order on any thread count
        assert torch.equal(got[0], got[1])


@pytest.mark.parametrize("case", ["pointwise", "pointwise-residual-relu", "3x3"])
def test_channels_last_direct_cpu_outputs_stored_past_the_caches(case, gen, seed):
    # Outputs of 8 MiB or more are stored with non-temporal stores in the
    # AVX-512 build (kStreamedOutputBytes): the same values as F.conv2d, with
    # and without the fused epilogue.
    k = 3 if case == "3x3" else 1
    x = make_tensor((2, 64, 64, 64), torch.float32, "cpu", "channels_last", gen)
    w = make_tensor((256, 64, k, k), torch.float32, "cpu", "channels_last", gen)
    b = make_tensor((256,), torch.float32, "cpu", gen=gen)
    want = F.conv2d(x.double(), w.double(), b.double(), 1, k // 2)
    if case == "pointwise-residual-relu":
        r = make_tensor(tuple(want.shape), torch.float32, "cpu", "channels_last", gen)
        got = ops.conv2d_fused(x, w, b, [1, 1], [k // 2] * 2, [1, 1], 1, "relu", r)
        want = torch.relu(want + r.double())
    else:
        got = ops.conv2d(x, w, b, [1, 1], [k // 2] * 2, [1, 1], 1)
    assert got.numel() * 4 >= 8 << 20
    assert got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4 * float(want.abs().max()),
                               msg=lambda m: f"seed={seed} {m}")


def test_channels_last_direct_cpu_empty_batch(rng, gen, seed):
    cfg = direct_config(rng, batch=0)
    out = check_conv_case(conv2d_call(cfg), cfg, "cpu", torch.float32, gen, f"seed={seed} {cfg}")
    assert out.shape == cfg.output_shape


def weight_gradient_config(rng: random.Random) -> ConvConfig:
    """Ungrouped layers with a multiple of 16 output channels (16, 32, 48, 64:
    one and two 16-lane vectors an item), input channels that fill no whole
    block of 8 or 16 (remainders of 1 to 4 channels, an RGB stem's 3), and
    planes large enough for several chunks of output rows (over 512
    positions) or one."""
    kernel = rng.choice([(3, 3), (1, 1), (5, 3), (2, 2)])
    stride = (rng.choice([1, 2]), rng.choice([1, 2]))
    dilation = (rng.choice([1, 1, 2]), 1)
    padding = tuple(rng.randint(0, (k - 1) * d) for k, d in zip(kernel, dilation))
    size = (rng.randint(8, 40), rng.randint(8, 40))
    window = dict(kernel=kernel, stride=stride, dilation=dilation, padding=padding, size=size,
                  in_channels=rng.choice([3, 16, 17, 18, 19, 20, 32, 36, 64]),
                  out_channels=rng.choice([16, 32, 48, 64]))
    return random_direct_cpu_config(rng, window)


@pytest.mark.parametrize("idx", range(16))
def test_cpu_weight_gradient_of_ungrouped_layers_matches_torch(idx, rng, gen, seed):
    # On AVX-512 machines the direct 16-lane weight gradient (grouped_direct_cpu.h).
    cfg = weight_gradient_config(rng)
    check_cpu_float32_case(cfg, gen, f"seed={seed} {cfg}")


@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
@pytest.mark.parametrize("window", [(7, 2, 3), (3, 2, 1), (5, 1, 2)], ids=["7x7-s2", "3x3-s2", "5x5-s1"])
def test_cpu_weight_gradient_of_rgb_stems_matches_torch(window, layout, gen, seed):
    # 3 input channels: one pass over grad_output for all three, per tap.
    ks, stride, pad = window
    x = make_tensor((2, 3, 45, 38), torch.float32, "cpu", layout, gen)
    w = make_tensor((32, 3, ks, ks), torch.float32, "cpu", layout, gen)
    oh, ow = ((size + 2 * pad - ks) // stride + 1 for size in (45, 38))
    go = make_tensor((2, 32, oh, ow), torch.float32, "cpu", layout, gen)
    args = ([stride, stride], [pad, pad], [1, 1], 1)
    got = ops.conv2d_grad_weight(go, x, w, *args)
    want = torch.ops.aten.convolution_backward(go.double(), x.double(), w.double(), None, *args[:3], False,
                                               [0, 0], 1, [False, True, False])[1]
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item(),
                               msg=lambda m: f"seed={seed} {window} {layout}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16],
                         ids=["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("weight_layout", ["channels_last", "contiguous"])
def test_cpu_stride_1_input_gradient_with_the_rotated_weight_matches_torch(dtype, weight_layout, gen, seed):
    # Channels_last stride-1 input gradients of ungrouped layers: the forward of
    # grad_output with the weight rotated by one blocked transpose per tap
    # (rotated_weight.h); channel counts off the 32-wide blocks, a 3x5 window.
    x = make_tensor((2, 37, 11, 9), dtype, "cpu", "channels_last", gen)
    w = make_tensor((45, 37, 3, 5), dtype, "cpu", weight_layout, gen)
    go = make_tensor((2, 45, 11, 9), dtype, "cpu", "channels_last", gen)
    args = ([1, 1], [1, 2], [1, 1], 1)
    got = ops.conv2d_grad_input(go, x, w, *args)
    assert got.dtype == dtype and got.is_contiguous(memory_format=torch.channels_last)
    want = torch.ops.aten.convolution_backward(go.double(), x.double(), w.double(), None, *args[:3], False,
                                               [0, 0], 1, [True, False, False])[0]
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 1e-2, torch.bfloat16: 4e-2}[dtype]
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * want.abs().max().item(),
                               msg=lambda m: f"seed={seed} {dtype} {weight_layout}: {m}")


def test_cpu_weight_gradient_does_not_depend_on_the_thread_count(gen):
    x = make_tensor((3, 36, 29, 23), torch.float32, "cpu", "channels_last", gen)
    w = make_tensor((48, 36, 3, 3), torch.float32, "cpu", "channels_last", gen)
    go = make_tensor((3, 48, 29, 23), torch.float32, "cpu", "channels_last", gen)
    args = ([1, 1], [1, 1], [1, 1], 1)
    grads = per_thread_count(lambda: ops.conv2d_grad_weight(go, x, w, *args))
    assert torch.equal(grads[0], grads[1])
    want = torch.ops.aten.convolution_backward(go.double(), x.double(), w.double(), None, [1, 1], [1, 1],
                                               [1, 1], False, [0, 0], 1, [False, True, False])[1]
    torch.testing.assert_close(grads[0].double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("out_channels", [32, 24], ids=["direct", "gemm"])
def test_cpu_pointwise_weight_gradient_on_large_planes_matches_torch(out_channels, gen, seed):
    # 2048 or more positions: the direct kernel where it takes the layer (a
    # multiple of 16 output channels, AVX-512), else the GEMM.
    cfg = ConvConfig(batch=3, in_channels=40, out_channels=out_channels, groups=1, kernel=(1, 1),
                     stride=(1, 1), padding=(0, 0), dilation=(1, 1), size=(30, 31), bias=True,
                     input_layout="channels_last", weight_layout="channels_last", grad_layout="channels_last")
    check_cpu_float32_case(cfg, gen, f"seed={seed} {cfg}")


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("weight_layout", ["contiguous", "channels_last", "transposed"])
def test_cpu_pointwise_input_gradient_through_the_direct_kernel_matches_torch(layout, weight_layout, gen, seed):
    # 64-channel multiples both ways: the input gradient is the direct forward
    # kernel's forward of grad_output with the transposed weight.
    cfg = ConvConfig(batch=2, in_channels=64, out_channels=128, groups=1, kernel=(1, 1), stride=(1, 1),
                     padding=(0, 0), dilation=(1, 1), size=(9, 13), bias=False, input_layout=layout,
                     weight_layout=weight_layout, grad_layout=layout)
    check_cpu_float32_case(cfg, gen, f"seed={seed} {cfg}")
