"""Unit 04, the backward pass: normref.backward against torch autograd, finite
differences and the course's worked facts; the checks against right and wrong code."""

import numpy as np
import pytest
import torch

from normref import backward, batchnorm
from normref.checks import (
    CheckFailed,
    _registry,
    _runner,
    backward_judges,
    backward_probes,
    check_blind_check_answer,
    check_gn_zero_sums_answer,
    check_group_norm_backward_dx,
    check_group_norm_backward_params,
    check_layer_norm_backward_dx,
    check_layer_norm_backward_params,
    check_layer_norm_forward,
    check_rms_norm_backward_dgamma,
    check_rms_norm_backward_dx,
    check_rms_zero_answer,
)

SHAPES = [(4,), (1, 8), (5, 8), (2, 3, 16), (2, 2, 3, 8), (3, 1, 2, 2, 64)]


def _inputs(seed, shape, dtype=np.float64, loc=0.0, scale=1.0):
    rng = np.random.default_rng(seed)
    d = shape[-1]
    x = rng.normal(loc, scale, size=shape).astype(dtype)
    gamma = rng.normal(1.0, 0.5, size=d).astype(dtype)
    beta = rng.normal(size=d).astype(dtype)
    dy = rng.normal(size=shape).astype(dtype)
    return x, gamma, beta, dy


def _torch_leaves(*arrays):
    return [torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True) for a in arrays]


def _relative_error(a, b):
    """max|a - b| / max(1e-8, |a| + |b|), the maximum taken over all entries."""
    return np.max(np.abs(a - b)) / max(1e-8, np.max(np.abs(a) + np.abs(b)))


def _centred_differences(loss, array, h=1e-5):
    """d loss / d array, one entry at a time, perturbing `array` in place."""
    grad = np.zeros_like(array)
    for index in np.ndindex(array.shape):
        start = array[index]
        array[index] = start + h
        up = loss()
        array[index] = start - h
        down = loss()
        array[index] = start
        grad[index] = (up - down) / (2 * h)
    return grad


# ---------------------------------------------------------------- vs torch

@pytest.mark.parametrize("seed, shape", list(enumerate(SHAPES)))
def test_forward_matches_torch_native_layer_norm(seed, shape):
    x, gamma, beta, _ = _inputs(seed, shape, loc=2.0, scale=3.0)
    y, cache = backward.layer_norm_forward(x, gamma, beta)
    d = shape[-1]
    out, mean, rstd = torch.native_layer_norm(
        torch.tensor(x), (d,), torch.tensor(gamma), torch.tensor(beta), 1e-5)
    np.testing.assert_allclose(y, out.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cache["mean"], mean.numpy()[..., 0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cache["rstd"], rstd.numpy()[..., 0], rtol=1e-12)


@pytest.mark.parametrize("seed, shape", list(enumerate(SHAPES)))
@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_layer_norm_backward_matches_torch_autograd(seed, shape, eps):
    x, gamma, beta, dy = _inputs(seed, shape, loc=-1.0, scale=2.0)
    _, cache = backward.layer_norm_forward(x, gamma, beta, eps)
    dx, dgamma, dbeta = backward.layer_norm_backward(dy, cache)
    xt, gt, bt = _torch_leaves(x, gamma, beta)
    torch.nn.functional.layer_norm(xt, (shape[-1],), gt, bt, eps).backward(torch.tensor(dy))
    for ours, theirs in [(dx, xt), (dgamma, gt), (dbeta, bt)]:
        assert ours.shape == theirs.grad.shape
        np.testing.assert_allclose(ours, theirs.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed, shape", list(enumerate(SHAPES)))
def test_rms_norm_backward_matches_torch_autograd(seed, shape):
    x, gamma, _, dy = _inputs(seed, shape, loc=1.5)
    dx, dgamma = backward.rms_norm_backward(dy, x, gamma)
    xt, gt = _torch_leaves(x, gamma)
    torch.nn.functional.rms_norm(xt, (shape[-1],), gt, 1e-5).backward(torch.tensor(dy))
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dgamma, gt.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_float32_in_float32_out_at_float64_accuracy():
    x, gamma, beta, dy = _inputs(7, (6, 32), dtype=np.float32)
    y, cache = backward.layer_norm_forward(x, gamma, beta)
    grads = backward.layer_norm_backward(dy, cache)
    assert y.dtype == np.float32 and all(g.dtype == np.float32 for g in grads)
    xt, gt, bt = _torch_leaves(x, gamma, beta)
    y_torch = torch.nn.functional.layer_norm(xt, (32,), gt, bt, 1e-5)
    y_torch.backward(torch.tensor(dy, dtype=torch.float64))
    for ours, theirs in zip(grads, (xt, gt, bt)):
        np.testing.assert_allclose(ours, theirs.grad.numpy(), rtol=1e-6, atol=1e-6)
    rms_grads = backward.rms_norm_backward(dy, x, gamma)
    assert all(g.dtype == np.float32 for g in rms_grads)


# ---------------------------------------------------------------- the cache

def test_cache_is_plain_arrays_without_x_hat():
    x, gamma, beta, _ = _inputs(3, (2, 3, 16))
    _, cache = backward.layer_norm_forward(x, gamma, beta)
    assert set(cache) == {"x", "gamma", "mean", "rstd"}
    assert all(type(value) is np.ndarray for value in cache.values())
    assert cache["mean"].shape == cache["rstd"].shape == (2, 3)
    # It must survive the grader's wire, which refuses pickled objects.
    import io

    buffer = io.BytesIO()
    np.savez(buffer, **cache)
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as loaded:
        restored = {key: loaded[key] for key in loaded.files}
    dy = np.ones_like(x)
    for a, b in zip(backward.layer_norm_backward(dy, cache),
                    backward.layer_norm_backward(dy, restored)):
        np.testing.assert_array_equal(a, b)


def test_syllabus_cache_for_example_a():
    _, cache = backward.layer_norm_forward(np.array([2.0, 4.0, 6.0, 8.0]), np.ones(4), np.zeros(4))
    assert cache["mean"] == pytest.approx(5.0)
    assert cache["rstd"] == pytest.approx(1 / np.sqrt(5.0 + 1e-5), rel=1e-14)


def test_syllabus_formulas_written_out():
    x, gamma, beta, dy = _inputs(11, (7, 12))
    _, cache = backward.layer_norm_forward(x, gamma, beta)
    dx, dgamma, dbeta = backward.layer_norm_backward(dy, cache)
    rstd = 1 / np.sqrt(x.var(axis=-1, keepdims=True) + 1e-5)
    x_hat = (x - x.mean(axis=-1, keepdims=True)) * rstd
    g = dy * gamma
    np.testing.assert_allclose(dbeta, dy.sum(axis=0), rtol=1e-13)
    np.testing.assert_allclose(dgamma, (dy * x_hat).sum(axis=0), rtol=1e-13)
    expected = rstd * (g - g.mean(-1, keepdims=True)
                       - x_hat * (g * x_hat).mean(-1, keepdims=True))
    np.testing.assert_allclose(dx, expected, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------- finite differences

FD_CASES = [(seed, shape) for seed, shape in enumerate([(8,), (3, 8), (2, 3, 16), (2, 2, 2, 8)])]


@pytest.mark.parametrize("seed, shape", FD_CASES)
def test_layer_norm_gradient_check_lands_in_the_syllabus_band(seed, shape):
    """Centred differences, h = 1e-5, float64: the relative error (max-abs form)
    measures 2e-12 .. 7e-11 on these cases, inside the syllabus's 1e-12 .. 1e-8."""
    x, gamma, beta, dy = _inputs(seed, shape)

    def loss():
        return np.sum(dy * backward.layer_norm_forward(x, gamma, beta)[0])

    _, cache = backward.layer_norm_forward(x, gamma, beta)
    analytic = backward.layer_norm_backward(dy, cache)
    for grad, wrt in zip(analytic, (x, gamma, beta)):
        error = _relative_error(grad, _centred_differences(loss, wrt))
        assert 1e-12 < error < 1e-8, error


@pytest.mark.parametrize("seed, shape", FD_CASES)
def test_rms_gradient_check_lands_in_the_syllabus_band(seed, shape):
    x, gamma, _, dy = _inputs(seed, shape, loc=1.0)

    def loss():
        return np.sum(dy * gamma * x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + 1e-5))

    for grad, wrt in zip(backward.rms_norm_backward(dy, x, gamma), (x, gamma)):
        error = _relative_error(grad, _centred_differences(loss, wrt))
        assert 1e-12 < error < 1e-8, error


# ---------------------------------------------------------------- the two properties

@pytest.mark.parametrize("seed, shape", list(enumerate(SHAPES)))
def test_dx_sums_to_zero_over_each_token(seed, shape):
    x, gamma, beta, dy = _inputs(seed, shape, loc=5.0, scale=2.0)
    dx, _, _ = backward.layer_norm_backward(dy, backward.layer_norm_forward(x, gamma, beta)[1])
    assert np.max(np.abs(dx.sum(axis=-1))) < 1e-13 * shape[-1] * np.max(np.abs(dx))


@pytest.mark.parametrize("seed, shape", list(enumerate(SHAPES)))
def test_dx_is_orthogonal_to_x_hat_up_to_eps(seed, shape):
    """dx . x_hat = rstd * eps / (var + eps) * sum(g * x_hat): 0 (to round-off) when
    eps = 0, and otherwise as small as eps is next to the token's variance."""
    x, gamma, beta, dy = _inputs(seed, shape, scale=0.5)
    for eps in (0.0, 1e-5):
        _, cache = backward.layer_norm_forward(x, gamma, beta, eps)
        dx, _, _ = backward.layer_norm_backward(dy, cache)
        rstd = cache["rstd"]
        x_hat = (x - cache["mean"][..., None]) * rstd[..., None]
        dot = (dx * x_hat).sum(axis=-1)
        var = 1 / rstd**2 - eps
        predicted = rstd * eps / (var + eps) * (dy * gamma * x_hat).sum(axis=-1)
        scale = np.linalg.norm(dx, axis=-1) * np.linalg.norm(x_hat, axis=-1)
        np.testing.assert_allclose(dot, predicted, rtol=1e-6, atol=1e-13 * scale.max())


def test_rms_dx_is_orthogonal_to_x_when_eps_is_zero():
    x, gamma, _, dy = _inputs(2, (4, 16), loc=1.0)
    dx, _ = backward.rms_norm_backward(dy, x, gamma, eps=0.0)
    assert np.max(np.abs((dx * x).sum(axis=-1))) < 1e-13 * np.abs(dx).max() * np.abs(x).max() * 16


# ---------------------------------------------------------------- the checks

def _forward_tuple_cache(x, gamma, beta, eps=1e-5):
    """A correct forward whose cache is a tuple (allowed for the backward checks)."""
    y, cache = backward.layer_norm_forward(x, gamma, beta, eps)
    return y, (cache["x"], cache["gamma"], cache["mean"], cache["rstd"])


def _backward_via_jacobian(dy, cache):
    """Unusual but right: build each token's full Jacobian, then contract it."""
    x, gamma, mean, rstd = cache
    d = x.shape[-1]
    x_hat = (x - mean[..., None]) * rstd[..., None]
    jacobian = rstd[..., None, None] * (
        np.eye(d) - 1.0 / d - x_hat[..., :, None] * x_hat[..., None, :] / d)
    dx = np.einsum("...i,...ij->...j", dy * gamma, jacobian)
    dgamma = np.einsum("nd,nd->d", dy.reshape(-1, d), x_hat.reshape(-1, d))
    dbeta = np.einsum("nd->d", dy.reshape(-1, d))
    return dx, dgamma, dbeta


def _ln_backward_from(dx_rule=None, dgamma_rule=None):
    """A layer-norm backward with one piece swapped for a wrong rule."""

    def layer_norm_backward(dy, cache):
        dx, dgamma, dbeta = backward.layer_norm_backward(dy, cache)
        x_hat = (cache["x"] - cache["mean"][..., None]) * cache["rstd"][..., None]
        rstd = cache["rstd"][..., None]
        g = dy * cache["gamma"]
        if dx_rule:
            dx = dx_rule(g, dy, x_hat, rstd)
        if dgamma_rule:
            dgamma = dgamma_rule(dy, x_hat)
        return dx, dgamma, dbeta

    return layer_norm_backward


def _avg(v):
    return v.mean(axis=-1, keepdims=True)


LN_BACKWARD_MISTAKES = {
    "forgets the mean term": (
        _ln_backward_from(dx_rule=lambda g, dy, xh, r: r * (g - xh * _avg(g * xh))),
        check_layer_norm_backward_dx, "-mean(g) term"),
    "forgets the x_hat projection term": (
        _ln_backward_from(dx_rule=lambda g, dy, xh, r: r * (g - _avg(g))),
        check_layer_norm_backward_dx, "-x_hat * mean(g * x_hat) term"),
    "forgets gamma in dx": (
        _ln_backward_from(dx_rule=lambda g, dy, xh, r: r * (dy - _avg(dy) - xh * _avg(dy * xh))),
        check_layer_norm_backward_dx, "g = dy * gamma"),
    "forgets rstd in dx": (
        _ln_backward_from(dx_rule=lambda g, dy, xh, r: g - _avg(g) - xh * _avg(g * xh)),
        check_layer_norm_backward_dx, "factor rstd"),
    "dgamma summed over axis 0 only": (
        _ln_backward_from(dgamma_rule=lambda dy, xh: (dy * xh).sum(axis=0)),
        check_layer_norm_backward_params, "not only axis 0"),
    "dgamma summed over the features": (
        _ln_backward_from(dgamma_rule=lambda dy, xh: (dy * xh).sum(axis=-1)),
        check_layer_norm_backward_params, "not over the features"),
}


def test_checks_pass_the_reference():
    check_layer_norm_forward(backward.layer_norm_forward)
    check_layer_norm_backward_dx(backward.layer_norm_forward, backward.layer_norm_backward)
    check_layer_norm_backward_params(backward.layer_norm_forward, backward.layer_norm_backward)
    check_rms_norm_backward_dx(backward.rms_norm_backward)
    check_rms_norm_backward_dgamma(backward.rms_norm_backward)
    check_group_norm_backward_dx(backward.group_norm_backward)
    check_group_norm_backward_params(backward.group_norm_backward)


def test_backward_checks_pass_an_unusual_cache_and_a_jacobian_backward():
    check_layer_norm_backward_dx(_forward_tuple_cache, _backward_via_jacobian)
    check_layer_norm_backward_params(_forward_tuple_cache, _backward_via_jacobian)


def test_checks_pass_the_reference_for_any_seed():
    probes = {
        "backward_ln_forward_cache": (backward.layer_norm_forward, backward_probes._call_forward),
        "backward_ln_dx": ((backward.layer_norm_forward, backward.layer_norm_backward),
                           backward_probes._call_ln_backward),
        "backward_ln_params": ((backward.layer_norm_forward, backward.layer_norm_backward),
                               backward_probes._call_ln_backward),
        "backward_rms_dx": (backward.rms_norm_backward, backward_probes._call_rms_backward),
        "backward_rms_dgamma": (backward.rms_norm_backward,
                                backward_probes._call_rms_backward),
        "backward_gn_dx": (backward.group_norm_backward, backward_probes._call_gn_backward),
        "backward_gn_params": (backward.group_norm_backward,
                               backward_probes._call_gn_backward),
    }
    for seed in range(12):
        for name, (subject, probe) in probes.items():
            cases = _registry.make_cases(name, seed)
            outputs, errors = _runner._probe_all(subject, cases, probe)
            verdict = _registry.judge(name, cases, outputs, errors)
            assert verdict["passed"], (seed, verdict["message"])


@pytest.mark.parametrize("mistake", list(LN_BACKWARD_MISTAKES))
def test_layer_norm_backward_checks_name_the_mistake(mistake):
    wrong_backward, check, hint = LN_BACKWARD_MISTAKES[mistake]
    with pytest.raises(CheckFailed, match="Hint") as failure:
        check(backward.layer_norm_forward, wrong_backward)
    assert hint in str(failure.value)
    assert "finite difference" in str(failure.value) or "shape" in str(failure.value)


def test_dgamma_from_x_is_named():
    def wrong(dy, cache):
        dx, _, dbeta = backward.layer_norm_backward(dy, cache)
        return dx, (dy * cache["x"]).reshape(-1, dy.shape[-1]).sum(axis=0), dbeta

    with pytest.raises(CheckFailed, match="not by x"):
        check_layer_norm_backward_params(backward.layer_norm_forward, wrong)


def test_a_wrong_forward_cache_is_named():
    def stores_std(x, gamma, beta, eps=1e-5):
        y, cache = backward.layer_norm_forward(x, gamma, beta, eps)
        return y, {**cache, "rstd": 1 / cache["rstd"]}

    def stores_no_eps(x, gamma, beta, eps=1e-5):
        y, cache = backward.layer_norm_forward(x, gamma, beta, 0.0)
        return backward.layer_norm_forward(x, gamma, beta, eps)[0], cache

    with pytest.raises(CheckFailed, match="not the standard deviation"):
        check_layer_norm_forward(stores_std)
    with pytest.raises(CheckFailed, match="add eps"), np.errstate(all="ignore"):
        check_layer_norm_forward(stores_no_eps)
    with pytest.raises(CheckFailed, match="the cache is a tuple"):
        check_layer_norm_forward(_forward_tuple_cache)


def test_forward_check_accepts_keepdims_statistics():
    def keepdims(x, gamma, beta, eps=1e-5):
        y, cache = backward.layer_norm_forward(x, gamma, beta, eps)
        return y, {**cache, "mean": cache["mean"][..., None], "rstd": cache["rstd"][..., None]}

    check_layer_norm_forward(keepdims)


def _rms_from(dx_rule):
    def rms_norm_backward(dy, x, gamma, eps=1e-5):
        _, dgamma = backward.rms_norm_backward(dy, x, gamma, eps)
        rstd = 1 / np.sqrt(_avg(x**2) + eps)
        return dx_rule(dy * gamma, dy, x * rstd, rstd), dgamma

    return rms_norm_backward


@pytest.mark.parametrize("wrong, hint", [
    (_rms_from(lambda g, dy, xh, r: r * g), "-x_hat * mean(g * x_hat) term"),
    (_rms_from(lambda g, dy, xh, r: r * (g - _avg(g) - xh * _avg(g * xh))), "no -mean(g) term"),
    (_rms_from(lambda g, dy, xh, r: r * (dy - xh * _avg(dy * xh))), "g = dy * gamma"),
    (_rms_from(lambda g, dy, xh, r: r * (g - 2 * xh * _avg(g * xh))), "the 2s cancel"),
])
def test_rms_check_names_the_mistake(wrong, hint):
    with pytest.raises(CheckFailed) as failure:
        check_rms_norm_backward_dx(wrong)
    assert hint in str(failure.value)


def test_rms_check_catches_dgamma_over_the_wrong_axis():
    def wrong(dy, x, gamma, eps=1e-5):
        dx, _ = backward.rms_norm_backward(dy, x, gamma, eps)
        return dx, (dy * x / np.sqrt(_avg(x**2) + eps)).sum(axis=0)

    with pytest.raises(CheckFailed, match="not only axis 0"):
        check_rms_norm_backward_dgamma(wrong)


def test_rms_check_names_d_minus_one():
    def unbiased(dy, x, gamma, eps=1e-5):
        d = x.shape[-1]
        rstd = 1 / np.sqrt((x**2).sum(-1, keepdims=True) / (d - 1) + eps)
        g = dy * gamma
        dx = rstd * (g - x * rstd * _avg(g * x * rstd))
        return dx, backward.rms_norm_backward(dy, x, gamma, eps)[1]

    with pytest.raises(CheckFailed, match="not d - 1"):
        check_rms_norm_backward_dx(unbiased)


# ---------------------------------------------------------------- GroupNorm

GN_SHAPES = [((2, 4), 2), ((1, 6, 5), 3), ((2, 6, 3, 4), 2), ((3, 4, 2, 2, 3), 4),
             ((2, 6, 7), 1), ((2, 8, 3), 8)]


def _gn_inputs(seed, shape, loc=0.0, scale=1.0):
    rng = np.random.default_rng(seed)
    channels = shape[1]
    return (rng.normal(loc, scale, size=shape), rng.normal(1.0, 0.5, size=channels),
            rng.normal(size=channels), rng.normal(size=shape))


@pytest.mark.parametrize("seed, shape, groups", [(i, s, g) for i, (s, g) in enumerate(GN_SHAPES)])
@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_group_norm_backward_matches_torch_autograd(seed, shape, groups, eps):
    x, gamma, beta, dy = _gn_inputs(seed, shape, loc=-1.0, scale=2.0)
    grads = backward.group_norm_backward(dy, x, groups, gamma, eps)
    leaves = _torch_leaves(x, gamma, beta)
    torch.nn.functional.group_norm(leaves[0], groups, leaves[1], leaves[2], eps).backward(
        torch.tensor(dy))
    for ours, theirs in zip(grads, leaves):
        assert ours.shape == theirs.grad.shape
        np.testing.assert_allclose(ours, theirs.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed, shape, groups", [(i, s, g) for i, (s, g) in enumerate(GN_SHAPES)])
def test_group_norm_gradient_check_agrees(seed, shape, groups):
    """Groups of two values are the roughest case (relative error ~2e-8)."""
    x, gamma, beta, dy = _gn_inputs(seed, shape)

    def loss():
        return np.sum(dy * batchnorm.group_norm(x, groups, gamma, beta))

    for grad, wrt in zip(backward.group_norm_backward(dy, x, groups, gamma), (x, gamma, beta)):
        error = _relative_error(grad, _centred_differences(loss, wrt))
        assert error < 1e-7, error


def test_group_norm_with_one_group_is_layer_norm_over_channels_and_positions():
    x, gamma, beta, dy = _gn_inputs(5, (3, 4, 5))
    dx, _, _ = backward.group_norm_backward(dy, x, 1, np.ones(4))
    flat = x.reshape(3, -1)
    _, cache = backward.layer_norm_forward(flat, np.ones(20), np.zeros(20))
    expected, _, _ = backward.layer_norm_backward(dy.reshape(3, -1), cache)
    np.testing.assert_allclose(dx, expected.reshape(x.shape), rtol=1e-12, atol=1e-14)


def test_group_norm_backward_float32_and_bad_groups():
    x, gamma, _, dy = (a.astype(np.float32) for a in _gn_inputs(1, (2, 6, 4)))
    assert all(g.dtype == np.float32 for g in backward.group_norm_backward(dy, x, 3, gamma))
    with pytest.raises(ValueError, match="divisible"):
        backward.group_norm_backward(dy, x, 4, gamma)


def _gn_from(**options):
    """A group-norm backward built from the judge's variants (right when no options)."""
    def group_norm_backward(dy, x, num_groups, gamma, eps=1e-5):
        case = {"x": x, "dy": dy, "gamma": gamma, "eps": np.array(eps),
                "num_groups": np.array(num_groups)}
        _, dgamma, dbeta = backward.group_norm_backward(dy, x, num_groups, gamma, eps)
        return backward_judges._gn_dx_variant(case, **options), dgamma, dbeta

    return group_norm_backward


def test_group_norm_variant_without_options_is_right():
    check_group_norm_backward_dx(_gn_from())


def _gn_staged(dy, x, num_groups, gamma, eps=1e-5):
    """Unusual but right: CS231n-style stages through the variance and the mean,
    in torch tensors without autograd, returned as tensors."""
    x, dy = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(dy, dtype=torch.float64)
    n, c = x.shape[:2]
    xg = x.reshape(n, num_groups, -1)
    m = xg.shape[-1]
    xc = xg - xg.mean(-1, keepdim=True)
    inv = ((xc**2).mean(-1, keepdim=True) + eps).rsqrt()
    gam = torch.as_tensor(gamma, dtype=torch.float64).reshape((c,) + (1,) * (x.dim() - 2))
    dxhat = (dy * gam).reshape(n, num_groups, -1)
    dvar = (dxhat * xc).sum(-1, keepdim=True) * -0.5 * inv**3
    dmu = -(dxhat * inv).sum(-1, keepdim=True) + dvar * (-2 * xc).mean(-1, keepdim=True)
    dx = dxhat * inv + dvar * 2 * xc / m + dmu / m
    axes = [0] + list(range(2, x.dim()))
    return dx.reshape(x.shape), (dy * (xc * inv).reshape(x.shape)).sum(axes), dy.sum(axes)


def test_group_norm_checks_pass_a_staged_torch_backward():
    check_group_norm_backward_dx(_gn_staged)
    check_group_norm_backward_params(_gn_staged)


@pytest.mark.parametrize("options, hint", [
    ({"mean_term": False}, "-mean(g) term"),
    ({"projection_term": False}, "-x_hat * mean(g * x_hat) term"),
    ({"use_gamma": False}, "gamma taken per channel"),
    ({"interleaved": True}, "consecutive channels"),
    ({"ddof": 1}, "not M - 1"),
    ({"num_groups": 1}, "not to the whole example"),
])
def test_group_norm_dx_check_names_the_mistake(options, hint):
    with pytest.raises(CheckFailed, match="Hint") as failure, np.errstate(all="ignore"):
        check_group_norm_backward_dx(_gn_from(**options))
    assert hint in str(failure.value)
    assert "finite difference" in str(failure.value)


def test_group_norm_dx_check_names_per_channel_statistics():
    def per_channel(dy, x, num_groups, gamma, eps=1e-5):
        return _gn_from(num_groups=x.shape[1])(dy, x, num_groups, gamma, eps)

    with pytest.raises(CheckFailed, match="not to each channel"):
        check_group_norm_backward_dx(per_channel)


def _gn_params_from(dgamma_rule=None, dbeta_rule=None):
    def group_norm_backward(dy, x, num_groups, gamma, eps=1e-5):
        dx, dgamma, dbeta = backward.group_norm_backward(dy, x, num_groups, gamma, eps)
        x_hat = batchnorm.group_norm(x, num_groups, eps=eps)
        if dgamma_rule:
            dgamma = dgamma_rule(dy, x, x_hat)
        if dbeta_rule:
            dbeta = dbeta_rule(dy)
        return dx, dgamma, dbeta

    return group_norm_backward


def _not_channels(a):
    return (0,) + tuple(range(2, a.ndim))


@pytest.mark.parametrize("wrong, hint", [
    (_gn_params_from(dgamma_rule=lambda dy, x, xh: (dy * xh).sum(axis=0)), "axes 2 and up"),
    (_gn_params_from(dbeta_rule=lambda dy: dy.reshape(-1, dy.shape[-1]).sum(0)), "not the last"),
    (_gn_params_from(dgamma_rule=lambda dy, x, xh: (dy * x).sum(_not_channels(x))), "not by x"),
    (_gn_params_from(dbeta_rule=lambda dy: dy.mean(_not_channels(dy))), "not an average"),
    (_gn_params_from(dgamma_rule=lambda dy, x, xh: (
        dy * batchnorm.group_norm(x, x.shape[1])).sum(_not_channels(x))), "not each channel's"),
])
def test_group_norm_params_check_names_the_mistake(wrong, hint):
    with pytest.raises(CheckFailed) as failure:
        check_group_norm_backward_params(wrong)
    assert hint in str(failure.value)


def test_group_norm_check_reports_a_wrong_return():
    with pytest.raises(CheckFailed, match="3 arrays"):
        check_group_norm_backward_dx(lambda dy, x, g, gamma, eps=1e-5: dy)


# ---------------------------------------------------------------- the inline answers

@pytest.mark.parametrize("check, right, wrong", [
    (check_rms_zero_answer, ["b", "B", "(b)"], ["a", "c", "d", "", None]),
    (check_gn_zero_sums_answer, ["bc", "cb", "b, c"], ["b", "c", "bcd", "abc", None]),
    (check_blind_check_answer, ["b", " b "], ["a", "c", "d", None]),
])
def test_inline_answers_are_judged(check, right, wrong):
    for answer in right:
        check(answer)
    for answer in wrong:
        with pytest.raises(CheckFailed):
            check(answer)


def test_inline_truths_come_from_the_references():
    assert backward_judges._rms_zero_truth() == "b"
    assert backward_judges._gn_zero_sums_truth() == "bc"
    assert backward_judges._blind_check_truth() == "b"


def _visible_answer_test(grade_id):
    """The visible half of one of the assignment's answer grade cells."""
    import json
    from pathlib import Path

    path = (Path(__file__).resolve().parents[1] / "source" / "04_backward_pass"
            / "04_backward_pass.ipynb")
    cells = json.loads(path.read_text())["cells"]
    source = next("".join(c["source"]) for c in cells
                  if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    return source.split("### BEGIN HIDDEN TESTS")[0]


@pytest.mark.parametrize("grade_id, name, right, wrong", [
    ("rms_zero_correct", "rms_zero", ["b", "B", "(b)", " b "], [None, "", "ab"]),
    ("gn_zero_sums_correct", "gn_zero_sums", ["bc", "cb", "b, c", "B C", ["b", "c"]],
     [None, "", "b and c"]),
    ("blind_check_correct", "blind_check", ["b", " b ", "B", "(b)"], [None, "", "bc"]),
])
def test_visible_answer_asserts_accept_what_the_hidden_check_accepts(
        grade_id, name, right, wrong):
    """A right answer in another format must not fail the visible assert."""
    code = _visible_answer_test(grade_id)
    hidden = {"rms_zero": check_rms_zero_answer,
              "gn_zero_sums": check_gn_zero_sums_answer,
              "blind_check": check_blind_check_answer}[name]
    for answer in right:
        exec(code, {name: answer})
        hidden(answer)
    for answer in wrong:
        with pytest.raises(AssertionError):
            exec(code, {name: answer})


def _gn_channels_last(dy, x, num_groups, gamma, eps=1e-5):
    """GroupNorm's backward with the channels moved last: (N, P, G, K)."""
    x, dy = np.asarray(x, dtype=np.float64), np.asarray(dy, dtype=np.float64)
    n, c = x.shape[:2]
    xl = np.moveaxis(x, 1, -1).reshape(n, -1, num_groups, c // num_groups)
    dl = np.moveaxis(dy, 1, -1).reshape(xl.shape)
    mu = xl.mean(axis=(1, 3), keepdims=True)
    r = 1 / np.sqrt(((xl - mu) ** 2).mean(axis=(1, 3), keepdims=True) + eps)
    xh = (xl - mu) * r
    g = dl * np.asarray(gamma, dtype=np.float64).reshape(num_groups, -1)
    dxl = r * (g - g.mean(axis=(1, 3), keepdims=True)
               - xh * (g * xh).mean(axis=(1, 3), keepdims=True))
    dx = np.moveaxis(dxl.reshape((n,) + x.shape[2:] + (c,)), -1, 1)
    return dx, (dl * xh).sum(axis=(0, 1)).reshape(c), dl.sum(axis=(0, 1)).reshape(c)


def _rms_torch_no_autograd(dy, x, gamma, eps=1e-5):
    """RMSNorm's backward in torch tensors, written with r**3, returning tensors."""
    x, dy = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(dy, dtype=torch.float64)
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    g = dy * torch.as_tensor(gamma, dtype=torch.float64)
    dx = r * g - r.pow(3) * x * (g * x).mean(-1, keepdim=True)
    return dx, (dy * x * r).reshape(-1, x.shape[-1]).sum(0)


def test_checks_pass_a_channels_last_group_norm_and_a_torch_rms_norm():
    check_group_norm_backward_dx(_gn_channels_last)
    check_group_norm_backward_params(_gn_channels_last)
    check_rms_norm_backward_dx(_rms_torch_no_autograd)
    check_rms_norm_backward_dgamma(_rms_torch_no_autograd)
