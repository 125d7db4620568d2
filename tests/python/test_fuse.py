"""customconv.fuse(model): BatchNorm2d folded into the convolution before it,
the residual add and the activation after it fused, as
customconv.nn.FusedConv2d modules (customconv::conv2d_fused). Fused
torchvision models (random weights, random batch-norm statistics) give the
original's outputs, script and export; the report counts what was fused and
says why the rest was not; a training-mode model is refused; a model that
torch.fx cannot trace is fused by module patterns."""

import copy
import io

import pytest
import torch
import torch.nn.functional as F

import customconv
from customconv.nn import FusedConv2d
from testlib import DEVICES, make_tensor

# torch.jit.script / torch.jit.load warn that they are deprecated; they are a
# deployment path of this library all the same. Scripting any torch.fx
# GraphModule warns about an annotation in GraphModule.__init__ (torch 2.11).
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The TorchScript type system doesn't support instance-level"),
    # PyTorch's own conv2d (the reference) with padding="same" and an even kernel.
    pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths"),
]

TORCHVISION_MODELS = ["resnet18", "resnet50", "mobilenet_v2", "efficientnet_b0", "convnext_tiny"]


def randomize_batch_norm(model, gen):
    """Running statistics and affine parameters away from their initial 0 / 1,
    so that folding is really tested."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d) and m.track_running_stats:
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
                if m.affine:
                    m.weight.copy_(torch.rand(n, generator=gen) + 0.5)
                    m.bias.copy_(torch.randn(n, generator=gen) * 0.1)
    return model


def assert_close_scaled(actual, expected, rtol):
    """Within rtol of the output's largest magnitude (random deep networks reach
    large values, and float32 rounding scales with them)."""
    scale = float(expected.abs().max())
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=rtol * max(scale, 1.0))


def torchvision_model(arch, gen, device):
    torchvision = pytest.importorskip("torchvision")
    model = getattr(torchvision.models, arch)(weights=None)  # random weights, no download
    return randomize_batch_norm(model, gen).to(device).eval()


def fused_convs(model):
    return [m for m in model.modules() if isinstance(m, FusedConv2d)]


# ---------------------------------------------------------------- torchvision models


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", TORCHVISION_MODELS)
def test_fused_torchvision_model_matches_the_original(arch, device, gen):
    model = torchvision_model(arch, gen, device)
    fused = customconv.fuse(model)
    assert isinstance(fused, torch.fx.GraphModule) and not fused.training
    kinds = {type(m) for m in fused.modules()}
    # Every convolution is customconv's now; no BatchNorm2d is left where one
    # follows each convolution.
    assert torch.nn.Conv2d not in kinds
    report = customconv.fuse_report(fused)
    if arch == "convnext_tiny":  # LayerNorm, not BatchNorm: nothing to fold
        assert report.batchnorms_folded == 0 and report.convs_unfused == 22
    else:
        assert torch.nn.BatchNorm2d not in kinds
        assert report.batchnorms_remaining == 0 and report.convs_unfused == 0
    for p in fused.parameters():
        assert p.device.type == torch.device(device).type and p.dtype == torch.float32
    # The original is untouched (fuse works on a copy).
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()) == (arch != "convnext_tiny")

    x = make_tensor((2, 3, 64, 64), torch.float32, device, gen=gen)
    with torch.no_grad():
        expected, got = model(x), fused(x)
    # float32 convolutions on CUDA run in TF32 (PyTorch's default, which conv2d follows).
    assert_close_scaled(got, expected, 1e-4 if device == "cpu" else 1e-2)


def test_resnet18_report_counts(gen):
    fused = customconv.fuse(torchvision_model("resnet18", gen, "cpu"))
    report = customconv.fuse_report(fused)
    # 20 convolutions (stem, 2 per basic block x 8, 3 downsample), each with its
    # BatchNorm2d; ReLU after the stem, after each block's first convolution (8)
    # and after each block's add (8); the second convolution of each block takes
    # the add (the identity or the downsample branch as its residual).
    assert report.method == "torch.fx" and report.trace_error is None
    assert report.convs_fused == 20 and report.batchnorms_folded == 20
    assert report.activations_fused == {"relu": 17}
    assert report.residual_adds_fused == 8
    assert report.unfused_convs == {} and report.batchnorms_left == {}
    what = dict(report.fused)
    assert what["conv1"] == "conv + bn + relu"
    assert what["layer1.0.conv1"] == "conv + bn + relu"
    assert what["layer1.0.conv2"] == "conv + bn + add + relu"
    assert what["layer2.0.downsample.0"] == "conv + bn"
    summary = fused.fuse_summary
    assert summary == str(report)
    for line in ("convolutions fused:            20", "BatchNorm2d folded:            20",
                 "activations fused:             17 (relu 17)", "residual adds fused:           8",
                 "convolutions left unfused:     0", "BatchNorm2d left:              0"):
        assert line in summary, summary
    assert [m.activation for m in fused_convs(fused)].count("relu") == 17


def test_mobilenet_v2_and_efficientnet_report_counts(gen):
    report = customconv.fuse_report(customconv.fuse(torchvision_model("mobilenet_v2", gen, "cpu")))
    # 52 convolutions with BatchNorm2d, ReLU6 after 35 of them (not after each
    # block's projection), 10 inverted-residual adds.
    assert (report.convs_fused, report.batchnorms_folded, report.residual_adds_fused) == (52, 52, 10)
    assert report.activations_fused == {"relu6": 35}
    report = customconv.fuse_report(customconv.fuse(torchvision_model("efficientnet_b0", gen, "cpu")))
    # 49 convolutions with BatchNorm2d and 32 squeeze-excitation 1x1 convolutions
    # (SiLU, then Sigmoid); 9 residual adds behind stochastic depth (a no-op in eval).
    assert (report.convs_fused, report.batchnorms_folded, report.residual_adds_fused) == (81, 49, 9)
    assert report.activations_fused == {"silu": 49, "sigmoid": 16}
    assert report.noops_removed == 9 and report.convs_unfused == 0


@pytest.mark.parametrize("arch", ["resnet18", "mobilenet_v2", "efficientnet_b0"])
def test_fused_model_scripts_saves_and_loads(arch, gen):
    model = torchvision_model(arch, gen, "cpu")
    fused = customconv.fuse(model)
    scripted = torch.jit.script(fused)
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    x = make_tensor((2, 3, 64, 64), torch.float32, "cpu", gen=gen)
    with torch.no_grad():
        expected = model(x)
        assert_close_scaled(scripted(x), expected, 1e-4)
        assert_close_scaled(loaded(x), expected, 1e-4)
    name = next(n for n, m in fused.named_modules() if isinstance(m, FusedConv2d))
    submodule = loaded
    for part in name.split("."):
        submodule = getattr(submodule, part)
    assert "ops.customconv.conv2d_fused(" in submodule.code
    assert loaded.fuse_summary == fused.fuse_summary


def test_fused_resnet18_exports_with_a_dynamic_batch(gen):
    model = torchvision_model("resnet18", gen, "cpu")
    fused = customconv.fuse(model)
    x = make_tensor((2, 3, 64, 64), torch.float32, "cpu", gen=gen)
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(fused, (x,), dynamic_shapes=({0: batch},))
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.customconv.conv2d_fused.default) == 20
    assert not any("batch_norm" in str(t) for t in targets)
    with torch.no_grad():
        assert_close_scaled(ep.module()(x), model(x), 1e-4)
        x3 = make_tensor((3, 3, 64, 64), torch.float32, "cpu", gen=gen)
        assert_close_scaled(ep.module()(x3), model(x3), 1e-4)


# ---------------------------------------------------------------- refusals


def test_training_mode_model_is_refused():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    with pytest.raises(ValueError, match=r"training mode.*model\.eval\(\)"):
        customconv.fuse(model)
    model.eval()
    model[1].train()  # one submodule in training mode is enough
    with pytest.raises(ValueError, match=r"training mode \(1 module\(s\): '1'\)"):
        customconv.fuse(model)
    with pytest.raises(TypeError, match="script the result"):
        customconv.fuse(torch.jit.script(model.eval()))
    with pytest.raises(ValueError, match="not made by customconv.fuse"):
        customconv.fuse_report(model)


# ---------------------------------------------------------------- patterns


class Activations(torch.nn.Module):
    """Every form of activation and add that fuse recognizes, and a few it must not take."""

    def __init__(self):
        super().__init__()
        c = 6
        self.convs = torch.nn.ModuleList(
            [torch.nn.Conv2d(c, c, 3, padding=1, bias=i % 2 == 0) for i in range(16)])
        self.bns = torch.nn.ModuleList([torch.nn.BatchNorm2d(c) for _ in range(16)])
        self.hardtanh = torch.nn.Hardtanh(0.0, 6.0)
        self.gelu_tanh = torch.nn.GELU(approximate="tanh")
        self.hardtanh_other = torch.nn.Hardtanh(-1.0, 1.0)

    def forward(self, x):
        c, b = self.convs, self.bns
        y = F.relu(b[0](c[0](x)))                              # relu
        y = torch.relu(b[1](c[1](y)) + x)                      # add + relu
        y = b[2](c[2](y)).relu()                               # relu
        y = F.relu6(b[3](c[3](y)), inplace=True)               # relu6
        y = F.hardtanh(b[4](c[4](y)), 0.0, 6.0)                # relu6
        y = self.hardtanh(c[5](y))                             # relu6, no BatchNorm
        z = b[6](c[6](y))
        z += y                                                 # add (in place)
        z = F.silu(z, inplace=True)                            # silu
        y = F.hardswish(torch.add(y, b[7](c[7](z))))           # add (src second) + hardswish
        y = F.gelu(b[8](c[8](y)).add(z))                       # add + gelu
        y = torch.sigmoid(b[9](c[9](y)))                       # sigmoid
        y = b[10](c[10](y)).sigmoid_()                         # sigmoid
        y = F.gelu(b[11](c[11](y)), approximate="tanh")        # not fused: tanh GELU
        y = self.gelu_tanh(b[12](c[12](y)))                    # not fused: tanh GELU module
        y = self.hardtanh_other(b[13](c[13](y)))               # not fused: Hardtanh(-1, 1)
        y = torch.add(b[14](c[14](y)), y, alpha=2.0)           # not fused: alpha 2
        return F.relu_(b[15](c[15](y)) + 1.0)                  # relu, the add of a number stays


def test_functional_module_and_method_activations_fuse(gen):
    model = randomize_batch_norm(Activations(), gen).double().eval()
    fused = customconv.fuse(model)
    report = customconv.fuse_report(fused)
    assert report.convs_fused == 16 and report.batchnorms_folded == 15
    assert report.activations_fused == {"relu": 3, "relu6": 3, "silu": 1, "hardswish": 1,
                                        "gelu": 1, "sigmoid": 2}
    assert report.residual_adds_fused == 4
    what = dict(report.fused)
    assert what["convs.1"] == "conv + bn + add + relu"
    assert what["convs.5"] == "conv + relu6"
    assert what["convs.6"] == "conv + bn + add + silu"
    assert what["convs.7"] == "conv + bn + add + hardswish"
    assert what["convs.11"] == "conv + bn" and what["convs.14"] == "conv + bn"
    assert what["convs.15"] == "conv + bn"
    x = make_tensor((2, 6, 9, 11), torch.float64, "cpu", gen=gen)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(torch.jit.script(fused)(x), model(x), rtol=1e-10, atol=1e-10)


class ActivationBeforeAdd(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.relu = torch.nn.ReLU(inplace=True)
        self.shared = torch.nn.Conv2d(4, 4, 1)

    def forward(self, x):
        y = self.relu(self.bn(self.conv(x))) + x  # activation before the add: the add stays
        return self.shared(self.shared(y))        # called twice: left unfused


def test_activation_before_the_add_fuses_the_activation_only(gen):
    model = randomize_batch_norm(ActivationBeforeAdd(), gen).double().eval()
    fused = customconv.fuse(model)
    report = customconv.fuse_report(fused)
    assert report.fused == [("conv", "conv + bn + relu")]
    assert report.residual_adds_fused == 0
    assert report.unfused_convs == {"called more than once (shared weights)": ["shared"]}
    assert type(fused.shared) is customconv.nn.Conv2d
    x = make_tensor((2, 4, 7, 7), torch.float64, "cpu", gen=gen)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-10, atol=1e-10)


class Leftovers(torch.nn.Module):
    """Convolutions and BatchNorms that fuse must leave as they are."""

    def __init__(self):
        super().__init__()
        self.two_users = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn_a = torch.nn.BatchNorm2d(4)
        self.no_stats = torch.nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.bn_no_stats = torch.nn.BatchNorm2d(4, track_running_stats=False)
        self.pooled = torch.nn.Conv2d(4, 4, 1)
        self.pool = torch.nn.MaxPool2d(2)
        self.bn_after_pool = torch.nn.BatchNorm2d(4)
        self.scaled = ScaledConv(4, 4, 3, padding=1)
        self.bias = torch.nn.Parameter(torch.randn(4, 1, 1))
        self.biased = torch.nn.Conv2d(4, 4, 1)
        self.broadcast = torch.nn.Conv2d(4, 4, 1)

    def forward(self, x):
        y = self.two_users(x)
        y = self.bn_a(y) + y                           # conv output used twice
        y = self.bn_no_stats(self.no_stats(y))         # BatchNorm without running statistics
        y = self.bn_after_pool(self.pool(self.pooled(y)))
        y = self.scaled(y)                             # a Conv2d subclass: not fuse's
        y = torch.relu(self.biased(y) + self.bias)     # a parameter is no residual
        # A residual that broadcasts (only the graph's structure is known when
        # fusing): FusedConv2d adds it after the convolution.
        return torch.relu(self.broadcast(y) + y.mean(dim=(2, 3), keepdim=True))


class ScaledConv(torch.nn.Conv2d):
    def forward(self, x):
        return 2 * super().forward(x)


def test_what_is_left_unfused_is_reported_and_still_right(gen):
    model = randomize_batch_norm(Leftovers(), gen).double().eval()
    fused = customconv.fuse(model)
    report = customconv.fuse_report(fused)
    assert report.fused == [("broadcast", "conv + add + relu")]
    assert report.unfused_convs.keys() == {
        "whose output has several users",
        "followed by a BatchNorm2d that cannot be folded (without running statistics "
        "(track_running_stats=False))",
        "followed by nothing fuse folds (MaxPool2d)",
        "followed by nothing fuse folds (add)",
        "traced into its functional form (not a module call in the torch.fx graph: a subclass of "
        "torch.nn.Conv2d, or not called as a module)",
    }
    assert report.batchnorms_left == {
        "after a convolution whose output has other users too": ["bn_a"],
        "without running statistics (track_running_stats=False)": ["bn_no_stats"],
        "not after a convolution (after MaxPool2d)": ["bn_after_pool"],
    }
    assert report.convs_unfused == 5 and report.batchnorms_remaining == 3
    assert "BatchNorm2d left:              3" in fused.fuse_summary
    assert type(fused.two_users) is customconv.nn.Conv2d
    assert type(fused.no_stats) is customconv.nn.DepthwiseConv2d
    x = make_tensor((2, 3, 8, 8), torch.float64, "cpu", gen=gen)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-10, atol=1e-10)


class DataDependent(torch.nn.Module):
    """Python control flow on a tensor's value: torch.fx cannot trace it."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
            torch.nn.ReLU6(inplace=True),
            torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.BatchNorm2d(8),
            torch.nn.Conv2d(8, 8, 1), torch.nn.SiLU(),
            torch.nn.Conv2d(8, 8, 1), torch.nn.MaxPool2d(2))
        self.branch = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        y = self.stem(x)
        if bool(y.mean() > 0):
            y = y + 1
        return self.bn(self.branch(y))


def test_untraceable_model_is_fused_by_module_patterns(gen):
    model = randomize_batch_norm(DataDependent(), gen).double().eval()
    fused = customconv.fuse(model)
    assert type(fused) is DataDependent and fused is not model
    report = customconv.fuse_report(fused)
    assert report.method == "module patterns" and "TraceError" in report.trace_error
    assert report.fused == [("stem.0", "conv + bn + relu6"), ("stem.3", "conv + bn"),
                            ("stem.5", "conv + silu")]
    assert report.unfused_convs == {
        "followed by nothing fuse folds in its torch.nn.Sequential": ["stem.7"],
        "not in a torch.nn.Sequential": ["branch"]}
    assert report.batchnorms_left == {"not after a convolution in a torch.nn.Sequential": ["bn"]}
    assert "module patterns" in fused.fuse_summary
    assert [type(m).__name__ for m in fused.stem] == [
        "FusedConv2d", "Identity", "Identity", "FusedConv2d", "Identity", "FusedConv2d",
        "Identity", "Conv2d", "MaxPool2d"]
    assert type(fused.branch) is customconv.nn.Conv2d
    x = make_tensor((2, 3, 8, 8), torch.float64, "cpu", gen=gen)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(torch.jit.script(fused)(x), model(x), rtol=1e-10, atol=1e-10)
    # inplace=True patches the model itself.
    assert customconv.fuse(model, inplace=True) is model
    assert isinstance(model.stem[0], FusedConv2d)


# ---------------------------------------------------------------- FusedConv2d


def hardswish(x):
    """F.hardswish's formula in x's dtype (PyTorch's CUDA kernel scales by 1/6
    rounded to float32 also in float64)."""
    return x * (x + 3).clamp(0, 6) / 6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_from_conv_folds_batch_norm_keeping_dtype_device_and_memory_format(device, dtype, gen):
    conv = torch.nn.Conv2d(4, 6, (3, 2), stride=(1, 2), padding=(1, 2), dilation=(2, 1), groups=2,
                           bias=False, padding_mode="reflect")
    bn = torch.nn.BatchNorm2d(6)
    randomize_batch_norm(torch.nn.Sequential(conv, bn), gen)
    conv, bn = conv.to(device, dtype).eval(), bn.to(device, dtype).eval()
    conv.weight.data = conv.weight.data.contiguous(memory_format=torch.channels_last)
    fused = FusedConv2d.from_conv(conv, bn, "hardswish")
    assert fused.weight.dtype == dtype and fused.weight.device == conv.weight.device
    assert fused.weight.is_contiguous(memory_format=torch.channels_last)
    assert fused.bias is not None and fused.bias.dtype == dtype
    assert "padding_mode='reflect'" in repr(fused) and "activation='hardswish'" in repr(fused)
    x = make_tensor((2, 4, 9, 10), dtype, device, gen=gen)
    with torch.no_grad():
        expected = hardswish(bn(conv(x)))
        tol = 1e-10 if dtype == torch.float64 else (1e-5 if device == "cpu" else 1e-2)
        torch.testing.assert_close(fused(x), expected, rtol=tol, atol=tol)
        # A residual of the output's shape goes into the op; a broadcast one is
        # added after the convolution, with the same result.
        for residual in (torch.randn_like(expected), torch.randn(1, 6, 1, 1, dtype=dtype, device=device)):
            want = hardswish(bn(conv(x)) + residual)
            torch.testing.assert_close(fused(x, residual), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("padding,padding_mode", [
    ("same", "zeros"), ("same", "circular"), ("valid", "zeros"), ((1, 2), "replicate"), (2, "zeros")])
def test_fused_conv2d_pads_like_torch_conv2d_and_scripts(padding, padding_mode, gen):
    conv = torch.nn.Conv2d(3, 4, (2, 3), padding=padding, padding_mode=padding_mode).double().eval()
    fused = FusedConv2d.from_conv(conv, None, "gelu")
    assert fused.weight is conv.weight and fused.bias is conv.bias  # no BatchNorm: shared
    x = make_tensor((2, 3, 7, 8), torch.float64, "cpu", gen=gen)
    with torch.no_grad():
        expected = F.gelu(conv(x))
        torch.testing.assert_close(fused(x), expected, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(torch.jit.script(fused)(x), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("activation", customconv.functional.ACTIVATIONS)
def test_functional_conv2d_fused_matches_torch(activation, gen):
    x = make_tensor((2, 4, 8, 9), torch.float64, "cpu", gen=gen)
    w = make_tensor((6, 2, 3, 3), torch.float64, "cpu", gen=gen)
    b = make_tensor((6,), torch.float64, "cpu", gen=gen)
    r = make_tensor((2, 6, 8, 9), torch.float64, "cpu", gen=gen)
    acts = {"identity": lambda t: t, "relu": F.relu, "relu6": F.relu6, "silu": F.silu,
            "hardswish": F.hardswish, "gelu": F.gelu, "sigmoid": torch.sigmoid}
    got = customconv.conv2d_fused(x, w, b, padding="same", groups=2, activation=activation, residual=r)
    expected = acts[activation](F.conv2d(x, w, b, padding="same", groups=2) + r)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_fused_conv2d_refuses_unknown_activations():
    with pytest.raises(ValueError, match="activation must be one of"):
        FusedConv2d(3, 4, 3, activation="tanh")
    with pytest.raises(TypeError, match="exactly that type"):
        FusedConv2d.from_conv(ScaledConv(3, 4, 3))
    with pytest.raises(ValueError, match="training mode"):
        FusedConv2d.from_conv(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))


def test_fuse_memory_format_choices():
    """memory_format: "auto" gives float32 CPU models channels_last weights (an
    NCHW input changes layout once, in the first convolution) and keeps other
    CPU dtypes' weights as they are; channels_last and contiguous_format force
    a layout, which the outputs follow; values unchanged."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 1)).eval()
    x = torch.randn(2, 3, 9, 9)
    expected = model(x)
    fused_convs = lambda m: [c for c in m.modules() if isinstance(c, customconv.nn.FusedConv2d)]
    auto = customconv.fuse(model)
    assert all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in fused_convs(auto))
    out = auto(x)
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    auto64 = customconv.fuse(copy.deepcopy(model).double())
    assert all(c.weight.is_contiguous() for c in fused_convs(auto64))
    cl = customconv.fuse(model, memory_format=torch.channels_last)
    out = cl(x)
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    nchw = customconv.fuse(model.to(memory_format=torch.channels_last),
                           memory_format=torch.contiguous_format)
    assert nchw(x).is_contiguous()
    with pytest.raises(ValueError, match="memory_format"):
        customconv.fuse(model, memory_format="nhwc")


@pytest.mark.cuda
def test_fuse_auto_layout_on_cuda():
    """"auto" on CUDA: channels_last weights, with and without depthwise layers;
    the outputs are channels_last whatever the input's layout."""
    torch.manual_seed(0)
    dense = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU()).cuda().eval()
    x = torch.randn(2, 3, 9, 9, device="cuda").to(memory_format=torch.channels_last)
    fused = customconv.fuse(dense)
    assert fused(x.contiguous()).is_contiguous(memory_format=torch.channels_last)
    depthwise = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), torch.nn.Conv2d(8, 8, 3, groups=8),
                                    torch.nn.BatchNorm2d(8), torch.nn.ReLU6()).cuda().eval()
    depthwise = depthwise.to(memory_format=torch.channels_last)
    fused = customconv.fuse(depthwise)
    for inp in (x, x.contiguous()):
        out = fused(inp)
        assert out.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(out, depthwise(inp), rtol=1e-2, atol=1e-2)
    torch.jit.script(fused)
