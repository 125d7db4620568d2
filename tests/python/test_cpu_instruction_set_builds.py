"""The CPU kernels built once per instruction set (ops/common/cpu_simd.h:
x86-64-v4, x86-64-v3 and the baseline, one picked per process) all match
F.conv2d: each build is forced with CUSTOMCONV_CPU_ISA in a subprocess (the
choice is made once per process) and runs conv2d's direct float32 forward
kernels (few input channels, 16 or more; output channels that fill no whole
vector; NCHW and channels_last), the grouped forward and weight gradient of
16 and 32 channels a group, an ungrouped weight gradient, tiny layers' gradients and 1x1
forwards over few channels, and depthwise_conv2d's float32 forward."""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys, torch, torch.nn.functional as F
    import customconv
    torch.set_num_threads(2)
    torch.manual_seed(int(sys.argv[1]))
    ops = torch.ops.customconv
    # (N, C, H, W, K, kernel, stride, padding, dilation)
    for n, c, h, w, k, ks, s, p, d in [(2, 3, 29, 31, 64, 7, 2, 3, 1), (1, 5, 12, 9, 21, 3, 1, 2, 2),
                                       (2, 32, 11, 13, 72, 3, 1, 1, 1), (3, 24, 9, 8, 40, 3, 2, 1, 1),
                                       (2, 16, 7, 7, 136, 1, 1, 0, 1), (2, 3, 9, 9, 5, 2, 1, 0, 1)]:
        for fmt in (torch.contiguous_format, torch.channels_last):
            x = torch.randn(n, c, h, w).contiguous(memory_format=fmt)
            wt = torch.randn(k, c, ks, ks).contiguous(memory_format=fmt)
            b = torch.randn(k)
            got = ops.conv2d(x, wt, b, [s, s], [p, p], [d, d], 1)
            want = F.conv2d(x.double(), wt.double(), b.double(), s, p, d)
            torch.testing.assert_close(got.double(), want, rtol=1e-5,
                                       atol=1e-5 * want.abs().max().item(),
                                       msg=lambda m: f"conv2d {(n, c, h, w, k, ks, s, p, d)} {fmt}: {m}")
    # Grouped layers of 16 and 32 channels a group (16-lane kernels on x86-64-v4),
    # the forward and the weight gradient; and an ungrouped layer's weight gradient.
    for c, groups, s in [(128, 8, 1), (256, 8, 2), (48, 1, 1)]:
        x = torch.randn(2, c, 9, 11).contiguous(memory_format=torch.channels_last)
        wt = torch.randn(c, c // groups, 3, 3)
        got = ops.conv2d(x, wt, None, [s, s], [1, 1], [1, 1], groups)
        want = F.conv2d(x.double(), wt.double(), None, s, 1, 1, groups)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
        go = torch.randn(got.shape)
        gw = ops.conv2d_grad_weight(go, x, wt, [s, s], [1, 1], [1, 1], groups)
        want = torch.ops.aten.convolution_backward(go.double(), x.double(), wt.double(), None, [s, s],
                                                   [1, 1], [1, 1], False, [0, 0], groups,
                                                   [False, True, False])[1]
        torch.testing.assert_close(gw.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    # Tiny layers' routes (few output channels): the input gradient of stride-1
    # and small 1x1 layers as the few-channel forward of grad_output, the 1x1
    # forward over few input channels, and the weight gradient of 8 output
    # channels on the grouped kernel's items; NCHW and channels_last.
    for n, c, h, w, k, ks in [(1, 8, 8, 8, 8, 3), (2, 16, 9, 7, 8, 3), (2, 5, 10, 9, 5, 3), (1, 8, 8, 8, 8, 1),
                              (3, 12, 6, 7, 11, 1)]:
        for fmt in (torch.contiguous_format, torch.channels_last):
            p = ks // 2
            x = torch.randn(n, c, h, w).contiguous(memory_format=fmt)
            wt = torch.randn(k, c, ks, ks).contiguous(memory_format=fmt)
            got = ops.conv2d(x, wt, None, [1, 1], [p, p], [1, 1], 1)
            go = torch.randn(got.shape).contiguous(memory_format=fmt)
            gi = ops.conv2d_grad_input(go, x, wt, [1, 1], [p, p], [1, 1], 1)
            gw = ops.conv2d_grad_weight(go, x, wt, [1, 1], [p, p], [1, 1], 1)
            want = F.conv2d(x.double(), wt.double(), None, 1, p)
            want_gi, want_gw = torch.ops.aten.convolution_backward(
                go.double(), x.double(), wt.double(), None, [1, 1], [p, p], [1, 1], False, [0, 0], 1,
                [True, True, False])[:2]
            for name, a, b in [("forward", got, want), ("grad_input", gi, want_gi), ("grad_weight", gw, want_gw)]:
                torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5 * b.abs().max().item(),
                                           msg=lambda m: f"{name} {(n, c, h, w, k, ks)} {fmt}: {m}")
    x = torch.randn(2, 24, 17, 19)
    wt = torch.randn(24, 1, 5, 5)
    got = ops.depthwise_conv2d(x, wt, None, [2, 1], [2, 2], [1, 1])
    want = F.conv2d(x.double(), wt.double(), None, (2, 1), 2, 1, 24)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    print("ok")
    """
)


@pytest.mark.parametrize("isa", ["x86-64-v4", "x86-64-v3", "baseline"])
def test_cpu_kernels_match_torch_in_every_instruction_set_build(isa, seed):
    env = dict(os.environ, CUSTOMCONV_CPU_ISA=isa, OMP_NUM_THREADS="2")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(seed)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, (
        f"seed={seed} isa={isa}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    )
