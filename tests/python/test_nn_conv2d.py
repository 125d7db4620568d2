"""customconv.nn.Conv2d is a drop-in for torch.nn.Conv2d: same constructor
arguments, parameter names and state_dict; the same outputs and gradients."""

import pytest
import torch

import customconv
from testlib import (
    DEVICES,
    check_drop_in_matches,
    check_drop_in_state_dict,
    check_float32_drop_in_matches_float64,
    check_trains_alike,
    make_tensor,
)

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
    check_drop_in_state_dict(ours, theirs, lambda: customconv.nn.Conv2d(*args, **kwargs))


@pytest.mark.parametrize("case", sorted(MODULE_CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_nn_conv2d_outputs_and_gradients_match_torch_nn_conv2d(device, case, gen, seed):
    ours, theirs = pair(case, device)
    check_drop_in_matches(ours, theirs, MODULE_CASES[case][2], device, gen,
                          f"seed={seed} case={case} device={device}")


@pytest.mark.parametrize("case", ["groups", "reflect", "same_circular", "tuple_args"])
@pytest.mark.parametrize("device", DEVICES)
def test_nn_conv2d_in_float32_matches_torch_nn_conv2d_in_float64(device, case, gen, seed):
    ours, theirs = pair(case, device, torch.float32)
    theirs = theirs.double()  # the float64 reference (no TF32) on the same values
    check_float32_drop_in_matches_float64(ours, theirs, MODULE_CASES[case][2], device, gen, seed)


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
    check_trains_alike(ours, theirs, (4, 6, 7, 6), (4, 9, 7, 6), device, gen)
