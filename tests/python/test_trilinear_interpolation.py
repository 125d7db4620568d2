"""customconv::trilinear_interpolation against its formula written with
PyTorch's ops (float64, autograd for the gradients): forward and the
gradients of feats and points for N from 0 to 10**6, F from 1 to 2048
(sizes that break every vector width included), points inside and outside
[-1, 1], non-contiguous tensors, NaN and Inf; on every supported device and
dtype; its backward op called directly; the training pair (forward with
the derivatives by the points, backward from them) called directly and chosen
by autograd; deterministic gradients; and customconv.nn.TrilinearInterpolation."""

import pytest
import torch

import customconv
from testlib import (
    DEVICE_DTYPES,
    DEVICES,
    TrilinearConfig,
    assert_deterministic,
    assert_matches,
    capture_and_replay,
    check_against_reference,
    check_under_no_grad_and_inference_mode,
    cuda,
    f64,
    make_points,
    make_tensor,
    ops,
    random_trilinear_config,
    trilinear_reductions,
    trilinear_reference,
    trilinear_torch,
)

N_RANDOM = 30


def make_inputs(cfg, device, dtype, gen, need=("feats", "points")):
    feats = make_tensor(cfg.feats_shape, dtype, device, cfg.feats_layout, gen, "feats" in need)
    points = make_points(cfg, dtype, device, gen, "points" in need)
    return feats, points


def call_op(call):
    if call == "ops":
        return ops.trilinear_interpolation
    if call == "functional":
        return customconv.trilinear_interpolation
    module = customconv.nn.TrilinearInterpolation()
    return lambda feats, points: module(feats, points)


def run_trilinear_case(cfg, device, dtype, gen, ctx, call="ops", need=("feats", "points"),
                       nonfinite=None, inputs=None):
    """Runs cfg forward and backward; checks every result against trilinear_torch."""
    feats, points = inputs if inputs is not None else make_inputs(cfg, device, dtype, gen, need)
    out = check_against_reference(call_op(call), dict(feats=feats, points=points),
                                  lambda g: trilinear_reference(feats, points, g),
                                  trilinear_reductions(cfg.features), dtype, device, gen, ctx,
                                  cfg.grad_layout, nonfinite)
    assert out.shape == (cfg.n, cfg.features), ctx


@pytest.mark.parametrize("idx", range(N_RANDOM))
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_trilinear_matches_formula_on_random_configs(device, dtype, idx, rng, gen, seed):
    cfg = random_trilinear_config(rng)
    call = rng.choice(["ops", "ops", "functional", "module"])
    ctx = f"seed={seed} {device} {dtype} call={call} {cfg}"
    run_trilinear_case(cfg, device, dtype, gen, ctx, call)


EDGE_CASES = {
    "n0": dict(n=0, features=5),
    "n0_f2048": dict(n=0, features=2048),
    "n1": dict(n=1),
    "f0": dict(n=4, features=0),
    "f2048": dict(n=5, features=2048),
    "points_inside": dict(points="inside", n=64),
    "points_outside": dict(points="outside", n=64),
    "points_normal": dict(points="normal", n=64),
    "points_on_corners_edges_faces": dict(points="grid", n=64),
    "feats_transposed": dict(feats_layout="transposed", n=9, features=33),
    "feats_channels_last": dict(feats_layout="channels_last", n=9, features=7),
    "feats_sliced": dict(feats_layout="sliced", n=9, features=5),
    "feats_expanded": dict(feats_layout="expanded", n=9, features=3),
    "feats_offset": dict(feats_layout="offset", n=9, features=64),
    "points_transposed": dict(points_layout="transposed", n=9),
    "points_sliced": dict(points_layout="sliced", n=9),
    "points_expanded": dict(points_layout="expanded", n=9),
    "points_offset": dict(points_layout="offset", n=9),
    "everything_offset": dict(feats_layout="offset", points_layout="offset",
                              grad_layout="offset", n=17, features=1023),
    "grad_transposed": dict(grad_layout="transposed", n=9, features=5),
    "grad_expanded": dict(grad_layout="expanded", n=9, features=33),
}


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_trilinear_matches_formula_on_edge_cases(device, dtype, case, rng, gen, seed):
    cfg = random_trilinear_config(rng, **EDGE_CASES[case])
    ctx = f"seed={seed} {device} {dtype} case={case} {cfg}"
    run_trilinear_case(cfg, device, dtype, gen, ctx)


# 255, 284 and 285: 16-bit rows of odd length on the CUDA kernels that stage
# groups of points in shared memory (up to 284 features), and just past them.
@pytest.mark.parametrize("layout", ["contiguous", "offset"])
@pytest.mark.parametrize("features", [1, 3, 5, 7, 33, 255, 284, 285, 1023])
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_trilinear_matches_formula_for_feature_counts_that_break_vector_alignment(
        device, dtype, features, layout, rng, gen, seed):
    # Misaligned rows, and a misaligned start (offset) as well as plain
    # contiguous; the point count is not a multiple of 8.
    cfg = random_trilinear_config(rng, n=max(3, 4096 // features) + 1, features=features,
                                  feats_layout=layout, grad_layout=layout, points="outside")
    ctx = f"seed={seed} {device} {dtype} {cfg}"
    run_trilinear_case(cfg, device, dtype, gen, ctx)


@pytest.mark.parametrize("device", DEVICES)
def test_trilinear_matches_formula_for_a_million_points(device, gen, seed):
    cfg = TrilinearConfig(n=10**6, features=1, points="outside")
    run_trilinear_case(cfg, device, torch.float32, gen, f"seed={seed} {device} {cfg}")


def with_nonfinite(t, gen, fraction=0.05):
    """A copy of t with NaN, +Inf and -Inf at random places."""
    t = t.detach().clone()
    values = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=t.dtype)
    mask = torch.rand(t.shape, generator=gen) < fraction
    pick = torch.randint(0, 3, t.shape, generator=gen)
    t[mask.to(t.device)] = values[pick[mask]].to(t.device)
    return t.requires_grad_()


@pytest.mark.parametrize("where", ["feats", "points", "both"])
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_trilinear_propagates_nan_and_inf_like_the_formula(device, dtype, where, gen, seed):
    # Points on the grid {-1, 0, 1} give weights of exactly 0, so Inf in a
    # feature of weight 0 gives NaN (0 * Inf), as the formula does.
    cfg = TrilinearConfig(n=200, features=9, points="grid" if where == "feats" else "outside")
    feats, points = make_inputs(cfg, device, dtype, gen)
    if where in ("feats", "both"):
        feats = with_nonfinite(feats, gen)
    if where in ("points", "both"):
        points = with_nonfinite(points, gen, fraction=0.1)
    ctx = f"seed={seed} {device} {dtype} non-finite in {where} {cfg}"
    # The gradient of a point sums products over corners and features; where a
    # coordinate is infinite, the order of that sum (per corner first, as
    # autograd does, or per feature first) decides between Inf and NaN.
    modes = dict(output="exact", grad_feats="exact",
                 grad_points="exact" if where == "feats" else "inf_or_nan")
    run_trilinear_case(cfg, device, dtype, gen, ctx, nonfinite=modes, inputs=(feats, points))


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_trilinear_at_the_corners_returns_the_corner_features_exactly(device, dtype, gen):
    feats = make_tensor((8, 8, 19), dtype, device, gen=gen)
    corners = torch.tensor([[i, j, k] for i in (-1, 1) for j in (-1, 1) for k in (-1, 1)],
                           dtype=dtype, device=device)
    out = ops.trilinear_interpolation(feats, corners)
    for c in range(8):
        assert torch.equal(out[c], feats[c, c]), f"corner {c} of {device} {dtype}"


@pytest.mark.parametrize("device", DEVICES)
def test_trilinear_extrapolates_outside_the_cube_with_the_same_formula(device):
    # One feature, corner values 0..7: out = sum_c weight_c * c, which is
    # 4u + 2v + w (linear), also far outside [-1, 1].
    pts = [[3.0, -2.0, 0.5], [-5.0, 7.0, -1.5], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1e3, -1e3, 2.0]]
    points = torch.tensor(pts, dtype=torch.float64, device=device)
    feats = torch.arange(8, dtype=torch.float64, device=device).view(1, 8, 1).expand(len(pts), 8, 1)
    u = (points.cpu() + 1) / 2
    want = (4 * u[:, 0] + 2 * u[:, 1] + u[:, 2])[:, None]
    torch.testing.assert_close(ops.trilinear_interpolation(feats, points).cpu(), want,
                               rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("need", [("feats",), ("points",), ()])
@pytest.mark.parametrize("device", DEVICES)
def test_trilinear_gradients_only_of_inputs_that_require_grad(device, need, rng, gen, seed):
    cfg = random_trilinear_config(rng, n=20, features=6)
    ctx = f"seed={seed} {device} requires_grad={need} {cfg}"
    run_trilinear_case(cfg, device, torch.float64, gen, ctx, need=need)


@pytest.mark.parametrize("device", DEVICES)
def test_trilinear_backward_op_called_directly_matches_the_formula(device, rng, gen, seed):
    cfg = random_trilinear_config(rng, n=30, features=33, points="outside")
    feats, points = make_inputs(cfg, torch.float64, device, gen, need=())
    go = make_tensor((cfg.n, cfg.features), torch.float64, device, cfg.grad_layout, gen)
    ref = trilinear_reference(feats, points, go)
    grad_feats, grad_points = ops.trilinear_interpolation_backward(go, feats, points)
    for name, g in (("grad_feats", grad_feats), ("grad_points", grad_points)):
        torch.testing.assert_close(g.cpu(), ref[name][0], rtol=1e-10, atol=1e-10,
                                   msg=lambda m: f"seed={seed} {name} {cfg}: {m}")


def point_derivatives_reference(feats, points):
    """d out[n, f] / d points[n, a] (N, 3, F) in float64, and its bounds (the
    same sums of absolute values)."""
    feats, points = f64(feats), f64(points)
    x = feats.reshape(feats.shape[0], 2, 2, 2, feats.shape[2])  # corner (i, j, k)
    u = (points + 1) / 2
    wts = [torch.stack([1 - u[:, a], u[:, a]], 1) for a in range(3)]  # (N, 2) each
    mag = [t.abs() for t in wts]
    ax = x.abs()
    want = 0.5 * torch.stack([
        torch.einsum("nj,nk,njkf->nf", wts[1], wts[2], x[:, 1] - x[:, 0]),
        torch.einsum("ni,nk,nikf->nf", wts[0], wts[2], x[:, :, 1] - x[:, :, 0]),
        torch.einsum("ni,nj,nijf->nf", wts[0], wts[1], x[:, :, :, 1] - x[:, :, :, 0])], 1)
    bound = 0.5 * torch.stack([
        torch.einsum("nj,nk,njkf->nf", mag[1], mag[2], ax[:, 1] + ax[:, 0]),
        torch.einsum("ni,nk,nikf->nf", mag[0], mag[2], ax[:, :, 1] + ax[:, :, 0]),
        torch.einsum("ni,nj,nijf->nf", mag[0], mag[1], ax[:, :, :, 1] + ax[:, :, :, 0])], 1)
    return want, bound


def misaligned_copy(t):
    """t's values in a contiguous tensor that starts one element past its
    storage (not 16-byte aligned)."""
    return torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:].view(t.shape).copy_(t)


# The training pair: trilinear_interpolation_with_derivatives returns the
# output (bitwise the plain forward's) and the derivatives by the points in the
# accumulation type; trilinear_interpolation_backward_from_derivatives returns
# what trilinear_interpolation_backward does, without reading feats. Feature
# counts and layouts reach every CUDA kernel variant (16-byte packs, staged
# groups, one element per access).
@pytest.mark.parametrize("layout", ["contiguous", "offset"])
@pytest.mark.parametrize("features", [1, 7, 8, 33, 255, 256])
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_trilinear_training_pair_called_directly_matches_the_formula(
        device, dtype, features, layout, rng, gen, seed):
    cfg = random_trilinear_config(rng, n=max(3, 2048 // features) + 1, features=features,
                                  feats_layout=layout, grad_layout=layout, points="outside")
    ctx = f"seed={seed} {device} {dtype} {cfg}"
    feats, points = make_inputs(cfg, device, dtype, gen, need=())
    out, deriv = ops.trilinear_interpolation_with_derivatives(feats, points)
    acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    assert deriv.dtype == acc and deriv.shape == (cfg.n, 3, features), ctx
    torch.testing.assert_close(out, ops.trilinear_interpolation(feats, points), rtol=0, atol=0,
                               msg=lambda m: f"output [{ctx}]: {m}")
    want, bound = point_derivatives_reference(feats, points)
    assert_matches(deriv.cpu(), want, bound, acc, 16, "derivatives", ctx)

    go = make_tensor((cfg.n, features), dtype, device, cfg.grad_layout, gen)
    ref = trilinear_reference(feats, points, go)
    for d in (deriv, misaligned_copy(deriv)):
        grads = ops.trilinear_interpolation_backward_from_derivatives(go, d, points)
        for name, got in zip(("grad_feats", "grad_points"), grads):
            want, bound = ref[name]
            assert_matches(got.cpu(), want, bound, dtype, trilinear_reductions(features)[name],
                           name, ctx)


# grad_feats alone, for points that need no gradient: weight_c(points) * grad_output.
@pytest.mark.parametrize("layout", ["contiguous", "offset"])
@pytest.mark.parametrize("features", [1, 7, 8, 33, 255, 256])
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_trilinear_grad_feats_op_called_directly_matches_the_formula(
        device, dtype, features, layout, rng, gen, seed):
    cfg = random_trilinear_config(rng, n=max(3, 2048 // features) + 1, features=features,
                                  grad_layout=layout, points="outside")
    ctx = f"seed={seed} {device} {dtype} {cfg}"
    feats, points = make_inputs(cfg, device, dtype, gen, need=())
    go = make_tensor((cfg.n, features), dtype, device, cfg.grad_layout, gen)
    want, bound = trilinear_reference(feats, points, go)["grad_feats"]
    got = ops.trilinear_interpolation_grad_feats(go, points)
    assert_matches(got.cpu(), want, bound, dtype, trilinear_reductions(features)["grad_feats"],
                   "grad_feats", ctx)


def saved_shapes(feats, points):
    """The shapes of the tensors autograd keeps for the backward of
    trilinear_interpolation(feats, points)."""
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ops.trilinear_interpolation(feats, points)
    return shapes


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_trilinear_autograd_keeps_only_what_its_backward_reads(
        device, dtype, gen):
    # On CUDA, float32 and float64 keep the (N, 3, F) derivatives (besides
    # references to feats and points) when points needs a gradient; 16-bit
    # dtypes (float32 derivatives) and the CPU (where writing fresh memory
    # costs more) do not. A points without a gradient is all that is kept
    # when only feats needs one.
    feats = make_tensor((5, 8, 6), dtype, device, gen=gen, requires_grad=True)
    points = make_tensor((5, 3), dtype, device, gen=gen, requires_grad=True)
    wide = device == "cuda" and dtype in (torch.float32, torch.float64)
    assert saved_shapes(feats, points) == [(5, 8, 6), (5, 3)] + ([(5, 3, 6)] if wide else [])
    assert saved_shapes(feats, points.detach()) == [(5, 3)]


@pytest.mark.parametrize("device", DEVICES)
def test_trilinear_under_inference_mode_and_no_grad_matches_the_formula(device, gen):
    feats = make_tensor((7, 8, 5), torch.float64, device, "transposed", gen, True)
    points = make_tensor((7, 3), torch.float64, device, gen=gen, requires_grad=True)
    want = trilinear_torch(f64(feats), f64(points))
    check_under_no_grad_and_inference_mode(lambda: ops.trilinear_interpolation(feats, points), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("device", DEVICES)
def test_trilinear_gradients_are_deterministic(device, dtype, gen):
    if dtype == torch.float16 and device == "cpu":
        dtype = torch.bfloat16
    feats = make_tensor((2048, 8, 129), dtype, device, gen=gen, requires_grad=True)
    points = make_tensor((2048, 3), dtype, device, gen=gen, requires_grad=True)
    g = make_tensor((2048, 129), dtype, device, gen=gen)

    def grads():
        out = ops.trilinear_interpolation(feats, points)
        return (out,) + torch.autograd.grad(out, (feats, points), g)

    assert_deterministic(grads, f"trilinear_interpolation on {device} in {dtype}")


@pytest.mark.parametrize("device", DEVICES)
def test_nn_trilinear_interpolation_has_no_parameters_and_matches_the_op(device, gen):
    module = customconv.nn.TrilinearInterpolation()
    assert list(module.parameters()) == [] and list(module.state_dict()) == []
    feats = make_tensor((6, 8, 4), torch.float64, device, gen=gen, requires_grad=True)
    points = make_tensor((6, 3), torch.float64, device, gen=gen, requires_grad=True)
    out = module(feats, points)
    torch.testing.assert_close(out, ops.trilinear_interpolation(feats, points), rtol=0, atol=0)
    g = make_tensor(out.shape, torch.float64, device, gen=gen)
    ref = trilinear_reference(feats, points, g)
    for name, got in zip(("grad_feats", "grad_points"),
                         torch.autograd.grad(out, (feats, points), g)):
        torch.testing.assert_close(got.cpu(), ref[name][0], rtol=1e-12, atol=1e-12)


@cuda
def test_trilinear_captures_into_a_cuda_graph_and_replays_with_new_inputs(gen):
    dt = torch.float64
    feats = make_tensor((100, 8, 33), dt, "cuda", gen=gen)
    points = make_tensor((100, 3), dt, "cuda", gen=gen)
    go = make_tensor((100, 33), dt, "cuda", gen=gen)

    def step():
        return (ops.trilinear_interpolation(feats, points),
                *ops.trilinear_interpolation_backward(go, feats, points))

    results, _graph = capture_and_replay(step, (feats, points, go), gen)
    ref = trilinear_reference(feats, points, go)
    for i, (got, name) in enumerate(zip(results, ("output", "grad_feats", "grad_points"))):
        torch.testing.assert_close(got.cpu(), ref[name][0], rtol=1e-10, atol=1e-10,
                                   msg=lambda m: f"result {i}: {m}")
