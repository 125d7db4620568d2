"""What an inference server needs of the CUDA kernels beyond right values on
ordinary calls: every op's forward and backward captured in a CUDA graph and
replayed on fresh data gives eager's results; ops run on a non-default stream
honour it; torch.compile(mode="reduce-overhead") (CUDA graphs) over a model of
every op matches eager; on a machine with two GPUs, every op on cuda:1 works
while cuda:0 is current and mixing the two is a clear error; inputs of more
than 2**31 elements (64-bit indexing) give right values, spot-checked against
the float64 reference on slices. Every test needs a GPU (skipped without one).
Determinism is in test_deterministic_backward.py, the bad-input corpus with
its CUDA context checks in test_bad_input_corpus.py."""

import pytest
import torch
import torch.nn.functional as F

from test_compile_export import AllOpsModel
from testlib import capture_and_replay, cuda, make_tensor, ops, sync

pytestmark = [cuda, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

F32, F64 = torch.float32, torch.float64


def tensors(device, dtype, gen, *shapes, **kw):
    return [make_tensor(s, dtype, device, gen=gen, requires_grad=True, **kw) for s in shapes]


# op -> make(device, dtype, gen) -> (forward function of the inputs, the inputs)
OPS = {
    "conv2d": lambda d, dt, g: (
        lambda x, w, b: ops.conv2d(x, w, b, [2, 1], [1, 0], [1, 2], 2),
        tensors(d, dt, g, (3, 4, 11, 9), (6, 2, 3, 2), (6,))),
    "conv2d_1x1": lambda d, dt, g: (
        lambda x, w: ops.conv2d(x, w, None, [1, 1], [0, 0], [1, 1], 1),
        tensors(d, dt, g, (2, 8, 16, 12), (5, 8, 1, 1))),
    "im2col": lambda d, dt, g: (
        lambda x: ops.im2col(x, [3, 2], [1, 2], [1, 1], [2, 1]), tensors(d, dt, g, (2, 3, 9, 8))),
    "col2im": lambda d, dt, g: (
        lambda c: ops.col2im(c, [9, 8], [3, 3], [1, 1], [1, 1], [1, 1]),
        tensors(d, dt, g, (2, 27, 72))),
    "depthwise_conv2d": lambda d, dt, g: (
        lambda x, w, b: ops.depthwise_conv2d(x, w, b, [1, 2], [2, 1], [1, 1]),
        tensors(d, dt, g, (2, 3, 12, 10), (6, 1, 5, 3), (6,))),
    "filter2d": lambda d, dt, g: (
        lambda x, k: ops.filter2d(x, k, "reflect"), tensors(d, dt, g, (2, 3, 12, 13), (5, 3))),
    "trilinear_interpolation": lambda d, dt, g: (
        ops.trilinear_interpolation,
        tensors(d, dt, g, (50, 8, 33)) + tensors(d, dt, g, (50, 3), uniform=(-1.2, 1.2))),
}

TOLERANCE = {F32: dict(rtol=1e-5, atol=1e-5), F64: dict(rtol=1e-12, atol=1e-12)}


def forward_backward(fn, inputs, grad):
    out = fn(*inputs)
    return (out,) + torch.autograd.grad(out, inputs, grad)


def assert_all_close(got, want, dtype, what):
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, **TOLERANCE[dtype], msg=lambda m: f"{what}, result {i}: {m}")


# ---------------------------------------------------------------- CUDA graphs


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_forward_and_backward_replayed_from_a_cuda_graph_on_fresh_data_match_eager(op, dtype,
                                                                                      gen):
    fn, inputs = OPS[op]("cuda", dtype, gen)
    grad = make_tensor(fn(*inputs).shape, dtype, "cuda", gen=gen)
    results, _graph = capture_and_replay(lambda: forward_backward(fn, inputs, grad),
                                         [t.detach() for t in inputs] + [grad], gen)
    results = [r.clone() for r in results]
    assert_all_close(results, forward_backward(fn, inputs, grad), dtype, f"{op} graph replay")


# ---------------------------------------------------------------- streams


@pytest.mark.parametrize("op", sorted(OPS))
def test_ops_run_on_the_current_stream(op, gen):
    # On a side stream, a long sleep, then new input values, then the op: an
    # op launched on another stream would read the old values.
    fn, inputs = OPS[op]("cuda", F64, gen)
    grad = make_tensor(fn(*inputs).shape, F64, "cuda", gen=gen)
    fresh = [make_tensor(t.shape, F64, "cuda", gen=gen) for t in inputs]
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # about 0.1 s
        with torch.no_grad():
            for t, f in zip(inputs, fresh):
                t.copy_(f)
        results = forward_backward(fn, inputs, grad)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    want = forward_backward(fn, [f.requires_grad_() for f in fresh], grad)
    assert_all_close(results, want, F64, f"{op} on a side stream")


# ---------------------------------------------------------------- torch.compile with CUDA graphs


def test_compiled_model_of_every_op_with_cuda_graphs_matches_eager(gen):
    torch._dynamo.reset()
    model = AllOpsModel().cuda()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    params = list(model.parameters())
    try:
        for step in range(4):  # recording, then replays of the CUDA graphs
            x = make_tensor((3, 4, 6, 6), F32, "cuda", gen=gen, requires_grad=True)
            torch.compiler.cudagraph_mark_step_begin()
            out_c = compiled(x)
            grad = make_tensor(out_c.shape, F32, "cuda", gen=gen)
            grads_c = [g.clone() for g in torch.autograd.grad(out_c, [x] + params, grad)]
            out_c = out_c.clone()
            out_e = model(x)
            grads_e = torch.autograd.grad(out_e, [x] + params, grad)
            assert_all_close([out_c] + grads_c, [out_e] + list(grads_e), F32,
                             f"reduce-overhead step {step}")
    finally:
        torch._dynamo.reset()


# ---------------------------------------------------------------- two GPUs

two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


@two_gpus
@pytest.mark.parametrize("op", sorted(OPS))
def test_every_op_runs_on_the_second_gpu_while_the_first_is_current(op, gen):
    torch.cuda.set_device(0)
    fn, inputs = OPS[op]("cuda:1", F64, gen)
    grad = make_tensor(fn(*inputs).shape, F64, "cuda:1", gen=gen)
    # Detached: an eager autograd graph kept alive into the capture below keeps
    # its leaves' gradient accumulators, which remember the default stream they
    # were made on, and PyTorch's engine then records an event on that legacy
    # stream inside the capture (an error; F.fold does the same).
    results = [r.detach() for r in forward_backward(fn, inputs, grad)]
    torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == 0
    assert all(r.device == torch.device("cuda:1") for r in results), [r.device for r in results]
    cpu_inputs = [t.detach().cpu().requires_grad_() for t in inputs]
    want = forward_backward(fn, cpu_inputs, grad.cpu())
    assert_all_close([r.cpu() for r in results], want, F64, f"{op} on cuda:1")
    # ... and inside a CUDA graph captured on cuda:1.
    with torch.cuda.device(1):
        replayed, _graph = capture_and_replay(lambda: forward_backward(fn, inputs, grad),
                                              [t.detach() for t in inputs], gen)
        replayed = [r.clone() for r in replayed]
        assert_all_close(replayed, forward_backward(fn, inputs, grad), F64, f"{op} graph on cuda:1")


@two_gpus
def test_streamed_tile_kernel_runs_on_the_second_gpu_while_the_first_is_current(gen):
    # Float32 7x7 over at least three 64 x 128 tiles per SM takes the
    # streamed-tile kernel, whose set-up (binary check, shared-memory limit)
    # is per device: here it happens with cuda:0 current and the data on cuda:1.
    torch.cuda.set_device(0)
    sms = torch.cuda.get_device_properties(1).multi_processor_count
    x = make_tensor((-(-3 * sms // 9), 136, 260), F32, "cuda:1", gen=gen)
    k = make_tensor((7, 7), F32, "cuda:1", gen=gen)
    out = ops.filter2d(x, k, "zeros")
    torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == 0 and out.device == torch.device("cuda:1")
    want = F.conv2d(x.double()[:, None], k.double()[None, None], padding=3)[:, 0]
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)


@two_gpus
@pytest.mark.parametrize("op", sorted(o for o in OPS if o not in ("im2col", "col2im")))
def test_tensors_on_two_gpus_are_a_clear_error(op, gen):
    fn, inputs = OPS[op]("cuda:1", F32, gen)
    mixed = [inputs[0]] + [t.detach().to("cuda:0") for t in inputs[1:]]
    with pytest.raises(RuntimeError, match=r"is on cuda:0 but \w+ is on cuda:1; all tensors "
                                           r"must be on one device"):
        fn(*mixed)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    fn(*inputs)  # both devices still work
    fn(*[t.detach().to("cuda:0") for t in inputs])
    torch.cuda.synchronize()


# ---------------------------------------------------------------- more than 2**31 elements

HALF = torch.float16
GIB = 2**30


def needs_gpu_memory(gib):
    """Skips unless the GPU has `gib` GiB free."""
    free, _ = torch.cuda.mem_get_info()
    if free < gib * GIB:
        pytest.skip(f"needs {gib} GiB of free GPU memory; {free / GIB:.1f} GiB free")


@pytest.fixture
def release_memory():
    yield
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def random_half(shape, gen_seed):
    g = torch.Generator(device="cuda").manual_seed(gen_seed)
    return torch.randn(shape, generator=g, device="cuda", dtype=HALF)


def tail_only(shape, rows, gen_seed):
    """A grad_output that is zero except on the last `rows` rows (dim -2) of
    the last plane, so that sums over the whole tensor (weight gradients)
    have a reference computed from a slice."""
    g = torch.zeros(shape, device="cuda", dtype=HALF)
    g.view(-1, shape[-2], shape[-1])[-1, -rows:] = random_half((rows, shape[-1]), gen_seed)
    return g


def close_to(got, want, what, rtol=2e-2, atol=2e-2):
    """float16 results (float32 accumulation) against a float64 reference."""
    torch.testing.assert_close(got.detach().double().cpu(), want, rtol=rtol, atol=atol,
                               msg=lambda m: f"{what}: {m}")


def test_filter2d_on_more_than_2_31_elements(release_memory):
    needs_gpu_memory(20)
    shape = (2, 32768, 32800)  # 2.15e9 elements, 4.3 GB in float16
    x = random_half(shape, 1)
    k = random_half((3, 5), 2)
    out = ops.filter2d(x, k, "zeros")
    rows = 6  # the last rows of the last plane: flat indices past 2**31
    xs = x[-1, -rows - 1:].double().cpu()  # one row above for the kernel's reach
    k64 = k.double().cpu()
    want = F.conv2d(F.pad(xs, (2, 2, 0, 1))[None, None], k64[None, None])[0, 0]
    close_to(out[-1, -rows:], want, "filter2d output")
    del out
    g = tail_only(shape, rows, 3)
    gi = ops.filter2d_grad_input(g, k, "zeros")
    gs = g[-1, -rows - 1:].double().cpu()
    want = F.conv2d(F.pad(gs, (2, 2, 1, 1))[None, None], k64.flip(0, 1)[None, None])[0, 0, -rows:]
    close_to(gi[-1, -rows:], want, "filter2d grad_input")
    del gi
    gk = ops.filter2d_grad_kernel(g, x, k, "zeros")
    xp = F.pad(x[-1, -rows - 1:].double().cpu(), (2, 2, 0, 1))  # what the tail rows' taps read
    want = F.conv2d(xp[None, None], gs[None, None, 1:])[0, 0]
    close_to(gk, want, "filter2d grad_kernel", rtol=5e-2, atol=5e-1)


def test_depthwise_conv2d_on_more_than_2_31_elements(release_memory):
    needs_gpu_memory(20)
    shape = (1, 2, 32768, 32800)
    x = random_half(shape, 4)
    w = random_half((2, 1, 3, 3), 5)
    out = ops.depthwise_conv2d(x, w, None, [1, 1], [1, 1], [1, 1])
    rows = 6
    xs = x[:, -1:, -rows - 1:].double().cpu()
    w64 = w[-1:].double().cpu()
    want = F.conv2d(F.pad(xs, (1, 1, 0, 1)), w64)[0, 0]
    close_to(out[0, -1, -rows:], want, "depthwise_conv2d output")
    del out
    g = tail_only(shape, rows, 6)
    gi = ops.depthwise_conv2d_grad_input(g, x, w, [1, 1], [1, 1], [1, 1])
    gs = g[:, -1:, -rows - 1:].double().cpu()
    want = F.conv2d(F.pad(gs, (1, 1, 1, 1)), w64.flip(2, 3))[0, 0, -rows:]
    close_to(gi[0, -1, -rows:], want, "depthwise_conv2d grad_input")
    del gi
    gw = ops.depthwise_conv2d_grad_weight(g, x, w, [1, 1], [1, 1], [1, 1])
    xp = F.pad(x[:, -1:, -rows - 1:].double().cpu(), (1, 1, 0, 1))
    want = F.conv2d(xp, gs[:, :, 1:])[0, 0]
    close_to(gw[-1, 0], want, "depthwise_conv2d grad_weight", rtol=5e-2, atol=5e-1)
    assert torch.equal(gw[0].cpu(), torch.zeros_like(gw[0].cpu())), "channel without gradient"


def test_conv2d_on_more_than_2_31_elements(release_memory):
    needs_gpu_memory(20)
    shape = (8200, 4, 256, 256)  # 2.15e9 elements; images in chunks of the workspace
    x = random_half(shape, 7)
    w = random_half((4, 4, 3, 3), 8)
    b = random_half((4,), 9)
    args = ([1, 1], [1, 1], [1, 1], 1)
    out = ops.conv2d(x, w, b, *args)
    x64, w64 = x[-2:].double().cpu(), w.double().cpu()
    close_to(out[-2:], F.conv2d(x64, w64, b.double().cpu(), 1, 1), "conv2d output")
    del out
    g = torch.zeros(shape, device="cuda", dtype=HALF)
    g[-2:] = random_half((2,) + shape[1:], 10)
    gi = ops.conv2d_grad_input(g, x, w, *args)
    g64 = g[-2:].double().cpu()
    close_to(gi[-2:], torch.nn.grad.conv2d_input(x64.shape, w64, g64, padding=1),
             "conv2d grad_input")
    assert not bool(gi[0].any()), "grad_input of an image without gradient"
    del gi
    gw = ops.conv2d_grad_weight(g, x, w, *args)
    close_to(gw, torch.nn.grad.conv2d_weight(x64, w64.shape, g64, padding=1), "conv2d grad_weight",
             rtol=5e-2, atol=1.0)


def test_conv2d_1x1_on_more_than_2_31_elements(release_memory):
    needs_gpu_memory(20)
    shape = (2, 16, 8192, 8200)  # 2.15e9 elements; the GEMM reads NCHW in place
    x = random_half(shape, 11)
    w = random_half((2, 16, 1, 1), 12)
    out = ops.conv2d(x, w, None, [1, 1], [0, 0], [1, 1], 1)
    want = F.conv2d(x[-1:, :, -4:].double().cpu(), w.double().cpu())
    close_to(out[-1:, :, -4:], want, "conv2d 1x1 output")


def test_im2col_and_col2im_on_more_than_2_31_elements(release_memory):
    needs_gpu_memory(20)
    size = 16384
    x = random_half((1, 1, size, size), 13)  # columns: 9 x 2.7e8 = 2.4e9 elements
    cols = ops.im2col(x, [3, 3], [1, 1], [1, 1], [1, 1])
    assert cols.shape == (1, 9, size * size)
    # Row 8 (tap (2, 2)) of the last positions: flat indices past 2**31.
    rows = 4
    xs = x[0, 0, -rows - 1:].double().cpu()
    want = F.unfold(F.pad(xs, (1, 1, 0, 1))[None, None], 3)[0]  # (9, rows * size)
    close_to(cols[0, :, -rows * size:], want, "im2col", rtol=0, atol=0)
    img = ops.col2im(cols, [size, size], [3, 3], [1, 1], [1, 1], [1, 1])
    # Each pixel sums its 9 copies: 9 times itself where all 9 windows cover it.
    counts = F.fold(torch.ones(1, 9, size * size, dtype=F64), (size, size), 3, padding=1)
    del cols
    close_to(img[0, 0, -rows:], (counts[0, 0, -rows:] * x[0, 0, -rows:].double().cpu()),
             "col2im")


def test_trilinear_interpolation_on_more_than_2_31_elements(release_memory):
    needs_gpu_memory(20)
    n, f = 2**20, 257  # feats: 2.16e9 elements
    feats = random_half((n, 8, f), 14)
    points = (torch.rand((n, 3), device="cuda", dtype=torch.float32) * 2 - 1).to(HALF)
    out = ops.trilinear_interpolation(feats, points)
    tail = 64
    fs, ps = feats[-tail:].double().cpu(), points[-tail:].double().cpu()
    u = (ps + 1) / 2
    weights = torch.stack([(u[:, 0] if i else 1 - u[:, 0]) * (u[:, 1] if j else 1 - u[:, 1])
                           * (u[:, 2] if k else 1 - u[:, 2])
                           for i in (0, 1) for j in (0, 1) for k in (0, 1)], 1)
    close_to(out[-tail:], (weights[:, :, None] * fs).sum(1), "trilinear output")
    del out
    g = torch.zeros((n, f), device="cuda", dtype=HALF)
    g[-tail:] = random_half((tail, f), 15)
    gf, gp = ops.trilinear_interpolation_backward(g, feats, points)
    g64 = g[-tail:].double().cpu()
    close_to(gf[-tail:], weights[:, :, None] * g64[:, None, :], "trilinear grad_feats")
    assert not bool(gf[0].any()) and not bool(gp[0].any()), "gradient of a point without one"
    p64 = ps.clone().requires_grad_()
    u = (p64 + 1) / 2
    ref = sum(((u[:, 0] if i else 1 - u[:, 0]) * (u[:, 1] if j else 1 - u[:, 1])
               * (u[:, 2] if k else 1 - u[:, 2]))[:, None] * fs[:, 4 * i + 2 * j + k]
              for i in (0, 1) for j in (0, 1) for k in (0, 1))
    (want,) = torch.autograd.grad(ref, p64, g64)
    close_to(gp[-tail:], want, "trilinear grad_points", rtol=5e-2, atol=5e-1)
    sync("cuda")
