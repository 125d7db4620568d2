"""customconv.nn.Conv2d is a drop-in for torch.nn.Conv2d: same constructor
arguments, parameter names and state_dict; the same outputs and gradients."""

import pytest
import torch

import customconv
from testlib import DEVICES, make_tensor

# torch.nn.Conv2d warns about padding="same" with even kernels; so be it.
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same'")

# Constructor arguments (in_channels, out_channels, kernel_size, **kwargs) and an input size.
MODULE_CASES = {
    "defaults": ((3, 5, 3), {}, (9, 8)),
    "int_padding": ((4, 6, 3), dict(padding=2), (7, 7)),
    "tuple_args": ((4, 6, (3, 2)), dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2)), (9, 10)),
    "no_bias": ((3, 4, 2), dict(bias=False), (6, 5)),
    "groups": ((6, 9, 3), dict(groups=3, padding=1), (7, 6)),
    "depthwise": ((4, 8, (2, 3)), dict(groups=4, stride=2), (8, 9)),
    "dilation": ((2, 3, 3), dict(dilation=2, padding=2), (9, 9)),
    "padding_valid": ((3, 4, (2, 3)), dict(padding="valid"), (6, 7)),
    "padding_same_odd": ((3, 4, 3), dict(padding="same"), (6, 7)),
    "padding_same_even_kernel": ((3, 4, (4, 2)), dict(padding="same"), (6, 7)),
    "padding_same_dilated": ((4, 4, (2, 3)), dict(padding="same", dilation=(3, 2), groups=2), (8, 9)),
    "reflect": ((3, 4, 3), dict(padding=1, padding_mode="reflect"), (6, 7)),
    "reflect_asymmetric": ((3, 4, (3, 2)), dict(padding=(2, 1), padding_mode="reflect", stride=2), (6, 7)),
    "replicate": ((3, 4, 3), dict(padding=2, padding_mode="replicate", dilation=(1, 2)), (6, 7)),
    "circular": ((3, 4, 3), dict(padding=(1, 2), padding_mode="circular"), (6, 7)),
    "circular_grouped_no_bias": ((4, 6, 3), dict(padding=1, padding_mode="circular", groups=2,
                                                 bias=False), (5, 5)),
    "same_reflect": ((3, 4, (3, 4)), dict(padding="same", padding_mode="reflect"), (6, 7)),
    "same_replicate": ((3, 4, 2), dict(padding="same", padding_mode="replicate"), (5, 6)),
    "same_circular": ((3, 4, 3), dict(padding="same", padding_mode="circular", dilation=2), (7, 7)),
    "zeros_explicit": ((2, 2, 1), dict(padding=0, padding_mode="zeros"), (4, 4)),
}


def pair(case, device, dtype=torch.float64):
    args, kwargs, _ = MODULE_CASES[case]
    theirs = torch.nn.Conv2d(*args, **kwargs).to(device, dtype)
    ours = customconv.nn.Conv2d(*args, **kwargs).to(device, dtype)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


@pytest.mark.parametrize("case", sorted(MODULE_CASES))
def test_nn_conv2d_has_the_parameters_and_state_dict_of_torch_nn_conv2d(case):
    args, kwargs, _ = MODULE_CASES[case]
    theirs = torch.nn.Conv2d(*args, **kwargs)
    ours = customconv.nn.Conv2d(*args, **kwargs)
    assert isinstance(ours, torch.nn.Conv2d)
    assert [(n, p.shape) for n, p in ours.named_parameters()] == \
        [(n, p.shape) for n, p in theirs.named_parameters()]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert ours.extra_repr() == theirs.extra_repr()
    # A torch.nn.Conv2d's state_dict loads strictly and the values arrive.
    result = ours.load_state_dict(theirs.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    for name, p in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], p), name
    # ... and the other way round.
    theirs.load_state_dict(customconv.nn.Conv2d(*args, **kwargs).state_dict(), strict=True)


@pytest.mark.parametrize("case", sorted(MODULE_CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_nn_conv2d_outputs_and_gradients_match_torch_nn_conv2d(device, case, gen, seed):
    ours, theirs = pair(case, device)
    size = MODULE_CASES[case][2]
    x = make_tensor((2, ours.in_channels) + size, torch.float64, device, gen=gen, requires_grad=True)
    out, ref = ours(x), theirs(x)
    ctx = f"seed={seed} case={case} device={device}"
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10, msg=lambda m: f"{ctx}: output: {m}")
    grad = make_tensor(ref.shape, torch.float64, device, "transposed", gen)
    names = ["input"] + [n for n, _ in ours.named_parameters()]
    g_ours = torch.autograd.grad(out, [x] + list(ours.parameters()), grad)
    g_theirs = torch.autograd.grad(ref, [x] + list(theirs.parameters()), grad)
    for name, a, b in zip(names, g_ours, g_theirs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10,
                                   msg=lambda m: f"{ctx}: grad of {name}: {m}")


@pytest.mark.parametrize("case", ["groups", "reflect", "same_circular", "tuple_args"])
@pytest.mark.parametrize("device", DEVICES)
def test_nn_conv2d_in_float32_matches_torch_nn_conv2d_in_float64(device, case, gen, seed):
    ours, theirs = pair(case, device, torch.float32)
    theirs = theirs.double()  # the float64 reference (no TF32) on the same values
    size = MODULE_CASES[case][2]
    x = make_tensor((3, ours.in_channels) + size, torch.float32, device, gen=gen, requires_grad=True)
    x64 = x.detach().double().requires_grad_()
    out, ref = ours(x), theirs(x64)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    grad = make_tensor(ref.shape, torch.float32, device, gen=gen)
    g_ours = torch.autograd.grad(out, [x] + list(ours.parameters()), grad)
    g_ref = torch.autograd.grad(ref, [x64] + list(theirs.parameters()), grad.double())
    for a, b in zip(g_ours, g_ref):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4, msg=lambda m: f"seed={seed}: {m}")


@pytest.mark.parametrize("device", DEVICES)
def test_nn_conv2d_accepts_unbatched_input_like_torch_nn_conv2d(device, gen):
    ours, theirs = pair("reflect_asymmetric", device)
    x = make_tensor((3, 6, 7), torch.float64, device, gen=gen)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-10, atol=1e-10)


def test_nn_conv2d_refuses_what_torch_nn_conv2d_refuses():
    with pytest.raises(ValueError, match="padding='same'"):
        customconv.nn.Conv2d(3, 4, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="padding_mode"):
        customconv.nn.Conv2d(3, 4, 3, padding_mode="mirror")
    with pytest.raises(ValueError, match="groups"):
        customconv.nn.Conv2d(3, 4, 3, groups=2)


@pytest.mark.parametrize("device", DEVICES)
def test_nn_conv2d_trains_like_torch_nn_conv2d(device, gen):
    # A few SGD steps on both keep the parameters equal.
    ours, theirs = pair("groups", device)
    opt_a = torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9)
    opt_b = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9)
    for _ in range(3):
        x = make_tensor((4, 6, 7, 6), torch.float64, device, gen=gen)
        target = make_tensor((4, 9, 7, 6), torch.float64, device, gen=gen)
        for m, opt in ((ours, opt_a), (theirs, opt_b)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), target).backward()
            opt.step()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=lambda m: f"{name}: {m}")
