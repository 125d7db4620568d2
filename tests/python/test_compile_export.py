"""torch.compile(fullgraph=True) and torch.export of code using the ops
(conv2d / im2col / col2im, and the direct-kernel ops depthwise_conv2d /
filter2d / trilinear_interpolation): forward and backward match eager, with
static and dynamic batch sizes."""

import pytest
import torch
import torch.nn.functional as F

import customconv
from testlib import DEVICES, make_tensor, ops

pytestmark = [
    # Raised inside torch.compile / torch.export themselves.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The given buffer is not writable"),
]

@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def pipeline(x, w, b):
    """conv2d -> im2col -> col2im on a 6x6 image, with pointwise ops between."""
    y = customconv.conv2d(x, w, b, stride=1, padding=1, groups=2)
    c = customconv.im2col(torch.relu(y), (2, 2), stride=2)
    z = customconv.col2im(c * 1.5, (6, 6), (2, 2), stride=2)
    return torch.tanh(z) + y


class Model(torch.nn.Module):
    """customconv.nn.Conv2d layers and the raw ops."""

    def __init__(self):
        super().__init__()
        self.conv1 = customconv.nn.Conv2d(4, 6, 3, padding=1, groups=2)
        self.conv2 = customconv.nn.Conv2d(6, 4, (3, 2), padding="same", padding_mode="reflect",
                                          bias=False)

    def forward(self, x):
        y = torch.relu(self.conv1(x))
        c = ops.im2col(y, [2, 2], [2, 2], [0, 0], [1, 1])
        y = ops.col2im(c.sigmoid(), [6, 6], [2, 2], [2, 2], [0, 0], [1, 1])
        return self.conv2(y)


def inputs(device, gen, batch=2, requires_grad=True):
    x = make_tensor((batch, 4, 6, 6), torch.float32, device, gen=gen, requires_grad=requires_grad)
    w = make_tensor((6, 2, 3, 3), torch.float32, device, gen=gen, requires_grad=requires_grad)
    b = make_tensor((6,), torch.float32, device, gen=gen, requires_grad=requires_grad)
    return x, w, b


def assert_same(got, want, what):
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what}: {m}")


def forward_backward(fn, args, grad):
    out = fn(*args)
    grads = torch.autograd.grad(out, args, grad)
    return out, grads


def check_compiled_module(model, device, gen):
    """torch.compile(model, fullgraph=True) gives eager's output and gradients
    (of the input and every parameter) on a channels_last batch of 3."""
    x = make_tensor((3, 4, 6, 6), torch.float32, device, "channels_last", gen, True)
    compiled = torch.compile(model, fullgraph=True)
    out_c, out_e = compiled(x), model(x)
    assert_same(out_c, out_e, "output")
    grad = make_tensor(out_e.shape, torch.float32, device, gen=gen)
    params = [x] + list(model.parameters())
    grads_c = torch.autograd.grad(out_c, params, grad)
    grads_e = torch.autograd.grad(out_e, params, grad)
    for name, gc, ge in zip(["input"] + [n for n, _ in model.named_parameters()], grads_c, grads_e):
        assert_same(gc, ge, f"grad of {name}")


def check_batches_without_recompiling(compiled, eager, params, names, batches, grad_shape,
                                      strict_from, device, gen):
    """For each batch size, a new input (batch, 4, 6, 6) and grad_output
    (batch, *grad_shape): `compiled` and `eager` on (input, *params) give the
    same output and gradients; from the `strict_from`-th batch size on,
    `compiled` must not recompile. Returns the last (input, eager output)."""
    for i, batch in enumerate(batches):
        x = make_tensor((batch, 4, 6, 6), torch.float32, device, gen=gen, requires_grad=True)
        grad = make_tensor((batch,) + grad_shape, torch.float32, device, gen=gen)
        if i == strict_from:
            torch.compiler.set_stance("fail_on_recompile")
        try:
            out_c, grads_c = forward_backward(compiled, (x,) + params, grad)
        finally:
            torch.compiler.set_stance("default")
        out_e, grads_e = forward_backward(eager, (x,) + params, grad)
        assert_same(out_c, out_e, f"output (batch {batch})")
        for name, gc, ge in zip(names, grads_c, grads_e):
            assert_same(gc, ge, f"grad of {name} (batch {batch})")
    return x, out_e


def check_export(model, device, gen, path, ops_expected):
    """torch.export of `model` (in eval mode) with a dynamic batch calls
    `ops_expected`, and the exported program, saved to `path` and loaded
    back, gives eager's outputs at several batch sizes."""
    x = make_tensor((3, 4, 6, 6), torch.float32, device, gen=gen)
    batch = torch.export.Dim("batch", min=1, max=64)
    exported = torch.export.export(model, (x,), dynamic_shapes={"x": {0: batch}})
    targets = {node.target for node in exported.graph.nodes if node.op == "call_function"}
    assert ops_expected <= targets, targets

    torch.export.save(exported, str(path))
    reloaded = torch.export.load(str(path))
    with torch.no_grad():
        for n in (1, 2, 5, 17):
            x = make_tensor((n, 4, 6, 6), torch.float32, device, gen=gen)
            want = model(x)
            assert_same(exported.module()(x), want, f"exported program (batch {n})")
            assert_same(reloaded.module()(x), want, f"saved and loaded program (batch {n})")


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_function_matches_eager_forward_and_backward(device, gen):
    args = inputs(device, gen)
    grad = make_tensor((2, 6, 6, 6), torch.float32, device, gen=gen)
    compiled = torch.compile(pipeline, fullgraph=True)
    out_c, grads_c = forward_backward(compiled, args, grad)
    out_e, grads_e = forward_backward(pipeline, args, grad)
    assert_same(out_c, out_e, "output")
    for name, gc, ge in zip(("input", "weight", "bias"), grads_c, grads_e):
        assert_same(gc, ge, f"grad of {name}")
    # ... and eager matches PyTorch's own ops.
    ref = F.conv2d(*(a.detach().double() for a in args), stride=1, padding=1, groups=2)
    torch.testing.assert_close(customconv.conv2d(*args, 1, 1, 1, 2).double(), ref,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_module_matches_eager_forward_and_backward(device, gen):
    check_compiled_module(Model().to(device), device, gen)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_function_with_dynamic_batch_matches_eager_without_recompiling(device, gen):
    compiled = torch.compile(pipeline, fullgraph=True, dynamic=True)
    _, w, b = inputs(device, gen)
    # The graph compiled for batch 5 serves every later batch size.
    check_batches_without_recompiling(compiled, pipeline, (w, b), ("input", "weight", "bias"),
                                      (5, 3, 2, 8), (6, 6, 6), 1, device, gen)


@pytest.mark.parametrize("device", DEVICES)
def test_exported_module_with_dynamic_batch_matches_eager(device, gen, tmp_path):
    check_export(Model().to(device).eval(), device, gen, tmp_path / "model.pt2",
                 {ops.conv2d.default, ops.im2col.default, ops.col2im.default})


# ---------------------------------------------------------------- the direct-kernel ops


def direct_pipeline(x, w, b, k):
    """depthwise_conv2d -> filter2d -> trilinear_interpolation on a 6x6 image:
    the 8 channels of each image are the 8 corners, its 36 pixels the
    features, and its first 3 input channels' means the point."""
    y = customconv.depthwise_conv2d(x, w, b, padding=1)
    z = customconv.filter2d(torch.relu(y), k, "reflect")
    points = torch.tanh(x.mean((2, 3))[:, :3]) * 1.5
    return customconv.trilinear_interpolation(z.flatten(2), points)


class DirectModel(torch.nn.Module):
    """customconv.nn.DepthwiseConv2d, Filter2d (trainable) and TrilinearInterpolation."""

    def __init__(self):
        super().__init__()
        self.depthwise = customconv.nn.DepthwiseConv2d(4, 8, (3, 5), padding="same",
                                                       padding_mode="circular")
        self.filter = customconv.nn.Filter2d(torch.randn(3, 3), "replicate", requires_grad=True)
        self.interpolate = customconv.nn.TrilinearInterpolation()

    def forward(self, x):
        z = self.filter(torch.sigmoid(self.depthwise(x)))
        return self.interpolate(z.flatten(2), torch.tanh(x[:, :3, 0, 0]))


def direct_inputs(device, gen, batch=2, requires_grad=True):
    x = make_tensor((batch, 4, 6, 6), torch.float32, device, gen=gen, requires_grad=requires_grad)
    w = make_tensor((8, 1, 3, 3), torch.float32, device, gen=gen, requires_grad=requires_grad)
    b = make_tensor((8,), torch.float32, device, gen=gen, requires_grad=requires_grad)
    k = make_tensor((3, 5), torch.float32, device, gen=gen, requires_grad=requires_grad)
    return x, w, b, k


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_direct_ops_with_dynamic_batch_match_eager_without_recompiling(device, gen):
    # Static first (batch 2), then dynamic batch sizes from one more graph.
    compiled = torch.compile(direct_pipeline, fullgraph=True)
    _, w, b, k = direct_inputs(device, gen)
    # The graph compiled for batch 5 (dynamic after the second size) serves the rest.
    x, out_e = check_batches_without_recompiling(
        compiled, direct_pipeline, (w, b, k), ("input", "weight", "bias", "kernel"),
        (2, 5, 3, 8), (36,), 2, device, gen)
    # ... and eager matches PyTorch's own ops.
    x64, w64, b64, k64 = (a.detach().double().cpu() for a in (x, w, b, k))
    y = F.conv2d(x64, w64, b64, padding=1, groups=4)
    z = F.conv2d(F.pad(torch.relu(y).reshape(-1, 1, 6, 6), (2, 2, 1, 1), mode="reflect"),
                 k64[None, None]).reshape(-1, 8, 36)
    u = (torch.tanh(x64.mean((2, 3))[:, :3]) * 1.5 + 1) / 2
    ref = sum((u[:, 0] if c & 4 else 1 - u[:, 0])[:, None] * (u[:, 1] if c & 2 else 1 - u[:, 1])[:, None]
              * (u[:, 2] if c & 1 else 1 - u[:, 2])[:, None] * z[:, c] for c in range(8))
    torch.testing.assert_close(out_e.detach().double().cpu(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_direct_ops_module_matches_eager_forward_and_backward(device, gen):
    check_compiled_module(DirectModel().to(device), device, gen)


@pytest.mark.parametrize("device", DEVICES)
def test_exported_direct_ops_module_with_dynamic_batch_matches_eager(device, gen, tmp_path):
    check_export(DirectModel().to(device).eval(), device, gen, tmp_path / "direct.pt2",
                 {ops.depthwise_conv2d.default, ops.filter2d.default,
                  ops.trilinear_interpolation.default})


# ---------------------------------------------------------------- every op in one model


class AllOpsModel(torch.nn.Module):
    """Model (conv2d, im2col, col2im) feeding DirectModel (depthwise_conv2d,
    filter2d, trilinear_interpolation): (N, 4, 6, 6) -> (N, 36)."""

    def __init__(self):
        super().__init__()
        self.columns = Model()
        self.direct = DirectModel()

    def forward(self, x):
        return self.direct(self.columns(x))


ALL_FORWARD_OPS = {ops.conv2d.default, ops.im2col.default, ops.col2im.default,
                   ops.depthwise_conv2d.default, ops.filter2d.default,
                   ops.trilinear_interpolation.default}


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_model_of_every_op_matches_eager_forward_and_backward(device, gen):
    check_compiled_module(AllOpsModel().to(device), device, gen)


@pytest.mark.parametrize("device", DEVICES)
def test_aoti_package_of_every_op_with_dynamic_batch_matches_eager(device, gen, tmp_path):
    model = AllOpsModel().to(device).eval()
    x = make_tensor((3, 4, 6, 6), torch.float32, device, gen=gen)
    exported = torch.export.export(model, (x,),
                                   dynamic_shapes={"x": {0: torch.export.Dim("batch", max=64)}})
    targets = {node.target for node in exported.graph.nodes if node.op == "call_function"}
    assert ALL_FORWARD_OPS <= targets, targets

    path = torch._inductor.aoti_compile_and_package(exported,
                                                    package_path=str(tmp_path / "model.pt2"))
    package = torch._inductor.aoti_load_package(path)
    with torch.no_grad():
        for n in (1, 3, 8):
            x = make_tensor((n, 4, 6, 6), torch.float32, device, gen=gen)
            assert_same(package(x), model(x), f"AOTInductor package (batch {n})")
