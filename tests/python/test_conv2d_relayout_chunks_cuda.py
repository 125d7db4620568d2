"""NCHW operands of conv2d's engines on CUDA that read channels_last
(implicit_gemm.cpp; grouped_mma.h's forward and gradients; the grouped
direct weight gradient) go to channels_last in chunks of images whose copies
stay within the workspace limit (CUSTOMCONV_WORKSPACE_MB, image_chunks.h):
the forward and the input gradient write each chunk's result into the
output's images, and the weight gradient sums every chunk's float32 part in
order and rounds once (1x1 windows go to the column route instead).
Each case runs in a process with a small limit, so that the batch splits, and
matches float64 F.conv2d in every pass (the fused forward too); the weight
gradient of the larger windows runs no im2col and repeats bit for bit. A
second process checks that a large layer's extra memory stays near the limit
in every pass, and a third that forwards with the default limits stay
within 64 MiB."""

import os
import subprocess
import sys
import textwrap

import pytest

from testlib import cuda

pytestmark = cuda

HERE = os.path.dirname(os.path.abspath(__file__))

MATCH_SCRIPT = textwrap.dedent(
    """
    import sys, torch, torch.nn.functional as F
    sys.path.insert(0, sys.argv[1])
    from testlib import ConvConfig, check_conv_case, kernels_launched, make_tensor, ops
    torch.backends.cudnn.allow_tf32 = True  # float32 through the engine (TF32)
    gen = torch.Generator().manual_seed(int(sys.argv[2]))
    # (batch, C, K, groups, kernel, stride, padding, plane, weight layout): a
    # 3x3 layer, a strided 1x1 layer, an RGB stem (packed by space-to-depth),
    # a channels_last weight (a channels_last result from an NCHW input), and
    # grouped layers of 8, 4 and 16 channels a group (the grouped tensor-core
    # forward; the grouped direct weight gradient in float32, the tensor-core
    # gradients in 16-bit with 16 channels a group; a strided layer of 512
    # channels, whose input gradient goes by stride phases on sm_90). With a
    # 1 MiB limit each chunk holds 1 to 3 images.
    cases = [(5, 64, 64, 1, (3, 3), (1, 1), (1, 1), (24, 24), "contiguous"),
             (5, 64, 128, 1, (1, 1), (2, 2), (0, 0), (32, 32), "contiguous"),
             (5, 3, 64, 1, (7, 7), (2, 2), (3, 3), (64, 64), "contiguous"),
             (4, 32, 48, 1, (3, 3), (1, 1), (1, 1), (28, 28), "channels_last"),
             (5, 64, 64, 8, (3, 3), (1, 1), (1, 1), (24, 24), "contiguous"),
             (5, 128, 128, 32, (3, 3), (2, 2), (1, 1), (24, 24), "contiguous"),
             (5, 128, 128, 8, (3, 3), (1, 1), (1, 1), (20, 20), "contiguous"),
             (3, 512, 512, 32, (3, 3), (2, 2), (1, 1), (14, 14), "contiguous"),
             (3, 64, 64, 1, (3, 3), (1, 1), (1, 1), (56, 56), "contiguous")]
    # The last case's weight gradient runs the dense 3x3 tensor-core kernel
    # (dense_mma.h) in every dtype, float32 included (over 6272 positions),
    # a chunk of one image at a time.
    dense_case = (64, 64, (3, 3), (56, 56))
    def close_in_norm(got, want, rel, what):
        err = float((got.double() - want).norm() / want.norm())
        assert err <= rel, f"{ctx} {what}: relative error {err:.3g} in the 2-norm"

    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        rel = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2, torch.float32: 2e-3}[dtype]
        for n, c, k, groups, ks, st, pad, plane, wl in cases:
            cfg = ConvConfig(n, c, k, groups, ks, st, pad, (1, 1), plane, True, weight_layout=wl)
            ctx = f"seed={sys.argv[2]} {dtype} {cfg}"
            if dtype != torch.float32:  # (float32 runs the engine with TF32: checked in norm below)
                call = lambda input, weight, bias: ops.conv2d(input, weight, bias, *cfg.args())
                check_conv_case(call, cfg, "cuda", dtype, gen, ctx)
            x = make_tensor(cfg.input_shape, dtype, "cuda", gen=gen, requires_grad=True)
            w = make_tensor(cfg.weight_shape, dtype, "cuda", cfg.weight_layout, gen, True)
            g = make_tensor(cfg.output_shape, dtype, "cuda", gen=gen)
            out = ops.conv2d(x, w, None, *cfg.args())
            gi, gw = torch.autograd.grad(out, (x, w), g)
            x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
            want = F.conv2d(x64, w64, None, st, pad, 1, groups)
            want_gi, want_gw = torch.autograd.grad(want, (x64, w64), g.double())
            for what, got, ref in (("output", out, want), ("grad_input", gi, want_gi),
                                   ("grad_weight", gw, want_gw)):
                close_in_norm(got, ref, rel, what)
            # The weight gradient stays on the engine (the column route would
            # run im2col), but for 1x1 windows, which the column route takes
            # where their layout change would be split.
            if ks != (1, 1):
                names = kernels_launched(
                    lambda: ops.conv2d_grad_weight(g, x.detach(), w.detach(), *cfg.args()))
                assert "im2col" not in names, f"{ctx}: the column route ran: {names}"
                if (c, k, ks, plane) == dense_case:
                    assert "dense_mma_grad_weight" in names, f"{ctx}: {names}"
            first = ops.conv2d_grad_weight(g, x.detach(), w.detach(), *cfg.args())
            again = ops.conv2d_grad_weight(g, x.detach(), w.detach(), *cfg.args())
            assert torch.equal(first, again), ctx
            # The fused forward's residual is chunked with the input.
            r = make_tensor(cfg.output_shape, dtype, "cuda", gen=gen)
            got = ops.conv2d_fused(x.detach(), w.detach(), None, *cfg.args(), "relu", r)
            close_in_norm(got, torch.relu(want.detach() + r.double()), rel, "fused")
    print("ok")
    """
)

MEMORY_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    sys.path.insert(0, sys.argv[1])
    from testlib import cuda_extra_bytes, make_tensor, ops
    torch.backends.cudnn.allow_tf32 = True
    gen = torch.Generator().manual_seed(int(sys.argv[2]))
    limit = int(sys.argv[3]) << 20
    # NCHW input and output of 1.6 MiB an image (3.2 MiB for the grouped
    # layer, 1.6 in float16): 26 and 51 MiB in one piece at N=16.
    x = make_tensor((16, 64, 56, 56), torch.float32, "cuda", gen=gen)
    w = make_tensor((64, 64, 3, 3), torch.float32, "cuda", gen=gen)
    g = make_tensor((16, 64, 56, 56), torch.float32, "cuda", gen=gen)
    args = ([1, 1], [1, 1], [1, 1], 1)
    xg = make_tensor((16, 128, 56, 56), torch.float32, "cuda", gen=gen)
    wg = make_tensor((128, 4, 3, 3), torch.float32, "cuda", gen=gen)
    gg = make_tensor((16, 128, 56, 56), torch.float32, "cuda", gen=gen)
    grouped = ([1, 1], [1, 1], [1, 1], 32)
    xh, gh = xg.half(), gg.half()
    wh = make_tensor((128, 16, 3, 3), torch.float16, "cuda", gen=gen)
    grouped16 = ([1, 1], [1, 1], [1, 1], 8)
    passes = {"forward": lambda: ops.conv2d(x, w, None, *args),
              "grouped forward": lambda: ops.conv2d(xg, wg, None, *grouped),
              "grad_input": lambda: ops.conv2d_grad_input(g, x, w, *args),
              "grad_weight": lambda: ops.conv2d_grad_weight(g, x, w, *args),
              "grouped grad_input": lambda: ops.conv2d_grad_input(gg, xg, wg, *grouped),
              "grouped grad_weight": lambda: ops.conv2d_grad_weight(gg, xg, wg, *grouped),
              "float16 grouped grad_input": lambda: ops.conv2d_grad_input(gh, xh, wh, *grouped16),
              "float16 grouped grad_weight": lambda: ops.conv2d_grad_weight(gh, xh, wh, *grouped16)}
    for name, fn in passes.items():
        _, extra = cuda_extra_bytes(fn)
        assert extra <= limit + (2 << 20), (
            f"{name}: {extra / 2**20:.1f} MiB beyond a {limit >> 20} MiB limit")
    print("ok")
    """
)


DEFAULT_LIMIT_SCRIPT = textwrap.dedent(
    """
    import sys, torch, torch.nn.functional as F
    sys.path.insert(0, sys.argv[1])
    from testlib import cuda_extra_bytes, make_tensor, ops
    torch.backends.cudnn.allow_tf32 = True
    gen = torch.Generator().manual_seed(int(sys.argv[2]))
    # Forwards at N=32 whose NCHW copies take 49 to 128 MiB in one piece: with
    # the default limits a forward's copies may fill the 64 MiB bound on a
    # call's extra memory (ResNeXt-50's grouped layers in float32 and float16,
    # a strided one, and ResNet-50's RGB stem).
    cases = [((32, 128, 56, 56), (128, 4, 3, 3), 1, 1, 32, torch.float32),
             ((32, 256, 56, 56), (256, 8, 3, 3), 2, 1, 32, torch.float32),
             ((32, 128, 56, 56), (128, 4, 3, 3), 1, 1, 32, torch.float16),
             ((32, 3, 224, 224), (64, 3, 7, 7), 2, 3, 1, torch.float32)]
    for xs, ws, st, pad, groups, dtype in cases:
        x = make_tensor(xs, dtype, "cuda", gen=gen)
        w = make_tensor(ws, dtype, "cuda", gen=gen)
        out, extra = cuda_extra_bytes(
            lambda: ops.conv2d(x, w, None, [st, st], [pad, pad], [1, 1], groups))
        assert extra <= 64 << 20, f"{xs} {dtype}: {extra / 2**20:.1f} MiB beyond 64 MiB"
        assert out.is_contiguous()
        ref = F.conv2d(x.double(), w.double(), None, st, pad, 1, groups)
        err = (out.double() - ref).abs().max().item() / ref.abs().max().item()
        assert err < (1e-2 if dtype == torch.float16 else 5e-3), f"{xs} {dtype}: error {err}"
    print("ok")
    """
)


def run(script, limit_mib, *args):
    env = dict(os.environ)
    env.pop("CUSTOMCONV_WORKSPACE_MB", None)
    if limit_mib is not None:
        env["CUSTOMCONV_WORKSPACE_MB"] = str(limit_mib)
    proc = subprocess.run([sys.executable, "-c", script, HERE, *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "ok" in proc.stdout, (
        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}")


def test_chunked_layout_changes_match_float64_and_repeat_bitwise(seed):
    run(MATCH_SCRIPT, 1, seed)


def test_chunked_layout_changes_keep_extra_memory_near_the_limit(seed):
    run(MEMORY_SCRIPT, 8, seed, 8)


def test_forward_layout_changes_keep_extra_memory_within_64_mib_by_default(seed):
    run(DEFAULT_LIMIT_SCRIPT, None, seed)
