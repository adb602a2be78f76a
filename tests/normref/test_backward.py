"""Unit 04, the backward pass: normref.backward against torch autograd, finite
differences and the course's worked facts; the checks against right and wrong code.
"""

import re
import warnings
from decimal import Decimal
from fractions import Fraction

import nbformat
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import REPO
from normref import backward, batchnorm
from normref.checks import (
    CheckFailed,
    _registry,
    _runner,
    backward_judges,
    backward_probes,
    check_accumulate_rows,
    check_accumulation_answer,
    check_backward_from_output_dx,
    check_backward_from_output_params,
    check_batch_norm_2d_backward_dx,
    check_batch_norm_2d_backward_params,
    check_batch_norm_backward_dx,
    check_batch_norm_backward_params,
    check_batch_norm_stage_gradients,
    check_blind_check_answer,
    check_bn_eval_answer,
    check_dgamma_off_answer,
    check_gn_zero_sums_answer,
    check_group_norm_backward_dx,
    check_group_norm_backward_params,
    check_layer_norm_backward_dx,
    check_layer_norm_backward_params,
    check_layer_norm_forward,
    check_rms_dx_dot_x,
    check_rms_norm_backward_dgamma,
    check_rms_norm_backward_dx,
    check_rms_norm_function,
    check_rms_zero_answer,
)
from normref.checks import backward_judges as J
from normref.checks import backward_probes as P
from normref.checks.tolerances import mismatch

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
    (_rms_from(lambda g, dy, xh, r: r * g), "dx treats rstd as a constant"),
    (_rms_from(lambda g, dy, xh, r: r * (g - _avg(g) - xh * _avg(g * xh))), "no path runs"),
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
    (check_bn_eval_answer, ["d", "(D)", " d ", "d (a column and a row)", np.str_("d")],
     ["a", "b", "c", "", None, "b or d"]),
    (check_accumulation_answer, ["c", " (C) "], ["a", "b", "d", "", None]),
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

    path = (Path(__file__).resolve().parents[2] / "source" / "04_backward_pass"
            / "04_backward_pass.ipynb")
    cells = json.loads(path.read_text())["cells"]
    source = next("".join(c["source"]) for c in cells
                  if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    return source.split("### BEGIN HIDDEN TESTS")[0]


@pytest.mark.parametrize("grade_id, name, right, wrong", [
    ("rms_zero_correct", "rms_zero", ["b", "B", "(b)", " b ", "(b) dx . x"],
     [None, "", "ab"]),
    ("gn_zero_sums_correct", "gn_zero_sums", ["bc", "cb", "b, c", "B C", ["b", "c"],
                                              "b and c", "(b), (c)"],
     [None, "", "both"]),
    ("blind_check_correct", "blind_check", ["b", " b ", "B", "(b)"], [None, "", "bc"]),
    ("bn_eval_correct", "bn_eval", ["d", " (d) ", "D", "d (a row and a column)",
                                    "(d) neither"], [None, "", "bd", "b or d"]),
    ("acc_prediction_correct", "accumulation", ["c", " (C) "], [None, "", "cd"]),
])
def test_visible_answer_asserts_accept_what_the_hidden_check_accepts(
        grade_id, name, right, wrong):
    """A right answer in another format must not fail the visible assert."""
    code = _visible_answer_test(grade_id)
    hidden = {"rms_zero": check_rms_zero_answer,
              "gn_zero_sums": check_gn_zero_sums_answer,
              "blind_check": check_blind_check_answer,
              "bn_eval": check_bn_eval_answer,
              "accumulation": check_accumulation_answer}[name]
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


# Unit 04's checks (the backward passes and three answers): probes and judges.

HINT = ". Hint: "
EVIDENCE = re.compile(
    r"^(?P<problem>.*)\. A centred finite difference of sum\(dy \* y\) \(h = 1e-05\) puts "
    r"(?P<name>\w+)\[(?P<where>[\d, ]*)\] at (?P<fd>\S+); yours is (?P<yours>\S+?)"
    r"(?:\. Hint: (?P<hint>.*))?$", re.DOTALL)


def _cases(name, seed=0):
    return _registry.make_cases(name, seed)


def _case(name, index, seed=0):
    return _cases(name, seed)[index][1]


def _judge(name, case, output):
    return _registry._get(name).judge(case, output)


def _t(a):
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)


def _ln_torch(case):
    """(y, mean, rstd, dx, dgamma, dbeta) of layer norm over the last axis, from torch."""
    x, gamma, beta = _t(case["x"]), _t(case["gamma"]), _t(case["beta"])
    d = x.shape[-1]
    y, mean, rstd = torch.native_layer_norm(x, (d,), gamma, beta, float(case["eps"]))
    (y * torch.tensor(np.asarray(case["dy"], np.float64))).sum().backward()
    out = [y.detach(), mean[..., 0].detach(), rstd[..., 0].detach(), x.grad, gamma.grad,
           beta.grad]
    return [o.numpy() for o in out]


def _rms_torch(case):
    x, gamma = _t(case["x"]), _t(case["gamma"])
    y = F.rms_norm(x, (x.shape[-1],), gamma, float(case["eps"]))
    (y * torch.tensor(np.asarray(case["dy"], np.float64))).sum().backward()
    return x.grad.numpy(), gamma.grad.numpy()


def _gn_torch(case):
    x, gamma, beta = _t(case["x"]), _t(case["gamma"]), _t(case["beta"])
    y = F.group_norm(x, int(case["num_groups"]), gamma, beta, float(case["eps"]))
    (y * torch.tensor(np.asarray(case["dy"], np.float64))).sum().backward()
    return x.grad.numpy(), gamma.grad.numpy(), beta.grad.numpy()


def _check_evidence(message, *, problem, name, yours, right, hint=None, rtol=1e-5):
    """The message is `problem`, then a finite difference at the worst entry that agrees
    with torch's gradient `right`, then the hint (or none)."""
    found = EVIDENCE.match(message)
    assert found, message
    assert found["problem"] == problem
    assert found["name"] == name
    yours = np.asarray(yours, dtype=np.float64)
    index = tuple(int(i) for i in found["where"].split(", "))
    gaps = np.abs(yours - right)  # the entry named is (one of) the furthest off
    assert gaps[index] >= gaps.max() * (1 - 1e-6) - 1e-12, (gaps[index], gaps.max())
    assert float(found["fd"]) == pytest.approx(right[index], rel=rtol, abs=1e-6)
    assert found["yours"] == f"{yours[index]:.6g}"
    assert found["hint"] == hint


# ----- the layer-norm forward and its cache --------------------------------------------------

FORWARD_LABELS = [
    "x = [2, 4, 6, 8]", "x = [2, 4, 6, 8] with gamma = 2, beta = 1",
    "a batch of 4 tokens, d = 8", "a 3-D batch (2, 3, 16)",
    "a constant token [5, 5, 5, 5] (variance 0)",
    "a tiny spread, 0.001 * [2, 4, 6, 8], where eps matters", "a float32 batch (6, 32)",
]
LN_LABELS = [
    "x = [2, 4, 6, 8], gamma = [2, -1, 0.5, 3], dy = [1, 0, -2, 0.5]",
    "a batch of 5 tokens, d = 8", "a 3-D batch (2, 3, 16)", "a 4-D batch (2, 2, 3, 8)",
    "a tiny spread, 0.001 * [2, 4, 6, 8], where eps matters",
    "tokens with a large offset (1000 + N(0, 1)), (3, 16)", "a float32 batch (4, 32)",
]
RMS_LABELS = [
    "x = [2, 4, 6, 8], gamma = [2, -1, 0.5, 3], dy = [1, 0, -2, 0.5]",
    "a batch of 5 tokens, d = 8", "a 3-D batch (2, 3, 16) of tokens with mean 3",
    "a 4-D batch (2, 2, 3, 8)", "tiny values, 0.001 * [2, 4, 6, 8], where eps matters",
    "a float32 batch (4, 32)",
    "eps = 0.1, not 1e-5: values of size 0.1, (3, 8), where eps is most of mean(x^2) + eps",
]


def _reference_forward(x, gamma, beta, eps=1e-5):
    """A right forward built on torch: y and a dict cache holding mean and rstd."""
    case = {"x": x, "gamma": gamma, "beta": beta, "eps": eps, "dy": np.zeros_like(x)}
    y, mean, rstd = _ln_torch(case)[:3]
    dtype = np.asarray(x).dtype
    return y.astype(dtype), {"x": x, "gamma": gamma, "mean": mean.astype(dtype),
                             "rstd": rstd.astype(dtype)}


def _reference_backward(dy, cache):
    """A right backward: torch autograd, from the cache's x and gamma."""
    case = {"x": cache["x"], "gamma": cache["gamma"], "beta": np.zeros_like(cache["gamma"]),
            "dy": dy, "eps": 1e-5}
    dx, dgamma, dbeta = _ln_torch(case)[3:]
    dtype = np.asarray(dy).dtype
    return dx.astype(dtype), dgamma.astype(dtype), dbeta.astype(dtype)


def _verdict(name, subject, probe, seed=0):
    cases = _cases(name, seed)
    outputs, errors = _runner._probe_all(subject, cases, probe)
    return _registry.judge(name, cases, outputs, errors)


def test_forward_cases_are_what_their_labels_say():
    cases = _cases("backward_ln_forward_cache")
    assert [label for label, _ in cases] == FORWARD_LABELS
    shapes = [(c["x"].shape, c["x"].dtype.name) for _, c in cases]
    assert shapes == [((4,), "float64"), ((4,), "float64"), ((4, 8), "float64"),
                      ((2, 3, 16), "float64"), ((4,), "float64"), ((4,), "float64"),
                      ((6, 32), "float32")]
    np.testing.assert_array_equal(cases[0][1]["x"], [2, 4, 6, 8])
    np.testing.assert_array_equal(cases[0][1]["gamma"], np.ones(4))
    np.testing.assert_array_equal(cases[0][1]["beta"], np.zeros(4))
    np.testing.assert_array_equal(cases[1][1]["gamma"], [2, 2, 2, 2])
    np.testing.assert_array_equal(cases[1][1]["beta"], [1, 1, 1, 1])
    np.testing.assert_array_equal(cases[4][1]["x"], [5, 5, 5, 5])
    np.testing.assert_allclose(cases[5][1]["x"], [0.002, 0.004, 0.006, 0.008], rtol=1e-12)
    for label, case in cases:
        assert float(case["eps"]) == 1e-5, label
        d = case["x"].shape[-1]
        for key in ("gamma", "beta"):
            assert case[key].shape == (d,) and case[key].dtype == case["x"].dtype, label
        assert case["dy"].shape == case["x"].shape and case["dy"].dtype == case["x"].dtype
    batch = cases[3][1]["x"]
    assert abs(batch.mean() - 2) < 1 and 2 < batch.std() < 4  # N(2, 3)


def test_a_right_forward_passes_with_every_case_listed():
    verdict = _verdict("backward_ln_forward_cache", _reference_forward, P._call_forward)
    assert verdict == {"passed": True, "case": None, "message": (
        "backward_ln_forward_cache: all 7 cases passed (" + ", ".join(FORWARD_LABELS) + ")")}


def _forward_output(case, **changes):
    y, mean, rstd = (a.astype(case["x"].dtype) for a in _ln_torch(case)[:3])
    return {"y": y, "mean": mean, "rstd": rstd, **changes}


def test_forward_judge_explains_a_wrong_y():
    case = _case("backward_ln_forward_cache", 2)
    output = _forward_output(case)
    right = output["y"]
    output["y"] = right + 0.5
    assert J._judge_forward(case, output) == mismatch(output["y"], right, dtype=np.float64,
                                                      what="y")


def test_forward_judge_accepts_keepdims_statistics_and_float32_precision():
    case = _case("backward_ln_forward_cache", 3)
    output = _forward_output(case)
    keepdims = {**output, "mean": output["mean"][..., None], "rstd": output["rstd"][..., None]}
    assert J._judge_forward(case, keepdims) is None
    case32 = _case("backward_ln_forward_cache", 6)
    output = _forward_output(case32)
    output["rstd"] = output["rstd"] * np.float32(1 + 2e-5)  # float32 round-off
    assert J._judge_forward(case32, output) is None
    case64 = _case("backward_ln_forward_cache", 2)
    output = _forward_output(case64)
    output["rstd"] = output["rstd"] * (1 + 2e-5)
    assert J._judge_forward(case64, output).startswith("cache['rstd'] is")


def test_forward_judge_explains_a_wrong_mean():
    case = _case("backward_ln_forward_cache", 3)  # (2, 3, 16)
    output = _forward_output(case)
    right = output["mean"]
    per_feature = case["x"].mean(axis=0)  # (3, 16): the wrong axis
    wrong = {**output, "mean": per_feature}
    assert J._judge_forward(case, wrong) == mismatch(
        per_feature, right, dtype=np.float64, what="cache['mean']") + HINT + (
        "keep one mean per token, averaged over its features (the last axis)")
    shifted = {**output, "mean": right + 1}
    assert J._judge_forward(case, shifted) == mismatch(
        right + 1, right, dtype=np.float64, what="cache['mean']")


@pytest.mark.parametrize("index, wrong_rstd, hint", [
    (2, lambda var, eps: np.sqrt(var + eps),
     "rstd is the reciprocal, 1 / sqrt(var + eps), not the standard deviation"),
    (5, lambda var, eps: 1 / (np.sqrt(var) + eps),
     "eps goes inside the square root, with the variance: 1 / sqrt(var + eps)"),
    (5, lambda var, eps: 1 / np.sqrt(var),
     "add eps to the variance: rstd = 1 / sqrt(var + eps)"),
    (2, lambda var, eps: 1 / (var + eps), "take the square root: rstd = 1 / sqrt(var + eps)"),
    (3, lambda var, eps: var, "that is the variance; rstd = 1 / sqrt(var + eps)"),
    (3, lambda var, eps: 2 / np.sqrt(var + eps), None),
])
def test_forward_judge_names_the_rstd_slip(index, wrong_rstd, hint):
    case = _case("backward_ln_forward_cache", index)
    output = _forward_output(case)
    var = torch.tensor(case["x"]).var(-1, correction=0).numpy()
    rstd = wrong_rstd(var, 1e-5)
    problem = mismatch(rstd, output["rstd"], dtype=np.float64, what="cache['rstd']")
    assert J._judge_forward(case, {**output, "rstd": rstd}) == problem + (
        HINT + hint if hint else "")


def test_forward_judge_passes_on_the_probes_cache_problem():
    case = _case("backward_ln_forward_cache", 0)
    assert J._judge_forward(case, {"cache_problem": np.array("the cache is a tuple")}) == (
        "the cache is a tuple")


# ----- layer-norm backward -------------------------------------------------------------------


def test_ln_backward_cases_are_what_their_labels_say():
    cases = _cases("backward_ln_dx")
    assert [label for label, _ in cases] == LN_LABELS
    assert [(c["x"].shape, c["x"].dtype.name) for _, c in cases] == [
        ((4,), "float64"), ((5, 8), "float64"), ((2, 3, 16), "float64"),
        ((2, 2, 3, 8), "float64"), ((4,), "float64"), ((3, 16), "float64"),
        ((4, 32), "float32")]
    first = cases[0][1]
    np.testing.assert_array_equal(first["gamma"], [2, -1, 0.5, 3])
    np.testing.assert_array_equal(first["beta"], np.zeros(4))
    np.testing.assert_array_equal(first["dy"], [1, 0, -2, 0.5])
    tiny = cases[4][1]
    np.testing.assert_allclose(tiny["x"], [0.002, 0.004, 0.006, 0.008], rtol=1e-12)
    np.testing.assert_array_equal(tiny["gamma"], [1.5, 0.5, -1.0, 2.0])
    assert abs(cases[5][1]["x"].mean() - 1000) < 1 and cases[5][1]["x"].std() < 2
    assert abs(cases[2][1]["x"].mean() - 1) < 1 and 1 < cases[2][1]["x"].std() < 3
    gammas = np.concatenate([c["gamma"] for _, c in cases[1:4] + cases[5:]])
    betas = np.concatenate([c["beta"] for _, c in cases[1:4] + cases[5:]])
    assert abs(gammas.mean() - 1) < 0.15 and 0.35 < gammas.std() < 0.65  # N(1, 0.5)
    assert abs(betas.mean()) < 0.25 and 0.7 < betas.std() < 1.3  # N(0, 1)
    for _, case in cases:
        assert case["dy"].shape == case["x"].shape and case["dy"].dtype == case["x"].dtype
        assert case["gamma"].dtype == case["x"].dtype == case["beta"].dtype
        assert float(case["eps"]) == 1e-5
    dys = np.concatenate([c["dy"].ravel() for _, c in cases[1:]])
    assert abs(dys.mean()) < 0.15 and 0.8 < dys.std() < 1.2
    params = _cases("backward_ln_params")
    assert [label for label, _ in params] == LN_LABELS[1:] + LN_LABELS[:1]
    np.testing.assert_array_equal(params[-1][1]["x"], cases[0][1]["x"])


def test_case_defaults_and_the_rng_used_for_dy():
    case = J._case([1.0, 2.0], dy=[3.0, 4.0])
    np.testing.assert_array_equal(case["gamma"], [1, 1])
    np.testing.assert_array_equal(case["beta"], [0, 0])
    assert case["dy"].dtype == np.float64 and float(case["eps"]) == 1e-5
    default_dy = J._case(np.zeros(3, np.float32))["dy"]
    expected = np.random.default_rng(4).normal(size=3).astype(np.float32)
    np.testing.assert_array_equal(default_dy, expected)
    assert default_dy.dtype == np.float32
    assert J._case(np.zeros(2, np.float32), gamma=[2, 3])["gamma"].dtype == np.float32
    assert J._case(np.zeros(2), eps=0.5)["eps"] == 0.5


@pytest.mark.parametrize("name, labels", [("backward_ln_dx", LN_LABELS),
                                          ("backward_ln_params", LN_LABELS[1:] + LN_LABELS[:1])])
def test_a_right_backward_passes_with_every_case_listed(name, labels):
    for seed in (0, 3):
        verdict = _verdict(name, (_reference_forward, _reference_backward), P._call_ln_backward,
                           seed)
        assert verdict == {"passed": True, "case": None, "message": (
            f"{name}: all 7 cases passed (" + ", ".join(labels) + ")")}


def _ln_pieces(case):
    x = np.asarray(case["x"], np.float64)
    rstd = 1 / np.sqrt(x.var(axis=-1, keepdims=True) + float(case["eps"]))
    x_hat = (x - x.mean(axis=-1, keepdims=True)) * rstd
    return x, rstd, x_hat, np.asarray(case["dy"], np.float64) * case["gamma"]


LN_DX_SLIPS = {
    "no mean term": (lambda x, r, xh, g, dy: r * (g - xh * _avg(g * xh)),
                     "dx is missing the -mean(g) term: the mean mu depends on every feature, "
                     "so each entry of g = dy * gamma loses the token's average of g"),
    "no projection": (lambda x, r, xh, g, dy: r * (g - _avg(g)),
                      "dx is missing the -x_hat * mean(g * x_hat) term: rstd depends on x "
                      "through the variance, and that path carries gradient too"),
    "no terms": (lambda x, r, xh, g, dy: r * g,
                 "dx is missing both correction terms, -mean(g) and -x_hat * mean(g * x_hat)"),
    "no gamma": (lambda x, r, xh, g, dy: r * (dy - _avg(dy) - xh * _avg(dy * xh)),
                 "the gradient reaching x_hat is g = dy * gamma: y = gamma * x_hat + beta, so "
                 "dy passes through gamma before it reaches x_hat"),
    "no rstd": (lambda x, r, xh, g, dy: g - _avg(g) - xh * _avg(g * xh),
                "dx ends with a factor rstd = 1 / sqrt(var + eps)"),
    "std": (lambda x, r, xh, g, dy: (g - _avg(g) - xh * _avg(g * xh)) / r,
            "the factor in front is rstd = 1 / sqrt(var + eps), not the standard deviation"),
    "rstd without eps": (
        lambda x, r, xh, g, dy: (g - _avg(g) - xh * _avg(g * xh)) / x.std(-1, keepdims=True),
        "rstd includes eps: 1 / sqrt(var + eps)"),
    "sign": (lambda x, r, xh, g, dy: -r * (g - _avg(g) - xh * _avg(g * xh)),
             "the sign of dx is flipped"),
    "unknown": (lambda x, r, xh, g, dy: 2 * r * g, None),
}


@pytest.mark.parametrize("index, slip", [
    (1, "no mean term"), (0, "no projection"), (2, "no terms"), (3, "no gamma"),
    (1, "no rstd"), (5, "std"), (4, "rstd without eps"), (2, "sign"), (6, "no mean term"),
    (1, "unknown"),
])
def test_ln_dx_slips_are_named_with_finite_difference_evidence(index, slip):
    case = _case("backward_ln_dx", index)
    rule, hint = LN_DX_SLIPS[slip]
    x, rstd, x_hat, g = _ln_pieces(case)
    dx = rule(x, rstd, x_hat, g, np.asarray(case["dy"], np.float64)).astype(case["x"].dtype)
    right = _ln_torch(case)[3]
    message = _judge("backward_ln_dx", case, {"dx": dx})
    problem = mismatch(dx, right, dtype=case["x"].dtype, what="dx")
    _check_evidence(message, problem=problem, name="dx", yours=dx, right=right, hint=hint)


def test_ln_dx_of_torch_passes_and_a_wrong_shape_has_no_evidence():
    case = _case("backward_ln_dx", 2)
    right = _ln_torch(case)[3]
    assert J._judge_ln_dx(case, {"dx": right}) is None
    flat = right.reshape(-1, 16)
    assert J._judge_ln_dx(case, {"dx": flat}) == mismatch(flat, right, dtype=np.float64,
                                                          what="dx")


def _ln_param_output(case, dgamma=None, dbeta=None):
    _, _, _, _, right_gamma, right_beta = _ln_torch(case)
    return {"dgamma": right_gamma if dgamma is None else dgamma,
            "dbeta": right_beta if dbeta is None else dbeta}, right_gamma, right_beta


ANY_SHAPE = "x.reshape(-1, d).sum(axis=0) sums over the tokens of any batch shape"


def test_ln_params_summed_over_the_wrong_axes_get_an_axis_hint():
    case = _case("backward_ln_params", 1)  # (2, 3, 16)
    x, _, x_hat, _ = _ln_pieces(case)
    dy = case["dy"]
    for wrong, hint in (
            ((dy * x_hat).sum(axis=0),
             f"dgamma sums over every leading axis, not only axis 0: {ANY_SHAPE}"),
            ((dy * x_hat).sum(axis=-1),
             "dgamma has one entry per feature: sum over the tokens (every leading axis), "
             f"not over the features (the last axis); {ANY_SHAPE}"),
            (dy * x_hat, "dgamma is summed over every token, giving one number per feature")):
        output, right, _ = _ln_param_output(case, dgamma=wrong)
        assert J._judge_ln_params(case, output) == mismatch(
            wrong, right, dtype=np.float64, what="dgamma") + HINT + hint
    output, _, right = _ln_param_output(case, dbeta=dy.sum(axis=(0, 1))[None])
    assert J._judge_ln_params(case, output) == mismatch(
        dy.sum(axis=(0, 1))[None], right, dtype=np.float64, what="dbeta")


def test_axis_hint_for_two_dimensional_batches():
    case = _case("backward_ln_params", 0)  # (5, 8)
    x = case["x"]
    assert J._axis_hint(np.zeros(5), x, "dbeta") == (
        "dbeta has one entry per feature: sum over the tokens (every leading axis), not over "
        f"the features (the last axis); {ANY_SHAPE}")
    assert J._axis_hint(np.zeros((5, 8)), x, "dbeta") == (
        "dbeta is summed over every token, giving one number per feature")
    assert J._axis_hint(np.zeros(3), x, "dbeta") is None
    assert J._axis_hint(np.zeros((3, 16)), np.zeros((2, 3, 16)), "dgamma").startswith(
        "dgamma sums over every leading axis")
    assert J._axis_hint(np.zeros((1, 8)), np.zeros((5, 2, 8)), "dgamma") is None


@pytest.mark.parametrize("index, key, slip, hint", [
    (0, "dgamma", "mean", "dgamma is a sum over tokens, not an average"),
    (0, "dbeta", "mean", "dbeta is a sum over tokens, not an average"),
    (2, "dgamma", "swap", "dgamma and dbeta are swapped"),
    (2, "dbeta", "swap", "dgamma and dbeta are swapped"),
    (0, "dgamma", "x", "dgamma multiplies dy by x_hat (the normalized input), not by x"),
    (1, "dgamma", "gamma",
     "dgamma is the sum of dy * x_hat; gamma itself does not appear in it"),
    (5, "dgamma", "twice", None),
    (5, "dgamma", "mean", "dgamma is a sum over tokens, not an average"),
])
def test_ln_param_slips_are_named_with_evidence(index, key, slip, hint):
    case = _case("backward_ln_params", index)
    x, _, x_hat, _ = _ln_pieces(case)
    dy = np.asarray(case["dy"], np.float64)
    d = x.shape[-1]

    def token_sum(v):
        return v.reshape(-1, d).sum(axis=0)

    right_values = {"dgamma": token_sum(dy * x_hat), "dbeta": token_sum(dy)}
    wrong = {
        "mean": lambda: right_values[key] / (dy.size // d),
        "swap": lambda: right_values["dbeta" if key == "dgamma" else "dgamma"],
        "x": lambda: token_sum(dy * x),
        "gamma": lambda: token_sum(dy * x_hat * case["gamma"]),
        "twice": lambda: 2 * right_values[key],
        "per example": lambda: (dy * x_hat).sum(axis=tuple(range(1, x.ndim))),
        # an average with float32-sized round-off (1e-5): hints hold at float32 precision
        "float32 mean": lambda: right_values[key] / (x.size // x.shape[1]) * (1 + 1e-5),
    }[slip]().astype(case["x"].dtype)
    output, right_gamma, right_beta = _ln_param_output(
        case, **{key: wrong})
    right = right_gamma if key == "dgamma" else right_beta
    message = J._judge_ln_params(case, output)
    problem = mismatch(wrong, right, dtype=case["x"].dtype, what=key)
    _check_evidence(message, problem=problem, name=key, yours=wrong, right=right, hint=hint)


def test_ln_params_of_torch_pass():
    for _, case in _cases("backward_ln_params"):
        output, _, _ = _ln_param_output(case)
        assert J._judge_ln_params(case, output) is None


# ----- RMSNorm backward ----------------------------------------------------------------------


def test_rms_cases_are_what_their_labels_say():
    cases = _cases("backward_rms_dx")[:-1]  # the large timed case is tested on its own
    assert [label for label, _ in cases] == RMS_LABELS
    assert [(c["x"].shape, c["x"].dtype.name) for _, c in cases] == [
        ((4,), "float64"), ((5, 8), "float64"), ((2, 3, 16), "float64"),
        ((2, 2, 3, 8), "float64"), ((4,), "float64"), ((4, 32), "float32"),
        ((3, 8), "float64")]
    assert [float(c["eps"]) for _, c in cases] == [1e-5] * 6 + [0.1]
    np.testing.assert_array_equal(cases[0][1]["gamma"], [2, -1, 0.5, 3])
    np.testing.assert_array_equal(cases[0][1]["dy"], [1, 0, -2, 0.5])
    np.testing.assert_array_equal(cases[4][1]["gamma"], [1.5, 0.5, -1.0, 2.0])
    np.testing.assert_allclose(cases[4][1]["x"], [0.002, 0.004, 0.006, 0.008], rtol=1e-12)
    assert abs(cases[2][1]["x"].mean() - 3) < 0.5  # "of tokens with mean 3"
    assert [label for label, _ in _cases("backward_rms_dgamma")[:-1]] == (
        RMS_LABELS[1:] + RMS_LABELS[:1])


def _rms_reference(dy, x, gamma, eps=1e-5):
    dx, dgamma = _rms_torch({"x": x, "gamma": gamma, "dy": dy, "eps": eps})
    dtype = np.asarray(x).dtype
    return dx.astype(dtype), dgamma.astype(dtype)


@pytest.mark.parametrize("name, labels", [("backward_rms_dx", RMS_LABELS),
                                          ("backward_rms_dgamma",
                                           RMS_LABELS[1:] + RMS_LABELS[:1])])
def test_a_right_rms_backward_passes(name, labels):
    verdict = _verdict(name, _rms_reference, P._call_rms_backward)
    labels = labels + [_cases(name)[-1][0]]
    assert verdict == {"passed": True, "case": None, "message": (
        f"{name}: all {len(labels)} cases passed (" + ", ".join(labels) + ")")}


def _rms_pieces(case):
    x = np.asarray(case["x"], np.float64)
    ms = (x ** 2).mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt(ms + float(case["eps"]))
    dy = np.asarray(case["dy"], np.float64)
    return x, ms, rstd, x * rstd, dy * case["gamma"], dy


RMS_DX_SLIPS = {
    "no projection": (lambda x, ms, r, xh, g, dy, eps: r * g,
                      "dx treats rstd as a constant: rstd depends on every x_j through "
                      "mean(x^2), and that path adds a term of its own"),
    "mean term": (lambda x, ms, r, xh, g, dy, eps: r * (g - _avg(g) - xh * _avg(g * xh)),
                  "RMSNorm subtracts no mean: no path runs through a mean, so no term of dx "
                  "comes from one"),
    "no gamma": (lambda x, ms, r, xh, g, dy, eps: r * (dy - xh * _avg(dy * xh)),
                 "the gradient reaching x_hat is g = dy * gamma: dy passes through gamma "
                 "before it reaches x_hat"),
    "no rstd": (lambda x, ms, r, xh, g, dy, eps: g - xh * _avg(g * xh),
                "dx ends with a factor rstd = 1 / sqrt(mean(x^2) + eps)"),
    "no eps": (lambda x, ms, r, xh, g, dy, eps: (g - xh * _avg(g * xh)) / np.sqrt(ms),
               "rstd includes eps: 1 / sqrt(mean(x^2) + eps)"),
    "sign": (lambda x, ms, r, xh, g, dy, eps: -r * (g - xh * _avg(g * xh)),
             "the sign of dx is flipped"),
    "d - 1": (lambda x, ms, r, xh, g, dy, eps: (lambda u: u * (g - x * u * _avg(g * x * u)))(
        1 / np.sqrt((x ** 2).sum(-1, keepdims=True) / (x.shape[-1] - 1) + eps)),
        "mean(x^2) divides by d, the number of features, not d - 1 (RMSNorm has no mean to "
        "lose a degree of freedom to)"),
    "2s": (lambda x, ms, r, xh, g, dy, eps: r * (g - 2 * xh * _avg(g * xh)),
           "the derivative of mean(x^2) with respect to x_j is 2 x_j / d, and the power "
           "-1/2 halves it again: the 2s cancel"),
    "unknown": (lambda x, ms, r, xh, g, dy, eps: 3 * r * g, None),
}


@pytest.mark.parametrize("index, slip", [
    (1, "no projection"), (2, "mean term"), (3, "no gamma"), (1, "no rstd"), (4, "no eps"),
    (0, "sign"), (2, "d - 1"), (1, "2s"), (5, "no projection"), (2, "unknown"),
])
def test_rms_dx_slips_are_named_with_evidence(index, slip):
    case = _case("backward_rms_dx", index)
    rule, hint = RMS_DX_SLIPS[slip]
    with np.errstate(all="ignore"):
        dx = rule(*_rms_pieces(case), float(case["eps"])).astype(case["x"].dtype)
    right = _rms_torch(case)[0]
    message = _judge("backward_rms_dx", case, {"dx": dx})
    problem = mismatch(dx, right, dtype=case["x"].dtype, what="dx")
    _check_evidence(message, problem=problem, name="dx", yours=dx, right=right, hint=hint)


def test_rms_d_minus_one_slip_on_a_single_feature_does_not_divide_by_zero():
    """d = 1: d - 1 would be 0; the judge's candidate uses max(d - 1, 1)."""
    case = J._case(np.array([[2.0], [-3.0]]), dy=[[1.0], [0.5]])
    mistakes = J._rms_dx_extra_mistakes(case)
    x, ms, rstd, x_hat, g, _ = _rms_pieces(case)
    expected = rstd * (g - x * rstd * _avg(g * x * rstd))
    key = next(k for k in mistakes if k.startswith("mean(x^2) divides by d"))
    np.testing.assert_allclose(mistakes[key], expected, rtol=1e-12)


def test_rms_dgamma_is_judged_without_a_dbeta():
    case = _case("backward_rms_dgamma", 1)  # (2, 3, 16)
    right = _rms_torch(case)[1]
    assert J._judge_rms_dgamma(case, {"dgamma": right}) is None
    x, _, _, x_hat, _, dy = _rms_pieces(case)
    wrong = (dy * x_hat).sum(axis=0)
    assert J._judge_rms_dgamma(case, {"dgamma": wrong}) == mismatch(
        wrong, right, dtype=np.float64, what="dgamma") + HINT + (
        f"dgamma sums over every leading axis, not only axis 0: {ANY_SHAPE}")
    swapped = dy.reshape(-1, 16).sum(axis=0)  # dbeta's formula: no swap hint without beta
    message = J._judge_rms_dgamma(case, {"dgamma": swapped})
    _check_evidence(message, problem=mismatch(swapped, right, dtype=np.float64, what="dgamma"),
                    name="dgamma", yours=swapped, right=right, hint=None)
    by_x = (dy * x).reshape(-1, 16).sum(axis=0)
    message = J._judge_rms_dgamma(case, {"dgamma": by_x})
    _check_evidence(message, problem=mismatch(by_x, right, dtype=np.float64, what="dgamma"),
                    name="dgamma", yours=by_x, right=right,
                    hint="dgamma multiplies dy by x_hat (the normalized input), not by x")


# ----- GroupNorm backward --------------------------------------------------------------------

GN_FIXED = [
    ("x of shape (2, 4), 2 groups of 2 values, no positions", (2, 4), 2, "float64"),
    ("1 group, shape (2, 6, 4): layer norm over channels and positions", (2, 6, 4), 1,
     "float64"),
    ("as many groups as channels, shape (2, 3, 5): instance norm", (2, 3, 5), 3, "float64"),
    ("a 4-D input (2, 6, 3, 3), 3 groups, values near 100", (2, 6, 3, 3), 3, "float64"),
    ("groups of a single value, shape (3, 4), 4 groups", (3, 4), 4, "float64"),
    ("a float32 input (2, 8, 6), 4 groups", (2, 8, 6), 4, "float32"),
    ("eps = 0.1, not 1e-5: values of spread 0.1, (2, 6, 4), 3 groups, where eps is most "
     "of var + eps", (2, 6, 4), 3, "float64"),
]


def test_gn_cases_are_what_their_labels_say():
    for seed in range(4):
        cases = _cases("backward_gn_dx", seed)[:-1]  # the large case is tested on its own
        fixed = [cases[2]] + cases[3:]
        assert [(label, c["x"].shape, int(c["num_groups"]), c["x"].dtype.name)
                for label, c in fixed] == GN_FIXED
        for label, case in cases[:2]:
            shape, groups = case["x"].shape, int(case["num_groups"])
            assert label == f"a random shape {shape}, {groups} groups"
            assert 2 <= groups <= 3 and shape[1] % groups == 0
            assert 2 <= shape[1] // groups <= 3 and 1 <= shape[0] <= 3
            assert 3 <= len(shape) <= 4 and all(2 <= n <= 5 for n in shape[2:])
        for label, case in cases:
            channels = case["x"].shape[1]
            assert case["gamma"].shape == case["beta"].shape == (channels,), label
            assert case["dy"].shape == case["x"].shape
            assert float(case["eps"]) == (0.1 if label.startswith("eps = 0.1") else 1e-5)
            assert case["gamma"].dtype == case["dy"].dtype == case["x"].dtype
        assert abs(cases[5][1]["x"].mean() - 100) < 1
        assert abs(cases[0][1]["x"].mean() - 1) < 1.5
        params = _cases("backward_gn_params", seed)[:-1]
        assert [label for label, _ in params] == [
            label for label, _ in cases[:2] + cases[3:] + cases[2:3]]
    shapes = [(c["x"].shape, int(c["num_groups"])) for seed in range(16)
              for _, c in _cases("backward_gn_dx", seed)[:2]]
    # every value the docstring allows turns up: groups and channels per group 2 or 3,
    # batches of 1 to 3, one or two position axes of 2 to 5
    assert {groups for _, groups in shapes} == {2, 3}
    assert {shape[1] // groups for shape, groups in shapes} == {2, 3}
    assert {shape[0] for shape, _ in shapes} == {1, 2, 3}
    assert {len(shape) - 2 for shape, _ in shapes} == {1, 2}
    assert {n for shape, _ in shapes for n in shape[2:]} == {2, 3, 4, 5}


def test_gn_case_values_are_spread_as_documented():
    """gamma ~ N(1, 0.5), beta, dy and x ~ N(0, 1) unless a case says otherwise."""
    cases = [c for seed in range(3) for _, c in _cases("backward_gn_dx", seed)]
    gammas = np.concatenate([c["gamma"] for c in cases])
    betas = np.concatenate([c["beta"] for c in cases])
    dys = np.concatenate([c["dy"].ravel() for c in cases])
    assert abs(gammas.mean() - 1) < 0.15 and 0.35 < gammas.std() < 0.65
    assert abs(betas.mean()) < 0.25 and 0.75 < betas.std() < 1.25
    assert abs(dys.mean()) < 0.1 and 0.85 < dys.std() < 1.15
    plain = np.concatenate([c["x"].ravel() for seed in range(3)
                            for i, (_, c) in enumerate(_cases("backward_gn_dx", seed))
                            if i in (1, 2, 3, 4, 6, 7)])
    assert abs(plain.mean()) < 0.1 and 0.85 < plain.std() < 1.15
    shifted = np.concatenate([_cases("backward_gn_dx", seed)[0][1]["x"].ravel()
                              for seed in range(6)])
    assert abs(shifted.mean() - 1) < 0.3 and 1.7 < shifted.std() < 2.3  # N(1, 2)
    near_100 = _cases("backward_gn_dx")[5][1]["x"]
    assert 0.6 < near_100.std() < 1.4


def _gn_reference(dy, x, num_groups, gamma, eps=1e-5):
    dx, dgamma, dbeta = _gn_torch({"x": x, "gamma": gamma, "beta": np.zeros_like(gamma),
                                   "dy": dy, "eps": eps, "num_groups": num_groups})
    dtype = np.asarray(x).dtype
    return dx.astype(dtype), dgamma.astype(dtype), dbeta.astype(dtype)


@pytest.mark.parametrize("name", ["backward_gn_dx", "backward_gn_params"])
def test_a_right_group_norm_backward_passes(name):
    for seed in (0, 5):
        cases = _cases(name, seed)
        verdict = _verdict(name, _gn_reference, P._call_gn_backward, seed)
        assert verdict == {"passed": True, "case": None, "message": (
            f"{name}: all {len(cases)} cases passed ("
            + ", ".join(label for label, _ in cases) + ")")}


def _gn_wrong_dx(case, groups=None, interleaved=False, ddof=0, mean_term=True,
                 projection_term=True, use_gamma=True):
    """GroupNorm's dx with one slip, written with torch, channels to groups by a view."""
    x = torch.tensor(np.asarray(case["x"], np.float64))
    dy = torch.tensor(np.asarray(case["dy"], np.float64))
    n, c = x.shape[:2]
    groups = int(case["num_groups"]) if groups is None else groups
    gamma = torch.tensor(np.asarray(case["gamma"], np.float64)).reshape(
        (c,) + (1,) * (x.dim() - 2))
    g = dy * gamma if use_gamma else dy

    def group(t):
        if interleaved:  # channel k in group k % groups
            t = t.reshape((n, c // groups, groups) + tuple(t.shape[2:])).movedim(2, 1)
        return t.reshape(n, groups, -1)

    xg, gg = group(x), group(g)
    m = xg.shape[-1]
    centred = xg - xg.mean(-1, keepdim=True)
    var = (centred ** 2).sum(-1, keepdim=True) / max(m - ddof, 1)
    rstd = 1 / torch.sqrt(var + float(case["eps"]))
    x_hat = centred * rstd
    dx = gg
    if mean_term:
        dx = dx - gg.mean(-1, keepdim=True)
    if projection_term:
        dx = dx - x_hat * (gg * x_hat).mean(-1, keepdim=True)
    dx = rstd * dx
    if interleaved:
        dx = dx.reshape((n, groups, c // groups) + tuple(x.shape[2:])).movedim(1, 2)
    return dx.reshape(x.shape).numpy()


@pytest.mark.parametrize("index, options, hint", [
    (1, {"mean_term": False},
     "dx is missing the -mean(g) term: each group's mean depends on every value in the group"),
    (2, {"projection_term": False},
     "dx is missing the -x_hat * mean(g * x_hat) term: each group's rstd depends on its "
     "values too"),
    (5, {"mean_term": False, "projection_term": False}, "dx is missing both correction terms"),
    (1, {"use_gamma": False},
     "the gradient reaching x_hat is g = dy * gamma, gamma taken per channel"),
    (5, {"interleaved": True},
     "a group is num_channels / num_groups consecutive channels (channels 0 to C/G - 1 form "
     "group 0), as in torch's GroupNorm, not every G-th channel"),
    (5, {"groups": 6}, "the statistics belong to each group, not to each channel"),
    (2, {"groups": 1}, "the statistics belong to each group, not to the whole example"),
    (1, {"ddof": 1},
     "the variance is the biased one: divide by the group's size M, not M - 1"),
    (7, {"mean_term": False},
     "dx is missing the -mean(g) term: each group's mean depends on every value in the group"),
    # on instance-norm and one-group cases, a variant equal to the right answer is
    # skipped, and the variants after it are still tried
    (4, {"ddof": 1}, "the variance is the biased one: divide by the group's size M, not M - 1"),
    (3, {"ddof": 1}, "the variance is the biased one: divide by the group's size M, not M - 1"),
])
def test_gn_dx_slips_are_named_with_evidence(index, options, hint):
    case = _case("backward_gn_dx", index)
    with np.errstate(all="ignore"):
        dx = _gn_wrong_dx(case, **options).astype(case["x"].dtype)
    right = _gn_torch(case)[0]
    message = _judge("backward_gn_dx", case, {"dx": dx})
    problem = mismatch(dx, right, dtype=case["x"].dtype, what="dx")
    _check_evidence(message, problem=problem, name="dx", yours=dx, right=right, hint=hint)


def test_gn_dx_sign_and_unknown_slips():
    case = _case("backward_gn_dx", 3)  # 1 group: per-example statistics are right here
    right = _gn_torch(case)[0]
    message = _judge("backward_gn_dx", case, {"dx": -right})
    _check_evidence(message, problem=mismatch(-right, right, dtype=np.float64, what="dx"),
                    name="dx", yours=-right, right=right, hint="the sign of dx is flipped")
    message = _judge("backward_gn_dx", case, {"dx": 3 * right})
    _check_evidence(message, problem=mismatch(3 * right, right, dtype=np.float64, what="dx"),
                    name="dx", yours=3 * right, right=right, hint=None)
    assert _judge("backward_gn_dx", case, {"dx": right}) is None
    instance = _case("backward_gn_dx", 4)  # as many groups as channels
    per_channel = [k for k in J._gn_dx_mistakes(instance) if "each channel" in k]
    whole = [k for k in J._gn_dx_mistakes(case) if "whole example" in k]
    assert per_channel == [] and whole == []  # the same as the right answer there


def test_gn_variant_without_options_is_torchs_gradient():
    for _, case in _cases("backward_gn_dx"):
        np.testing.assert_allclose(J._gn_dx_variant(case), _gn_torch(case)[0], rtol=1e-7,
                                   atol=1e-9)
        np.testing.assert_allclose(J._gn_dx_variant(case, interleaved=True),
                                   _gn_wrong_dx(case, interleaved=True), rtol=1e-9,
                                   atol=1e-12)


def test_grouping_round_trips():
    values = np.arange(2 * 6 * 3).reshape(2, 6, 3)
    for interleaved in (False, True):
        grouped = J._grouped(values, 3, interleaved)
        assert grouped.shape == (2, 3, 6)
        np.testing.assert_array_equal(J._ungrouped(grouped, values.shape, 3, interleaved),
                                      values)
    np.testing.assert_array_equal(J._grouped(values, 3)[0, 1], values[0, 2:4].ravel())
    np.testing.assert_array_equal(J._grouped(values, 3, True)[0, 1],
                                  values[0, [1, 4]].ravel())


def _gn_pieces(case):
    x = np.asarray(case["x"], np.float64)
    dy = np.asarray(case["dy"], np.float64)
    shape = (x.shape[0], int(case["num_groups"]), -1)
    xg = x.reshape(shape)
    x_hat = ((xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + 1e-5))
    axes = (0,) + tuple(range(2, x.ndim))
    return x, dy, x_hat.reshape(x.shape), axes


@pytest.mark.parametrize("index, key, slip, hint", [
    (0, "dgamma", "axis 0",
     "dgamma has one entry per channel (axis 1): sum over the examples (axis 0) and over "
     "every position (axes 2 and up)"),
    (1, "dbeta", "last axis",
     "dbeta has one entry per channel, and the channels are axis 1, not the last axis"),
    (1, "dbeta", "mean", "dbeta is a sum over examples and positions, not an average"),
    (4, "dgamma", "mean", "dgamma is a sum over examples and positions, not an average"),
    (2, "dgamma", "swap", "dgamma and dbeta are swapped"),
    (2, "dbeta", "swap", "dgamma and dbeta are swapped"),
    (1, "dgamma", "x", "dgamma multiplies dy by x_hat (the normalized input), not by x"),
    (4, "dgamma", "per channel", "x_hat uses the group's statistics, not each channel's"),
    (6, "dgamma", "twice", None),
    (0, "dgamma", "per example",
     "dgamma has one entry per channel (axis 1): sum over the examples (axis 0) and over "
     "every position (axes 2 and up)"),
    (6, "dbeta", "float32 mean", "dbeta is a sum over examples and positions, not an average"),
])
def test_gn_param_slips_are_named(index, key, slip, hint):
    case = _case("backward_gn_params", index)
    x, dy, x_hat, axes = _gn_pieces(case)
    right_values = {"dgamma": (dy * x_hat).sum(axis=axes), "dbeta": dy.sum(axis=axes)}
    channel_hat = (x - x.mean(axis=axes[1:], keepdims=True)) / np.sqrt(
        x.var(axis=axes[1:], keepdims=True) + 1e-5)
    wrong = {
        "axis 0": lambda: (dy * x_hat).sum(axis=0),
        "last axis": lambda: np.moveaxis(dy, 1, -1).reshape(-1, dy.shape[1]).sum(0)[
            :dy.shape[-1]] if False else dy.reshape(-1, dy.shape[-1]).sum(axis=0),
        "mean": lambda: right_values[key] / (x.size // x.shape[1]),
        "swap": lambda: right_values["dbeta" if key == "dgamma" else "dgamma"],
        "x": lambda: (dy * x).sum(axis=axes),
        "per channel": lambda: (dy * channel_hat).sum(axis=axes),
        "twice": lambda: 2 * right_values[key],
        "per example": lambda: (dy * x_hat).sum(axis=tuple(range(1, x.ndim))),
        # an average with float32-sized round-off (1e-5): hints hold at float32 precision
        "float32 mean": lambda: right_values[key] / (x.size // x.shape[1]) * (1 + 1e-5),
    }[slip]().astype(case["x"].dtype)
    _, right_gamma, right_beta = _gn_torch(case)
    output = {"dgamma": right_gamma, "dbeta": right_beta, key: wrong}
    right = right_gamma if key == "dgamma" else right_beta
    message = J._judge_gn_params(case, output)
    problem = mismatch(wrong, right, dtype=case["x"].dtype, what=key)
    if wrong.shape != right.shape:
        assert message == problem + HINT + hint
    else:
        fd_key = "gamma" if key == "dgamma" else "beta"
        assert f" puts {key}[" in message and fd_key
        _check_evidence(message, problem=problem, name=key, yours=wrong, right=right,
                        hint=hint)


def test_gn_params_of_torch_pass_and_dgamma_is_judged_first():
    case = _case("backward_gn_params", 0)
    _, dgamma, dbeta = _gn_torch(case)
    assert J._judge_gn_params(case, {"dgamma": dgamma, "dbeta": dbeta}) is None
    both_wrong = J._judge_gn_params(case, {"dgamma": dgamma + 1, "dbeta": dbeta + 1})
    assert both_wrong.startswith("dgamma is ")


def test_gn_x_hat_is_the_group_normalized_input():
    case = _case("backward_gn_params", 1)
    expected = F.group_norm(torch.tensor(np.asarray(case["x"], np.float64)),
                            int(case["num_groups"]), eps=1e-5).numpy()
    np.testing.assert_allclose(J._gn_x_hat(case), expected, rtol=1e-10, atol=1e-12)


# ----- helpers of the judges -----------------------------------------------------------------


def test_per_token_accepts_a_trailing_axis_of_one():
    x = np.zeros((2, 3, 4))
    np.testing.assert_array_equal(J._per_token(np.ones((2, 3, 1)), x), np.ones((2, 3)))
    assert J._per_token(np.ones((2, 3)), x).shape == (2, 3)
    assert J._per_token(np.ones((2, 3, 4)), x).shape == (2, 3, 4)


def test_finite_difference_matches_torchs_gradient_and_leaves_the_case_alone():
    case = _case("backward_ln_dx", 1)
    before = {k: v.copy() for k, v in case.items()}
    right = _ln_torch(case)
    for key, grad in (("x", right[3]), ("gamma", right[4]), ("beta", right[5])):
        index = (1, 2) if key == "x" else (3,)
        estimate = J._finite_difference(J._ln_loss, case, key, index)
        assert estimate == pytest.approx(grad[index], rel=1e-7, abs=1e-9)
    for key, value in before.items():
        np.testing.assert_array_equal(case[key], value)
    rms = _case("backward_rms_dx", 1)
    assert J._finite_difference(J._rms_loss, rms, "x", (0, 0)) == pytest.approx(
        _rms_torch(rms)[0][0, 0], rel=1e-7)
    assert J._finite_difference(J._rms_loss, rms, "gamma", (2,)) == pytest.approx(
        _rms_torch(rms)[1][2], rel=1e-7)
    gn = _case("backward_gn_dx", 1)
    assert J._finite_difference(J._gn_loss, gn, "x", (0, 1, 2)) == pytest.approx(
        _gn_torch(gn)[0][0, 1, 2], rel=1e-6)


def test_a_failing_verdict_leaves_the_cases_and_example_a_unchanged():
    """The finite difference perturbs float64 copies: the checkserver keeps a session's
    cases, and EXAMPLE_A is shared by every case built on it, so a perturbation left
    behind would change the inputs of every later check (a bug, fixed)."""
    for name in ("backward_ln_dx", "backward_ln_params", "backward_rms_dx"):
        cases = _cases(name)
        index = next(i for i, (label, _) in enumerate(cases) if label.startswith("x = [2"))
        case = cases[index][1]
        before = {k: v.copy() for k, v in case.items()}
        key = "dx" if name.endswith("dx") else "dgamma"
        wrong = {"dx": np.ones(4), "dgamma": np.ones(4), "dbeta": np.ones(4)}
        assert _judge(name, case, wrong) is not None
        for k, value in before.items():
            np.testing.assert_array_equal(case[k], value, err_msg=f"{name}: {k}")
        np.testing.assert_array_equal(J.EXAMPLE_A, [2.0, 4.0, 6.0, 8.0])
        assert key
    gn = _case("backward_gn_params", 0)
    before = gn["x"].copy()
    assert J._judge_gn_params(gn, {"dgamma": np.ones(gn["x"].shape[1]),
                                   "dbeta": np.ones(gn["x"].shape[1])}) is not None
    np.testing.assert_array_equal(gn["x"], before)


def test_finite_difference_uses_the_step_it_is_given():
    """loss = x^3 at x = 1: the centred difference is 3 + h^2, so h shows."""
    def cube(c):
        return float(c["x"][0] ** 3)

    case = {"x": np.array([1.0])}
    assert J._finite_difference(cube, case, "x", (0,), h=0.1) == pytest.approx(3.01, rel=1e-9)
    assert J._finite_difference(cube, case, "x", (0,)) == pytest.approx(3.0, rel=1e-9)
    assert J.FD_STEP == 1e-5


def test_fd_evidence_is_empty_when_it_cannot_point_at_an_entry():
    case = _case("backward_ln_dx", 1)
    right = _ln_torch(case)[3]
    assert J._fd_evidence(J._ln_loss, case, "x", "dx", right[0], right) == ""
    assert J._fd_evidence(J._ln_loss, case, "x", "dx", np.array("abc"), right) == ""
    assert J._fd_evidence(J._ln_loss, case, "x", "dx", {"dx": 1}, right) == ""
    text = J._fd_evidence(J._ln_loss, case, "x", "dx", right + 1e-3 * (right > 0), right)
    assert text.startswith(". A centred finite difference of sum(dy * y) (h = 1e-05) puts dx[")


def test_first_hint_returns_the_first_matching_candidate():
    right = np.array([1.0, 2.0])
    candidates = {"first": np.array([1.0, 2.0]), "second": np.array([1.0, 2.0])}
    assert J._first_hint(right, candidates, np.float64) == "first"
    assert J._first_hint(np.array([1.0, 2.0, 3.0]), candidates, np.float64) is None
    assert J._first_hint(np.array("text"), candidates, np.float64) is None
    assert J._first_hint(np.array([1.0, 2.00001]), candidates, np.float32) == "first"
    assert J._first_hint(np.array([1.0, 2.00001]), candidates, np.float64) is None
    assert J._with_hint("off", None) == "off" and J._with_hint("off", "h") == "off. Hint: h"


def test_token_sum_and_float64():
    values = np.arange(12.0).reshape(2, 2, 3)
    np.testing.assert_array_equal(J._token_sum(values), [18, 22, 26])
    converted = J._float64({"x": np.ones(2, np.float32), "n": np.array(3)})
    assert converted["x"].dtype == converted["n"].dtype == np.float64


# ----- the inline answers --------------------------------------------------------------------


def test_letters_and_letter_for():
    assert J._letters("(b), C") == "bc"
    assert J._letters("B and b") == "b"  # "and" is a word, not an a and a d
    assert J._letters("(d) neither") == "d"
    assert J._letters(["c", "a"]) == "ac"
    assert J._letters("efg") == ""
    # the article "a" before a word is not the letter (a)
    assert J._letters("b (a column)") == "b"
    assert J._letters("B: A column of x") == "b"
    assert J._letters("a and c") == J._letters("a or c") == J._letters("a, c") == "ac"
    assert J._letters("a b") == J._letters("(a) b") == "ab"
    assert J._letters("(a) one example") == J._letters("a: one row") == "a"
    assert [J._letter_for(a, b) for a, b in ((1, 0), (0, 1), (1, 1), (0, 0))] == [
        "a", "b", "c", "d"]


def test_the_truths_are_what_torch_says():
    """RMSNorm with eps = 0: dx . x = 0 but sum(dx) is not (b). GroupNorm: each group
    and each example sum to zero (bc). dy = 1, gamma = 1: the projection term
    vanishes by itself, the mean term does not (b)."""
    x = torch.randn(16, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x.requires_grad_(True)
    dy = torch.randn(16, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    (F.rms_norm(x, (8,), eps=None) * dy).sum().backward()
    assert (x.grad * x.detach()).sum(-1).abs().max() < 1e-10
    assert x.grad.sum(-1).abs().max() > 1e-3
    assert J._rms_zero_truth() == "b"
    assert J._gn_zero_sums_truth() == "bc"
    assert J._blind_check_truth() == "b"


@pytest.mark.parametrize("name, question, right, wrong", [
    ("backward_rms_zero_answer",
     "which quantity is zero for RMSNorm's dx (eps = 0), for every token and every dy",
     ["b", "(B)"], ["a", "c", "bd"]),
    ("backward_gn_zero_sums_answer", "which sums of GroupNorm's dx are zero for every dy",
     ["bc", "c, b"], ["b", "abc"]),
    ("backward_blind_check_answer",
     "which wrong dx a gradient check with dy = 1 and gamma = 1 cannot catch",
     ["b", " b "], ["a", "d"]),
])
def test_answers_are_judged_with_the_question_named(name, question, right, wrong):
    assert _registry.make_cases(name) == [("your answer", {})]
    assert _registry.judge(name, [("your answer", {})], {"0/answer": np.array(right[0])},
                           {})["passed"]
    judge = J._answer_judge(name)  # built here, so that a change to the builder shows
    for answer in right:
        assert judge({}, {"answer": np.array(answer)}) is None
    for answer in wrong:
        given = J._letters(answer)
        expected = (f"give your answer: one letter, from a to d (you answered {given})"
                    if J._ANSWERS[name][1] == J.ONE_LETTER and len(given) > 1 else
                    f"not right yet: {question} (you answered {given})")
        assert judge({}, {"answer": np.array(answer)}) == expected
    assert judge({}, {"answer": np.array("None")}) == \
        f"give your answer: {J._ANSWERS[name][1]}, from a to d"


# The released test cell of each inline answer, and the name the answer is stored in.
ANSWER_CELLS = {"backward_rms_zero_answer": ("rms_zero_correct", "rms_zero"),
                "backward_gn_zero_sums_answer": ("gn_zero_sums_correct", "gn_zero_sums"),
                "backward_blind_check_answer": ("blind_check_correct", "blind_check"),
                "backward_accumulation_answer": ("acc_prediction_correct", "accumulation"),
                "backward_bn_eval_answer": ("bn_eval_correct", "bn_eval")}


@pytest.mark.parametrize("name", sorted(ANSWER_CELLS))
def test_an_answer_left_as_released_gets_the_same_words_from_validate_and_the_grader(name):
    """Left as released (None), a letter answer fails its visible test and the hidden
    judge with one sentence: give your answer, how many letters, from which."""
    grade_id, variable = ANSWER_CELLS[name]
    release = REPO / "release" / "04_backward_pass" / "04_backward_pass.ipynb"
    (cell,) = [c for c in nbformat.read(release, as_version=4).cells
               if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id]
    with pytest.raises(AssertionError) as visible:
        exec(cell.source, {variable: None})
    hidden = J._answer_judge(name)({}, {"answer": np.array(str(None))})
    assert str(visible.value) == hidden
    assert hidden.startswith("give your answer: ") and hidden.endswith(", from a to d")


# ----- the probes ----------------------------------------------------------------------------


def test_forward_probe_reports_y_and_the_caches_statistics():
    case = _case("backward_ln_forward_cache", 3)
    report = P._call_forward(_reference_forward, case)
    assert set(report) == {"y", "mean", "rstd"}
    y, mean, rstd = _ln_torch(case)[:3]
    np.testing.assert_allclose(report["y"], y, rtol=1e-12)
    np.testing.assert_allclose(report["mean"], mean, rtol=1e-12)
    np.testing.assert_allclose(report["rstd"], rstd, rtol=1e-12)


@pytest.mark.parametrize("forward, problem", [
    (lambda x, g, b, eps: (x, (1, 2)),
     "the cache is a tuple; return a dict with keys 'mean' and 'rstd'"),
    (lambda x, g, b, eps: (x, {"mu": 1, "var": 2}),
     "the cache has no key 'mean', 'rstd' (its keys are 'mu', 'var')"),
    (lambda x, g, b, eps: (x, {"mean": 1, "std": 2}),
     "the cache has no key 'rstd' (its keys are 'mean', 'std')"),
    (lambda x, g, b, eps: x, "layer_norm_forward should return two things, (y, cache)"),
    (lambda x, g, b, eps: [x, {}, {}], "layer_norm_forward should return two things, (y, cache)"),
])
def test_forward_probe_explains_a_cache_it_cannot_read(forward, problem):
    case = _case("backward_ln_forward_cache", 0)
    report = P._call_forward(forward, case)
    assert set(report) >= {"cache_problem"} and str(report["cache_problem"]) == problem
    verdict = _verdict("backward_ln_forward_cache", forward, P._call_forward)
    assert verdict["message"] == f"backward_ln_forward_cache, {FORWARD_LABELS[0]}: {problem}"


def test_forward_probe_accepts_a_list_pair_and_any_mapping():
    from types import MappingProxyType

    def forward(x, gamma, beta, eps):
        y, cache = _reference_forward(x, gamma, beta, eps)
        return [y, MappingProxyType(cache)]

    assert _verdict("backward_ln_forward_cache", forward, P._call_forward)["passed"]


def _spoiling(function):
    """Wrap a student's function so that it scribbles over every array it is given."""
    def wrapped(*args):
        result = function(*args)
        for arg in args:
            if isinstance(arg, np.ndarray):
                arg[...] = 0
        return result

    return wrapped


def test_probes_hand_the_student_copies():
    """A student's code that works in place must not change the grader's inputs."""
    case = _case("backward_ln_dx", 1)
    before = {k: v.copy() for k, v in case.items()}
    seen = {}

    def forward(x, gamma, beta, eps):
        seen["eps"] = eps
        return _spoiling(_reference_forward)(x, gamma, beta, eps)

    P._call_forward(forward, case)
    P._call_ln_backward((forward, _spoiling(_reference_backward)), case)
    P._call_rms_backward(_spoiling(_rms_reference), case)
    gn = _case("backward_gn_dx", 1)
    gn_before = {k: v.copy() for k, v in gn.items()}
    P._call_gn_backward(_spoiling(_gn_reference), gn)
    for key, value in before.items():
        np.testing.assert_array_equal(case[key], value)
    for key, value in gn_before.items():
        np.testing.assert_array_equal(gn[key], value)
    assert type(seen["eps"]) is float


def test_backward_probe_passes_the_students_own_cache():
    """The student's backward gets exactly what the student's forward returned."""
    case = _case("backward_ln_dx", 2)
    marker = object()

    def forward(x, gamma, beta, eps):
        y, cache = _reference_forward(x, gamma, beta, eps)
        return y, (marker, cache)

    def backward_(dy, cache):
        assert cache[0] is marker
        np.testing.assert_array_equal(dy, case["dy"])
        return _reference_backward(dy, cache[1])

    report = P._call_ln_backward((forward, backward_), case)
    assert set(report) == {"dx", "dgamma", "dbeta"}
    right = _ln_torch(case)
    for key, value in zip(("dx", "dgamma", "dbeta"), right[3:]):
        np.testing.assert_allclose(report[key], value, rtol=1e-10, atol=1e-12)


def test_rms_and_gn_probes_call_with_the_documented_arguments():
    calls = []

    def rms(dy, x, gamma, eps):
        calls.append(("rms", dy.shape, x.shape, gamma.shape, type(eps)))
        return _rms_reference(dy, x, gamma, eps)

    def gn(dy, x, num_groups, gamma, eps):
        calls.append(("gn", dy.shape, x.shape, num_groups, gamma.shape, type(eps),
                      type(num_groups)))
        return _gn_reference(dy, x, num_groups, gamma, eps)

    rms_case = _case("backward_rms_dx", 1)
    report = P._call_rms_backward(rms, rms_case)
    assert set(report) == {"dx", "dgamma"}
    np.testing.assert_allclose(report["dx"], _rms_torch(rms_case)[0], rtol=1e-10)
    np.testing.assert_allclose(report["dgamma"], _rms_torch(rms_case)[1], rtol=1e-10)
    gn_case = _case("backward_gn_dx", 2)
    report = P._call_gn_backward(gn, gn_case)
    assert set(report) == {"dx", "dgamma", "dbeta"}
    for key, value in zip(("dx", "dgamma", "dbeta"), _gn_torch(gn_case)):
        np.testing.assert_allclose(report[key], value, rtol=1e-10, atol=1e-12)
    assert calls == [("rms", (5, 8), (5, 8), (8,), float),
                     ("gn", (2, 4), (2, 4), 2, (4,), float, int)]
    assert np.asarray(rms_case["dy"]).shape == (5, 8)


@pytest.mark.parametrize("probe, name, count, result, shown", [
    (P._call_rms_backward, "rms_norm_backward", 2, np.zeros(3), "ndarray"),
    (P._call_rms_backward, "rms_norm_backward", 2, (1, 2, 3), "tuple"),
    (P._call_gn_backward, "group_norm_backward", 3, [1, 2], "list"),
    (P._call_gn_backward, "group_norm_backward", 3, None, "NoneType"),
])
def test_a_wrong_number_of_results_is_named(probe, name, count, result, shown):
    case = _case("backward_gn_dx" if "group" in name else "backward_rms_dx", 0)
    with pytest.raises(TypeError) as raised:
        probe(lambda *args: result, case)
    assert str(raised.value) == f"{name} should return {count} arrays, got {shown}"


def test_unpack_accepts_a_list_of_the_right_length():
    assert P._unpack([1, 2], "f", 2) == [1, 2]
    assert P._answer_as_text(("b", "c"), {})["answer"].item() == "('b', 'c')"


@pytest.mark.parametrize("check, name, subject", [
    (P.check_layer_norm_forward, "backward_ln_forward_cache", (_reference_forward,)),
    (P.check_layer_norm_backward_dx, "backward_ln_dx", (_reference_forward, _reference_backward)),
    (P.check_layer_norm_backward_params, "backward_ln_params",
     (_reference_forward, _reference_backward)),
    (P.check_rms_norm_backward_dx, "backward_rms_dx", (_rms_reference,)),
    (P.check_rms_norm_backward_dgamma, "backward_rms_dgamma", (_rms_reference,)),
    (P.check_group_norm_backward_dx, "backward_gn_dx", (_gn_reference,)),
    (P.check_group_norm_backward_params, "backward_gn_params", (_gn_reference,)),
    (P.check_rms_zero_answer, "backward_rms_zero_answer", ("b",)),
    (P.check_gn_zero_sums_answer, "backward_gn_zero_sums_answer", ("bc",)),
    (P.check_blind_check_answer, "backward_blind_check_answer", ("b",)),
])
def test_each_check_runs_its_own_cases(check, name, subject, capsys):
    check(*subject)
    assert capsys.readouterr().out.startswith(f"{name}: all ")


# ----- float32 tolerance, groups of two, seeds and spreads of the cases --------------------

def _float32_near(values):
    """`values` in float32, 5e-5 off relatively: inside float32's tolerance, not float64's."""
    return (np.asarray(values, np.float64) * (1 + 5e-5)).astype(np.float32)


def test_a_float32_forward_is_held_to_float32_tolerance():
    """A float32 forward whose y and mean are 5e-5 off passes; a float32 standard
    deviation given for rstd, 5e-5 off, is still named."""
    case = _case("backward_ln_forward_cache", 6)
    assert case["x"].dtype == np.float32
    y, mean, rstd = _ln_torch(case)[:3]
    output = {"y": _float32_near(y), "mean": _float32_near(mean), "rstd": _float32_near(rstd)}
    assert _judge("backward_ln_forward_cache", case, output) is None
    output["rstd"] = _float32_near(1.0 / rstd)
    message = _judge("backward_ln_forward_cache", case, output)
    assert message.endswith(
        HINT + "rstd is the reciprocal, 1 / sqrt(var + eps), not the standard deviation")


@pytest.mark.parametrize("name, index, gradient", [
    ("backward_ln_dx", 6, lambda case: _ln_torch(case)[3]),
    ("backward_rms_dx", 5, lambda case: _rms_torch(case)[0]),
    ("backward_gn_dx", 7, lambda case: _gn_torch(case)[0]),
])
def test_a_float32_slip_is_named_at_float32_precision(name, index, gradient):
    """A float32 dx with its sign flipped and float32-sized round-off gets the sign hint."""
    case = _case(name, index)
    assert case["x"].dtype == np.float32
    message = _judge(name, case, {"dx": _float32_near(-gradient(case))})
    assert message.endswith(HINT + "the sign of dx is flipped")


def test_a_float32_average_for_dgamma_is_named():
    """Layer norm's float32 dgamma averaged over the tokens, with float32 round-off,
    gets the sum-not-average hint."""
    case = _case("backward_ln_params", 5)
    assert case["x"].dtype == np.float32
    _, _, _, _, dgamma, dbeta = _ln_torch(case)
    tokens = case["x"].size // case["x"].shape[-1]
    message = _judge("backward_ln_params", case,
                     {"dgamma": _float32_near(dgamma / tokens), "dbeta": dbeta})
    assert message.endswith(HINT + "dgamma is a sum over tokens, not an average")


def test_an_unbiased_variance_is_named_on_groups_of_two():
    """On x of shape (2, 4) with 2 groups (two values a group), the dx formula written with
    the unbiased variance (divide by M - 1 = 1) gets the biased-variance hint."""
    case = _case("backward_gn_dx", 2)
    assert case["x"].shape == (2, 4) and int(case["num_groups"]) == 2
    dx = _gn_wrong_dx(case, ddof=1)
    assert not np.allclose(dx, _gn_torch(case)[0], rtol=1e-3, atol=0)
    message = _judge("backward_gn_dx", case, {"dx": dx})
    assert message.endswith(
        HINT + "the variance is the biased one: divide by the group's size M, not M - 1")


def test_first_hint_diagnoses_no_boolean_answer():
    """Booleans are not numbers to a hint: no slip is named, even one that equals them."""
    assert J._first_hint(np.array([True, False]), {"a slip": np.array([1.0, 0.0])},
                         np.float64) is None
    assert J._first_hint(np.array([1, 0]), {"a slip": np.array([1.0, 0.0])},
                         np.float64) == "a slip"


@pytest.mark.parametrize("name", ["backward_ln_dx", "backward_rms_dx"])
def test_every_random_dy_comes_from_the_checks_seed(name):
    """Each case whose dy the label does not give draws it from the seed: two seeds give
    two different dy, so no answer can be written down ahead of the check."""
    first, second = _cases(name, 0), _cases(name, 1)
    for (label, one), (_, other) in list(zip(first, second))[1:]:
        assert not np.allclose(one["dy"], other["dy"]), label


def _pooled_x(name, index, seeds=range(5)):
    return np.concatenate([_case(name, index, seed)["x"].ravel() for seed in seeds])


@pytest.mark.parametrize("name, index, loc, scale", [
    ("backward_ln_forward_cache", 2, 0.0, 1.0),  # a batch of 4 tokens, d = 8
    ("backward_ln_forward_cache", 3, 2.0, 3.0),  # a 3-D batch (2, 3, 16)
    ("backward_ln_dx", 1, 0.0, 1.0),  # a batch of 5 tokens, d = 8
    ("backward_ln_dx", 2, 1.0, 2.0),  # a 3-D batch (2, 3, 16)
    ("backward_ln_dx", 3, 0.0, 1.0),  # a 4-D batch (2, 2, 3, 8)
    ("backward_rms_dx", 2, 3.0, 1.0),  # tokens with mean 3
])
def test_batch_values_are_spread_as_drawn(name, index, loc, scale):
    """The batches' values are N(loc, scale): pooled over five seeds, the mean and the
    standard deviation land near them (a shift or scale of 1 would be many errors off)."""
    values = _pooled_x(name, index)
    assert abs(values.mean() - loc) < 0.3 * scale
    assert 0.85 * scale < values.std() < 1.15 * scale


def test_first_hint_compares_infinite_answers_without_warnings():
    """An answer with an infinity next to a candidate with one is compared quietly: the
    student's verdict carries no RuntimeWarning from inf - inf."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert J._first_hint(np.array([np.inf, 1.0]), {"a slip": np.array([np.inf, 2.0])},
                             np.float64) is None


@pytest.mark.filterwarnings("ignore::numpy.exceptions.ComplexWarning")
def test_a_complex_dx_is_quoted_by_its_real_part():
    """A complex dx is read as its real part, as the tolerance sentence reads it: the
    evidence points at the real part's worst entry and quotes that real number."""
    case = _case("backward_ln_dx", 1)
    right = _ln_torch(case)[3]
    dx = 2 * right + 1j * np.arange(right.size).reshape(right.shape)
    message = _judge("backward_ln_dx", case, {"dx": dx})
    problem = mismatch(2 * right, right, dtype=case["x"].dtype, what="dx")
    _check_evidence(message, problem=problem, name="dx", yours=2 * right, right=right)


# ---------------------------------------------------------------- BatchNorm (training mode)

BN_SHAPES = [(2, 3), (4, 3), (7, 5), (6, 6), (32, 16)]
# images: one pixel each (BatchNorm over vectors), one image (N = 1), a column of pixels
BN2D_SHAPES = [(4, 3, 2, 5), (1, 3, 4, 4), (6, 2, 1, 1), (2, 2, 3, 1)]


def _bn_inputs(seed, shape, loc=1.0, scale=2.0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    d = shape[1]
    return tuple(a.astype(dtype) for a in (
        rng.normal(loc, scale, size=shape), rng.normal(1.0, 0.5, size=d),
        rng.normal(size=d), rng.normal(size=shape)))


def _bn_torch_grads(x, gamma, beta, dy, eps=1e-5):
    leaves = _torch_leaves(x, gamma, beta)
    F.batch_norm(leaves[0], None, None, leaves[1], leaves[2], training=True,
                 eps=eps).backward(torch.tensor(np.asarray(dy, dtype=np.float64)))
    return [leaf.grad.numpy() for leaf in leaves]


@pytest.mark.parametrize("seed, shape", list(enumerate(BN_SHAPES + BN2D_SHAPES)))
@pytest.mark.parametrize("eps", [1e-5, 1e-1])
def test_batch_norm_backward_matches_torch_autograd(seed, shape, eps):
    """Over vectors (N, D), and over images (N, C, H, W), Exercise 7's case."""
    x, gamma, beta, dy = _bn_inputs(seed, shape)
    route = backward.batch_norm_backward if x.ndim == 2 else backward.batch_norm_2d_backward
    ours = route(dy, x, gamma, eps)
    for mine, theirs in zip(ours, _bn_torch_grads(x, gamma, beta, dy, eps)):
        assert mine.shape == theirs.shape
        np.testing.assert_allclose(mine, theirs, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed, shape", list(enumerate(BN_SHAPES[:4])))
def test_batch_norm_gradient_check_agrees(seed, shape):
    x, gamma, beta, dy = _bn_inputs(seed, shape)

    def loss():
        return np.sum(dy * batchnorm.batch_norm(x, gamma, beta, None, None, True)[0])

    for grad, wrt in zip(backward.batch_norm_backward(dy, x, gamma), (x, gamma, beta)):
        assert _relative_error(grad, _centred_differences(loss, wrt)) < 1e-7


def test_batch_norm_backward_is_layer_norm_backward_of_the_transpose():
    """Statistics down the batch are layer norm's statistics along the rows of x.T."""
    x, gamma, _, dy = _bn_inputs(3, (6, 4))
    dx, _, _ = backward.batch_norm_backward(dy, x, gamma)
    _, cache = backward.layer_norm_forward(x.T, np.ones(6), np.zeros(6))
    dx_t, _, _ = backward.layer_norm_backward((dy * gamma).T, cache)
    np.testing.assert_allclose(dx, dx_t.T, rtol=1e-12, atol=1e-14)


def test_batch_norm_backward_float32_in_float32_out():
    x, gamma, beta, dy = _bn_inputs(2, (8, 4), dtype=np.float32)
    grads = backward.batch_norm_backward(dy, x, gamma)
    assert all(g.dtype == np.float32 for g in grads)
    for mine, theirs in zip(grads, _bn_torch_grads(x, gamma, beta, dy)):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)


def test_batch_norm_dx_sums_to_zero_over_the_batch_but_not_over_the_features():
    x, gamma, _, dy = _bn_inputs(4, (16, 8))
    dx, _, _ = backward.batch_norm_backward(dy, x, gamma)
    assert np.abs(dx.sum(axis=0)).max() < 1e-12 * np.abs(dx).max() * 16
    assert np.abs(dx.sum(axis=1)).max() > 1e-3


def _bn_staged_torch(dy, x, gamma, eps=1e-5):
    """Unusual but right: the stages in torch tensors, without autograd, as tensors."""
    x, dy = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(dy, dtype=torch.float64)
    n = x.shape[0]
    xc = x - x.mean(0)
    inv = ((xc**2).mean(0) + eps).rsqrt()
    dxhat = dy * torch.as_tensor(gamma, dtype=torch.float64)
    dvar = (dxhat * xc).sum(0) * -0.5 * inv**3
    dxc = dxhat * inv + dvar * 2 * xc / n
    return dxc - dxc.mean(0), (dy * xc * inv).sum(0), dy.sum(0)


def test_batch_norm_checks_pass_the_reference_and_a_staged_torch_backward():
    for subject in (backward.batch_norm_backward, _bn_staged_torch):
        check_batch_norm_backward_dx(subject)
        check_batch_norm_backward_params(subject)


_BN_NOTEBOOK = """
import numpy as np
from normref import backward


def batch_norm_stages(x, gamma, beta, eps=1e-5):
    rstd = 1 / np.sqrt(x.var(axis=0) + eps)
    return None, {"x_hat": (x - x.mean(axis=0)) * rstd, "rstd": rstd}


def batch_norm_backward(dy, x, gamma, eps=1e-5):
    return backward.batch_norm_backward(dy, x, gamma, eps)


def _columns(a):
    return np.moveaxis(a, 1, -1).reshape(-1, a.shape[1])  # (N * H * W, C)


def batch_norm_2d_backward(dy, x, gamma, eps=1e-5):
    _, kept = batch_norm_stages(_columns(x), gamma, 0 * gamma, eps)
    x_hat, n = kept["x_hat"], _columns(x).shape[0]
    dy = _columns(dy)
    dbeta, dgamma = dy.sum(axis=0), (dy * x_hat).sum(axis=0)
    dx = gamma * kept["rstd"] / n * (n * dy - dbeta - x_hat * dgamma)
    shape = (x.shape[0],) + x.shape[2:] + (x.shape[1],)
    return np.moveaxis(dx.reshape(shape), -1, 1), dgamma, dbeta


def closed_that_runs_the_staged(dy, x, gamma, eps=1e-5):
    route = batch_norm_backward
    dx, dgamma, dbeta = route(_columns(dy), _columns(x), gamma, eps)
    shape = (x.shape[0],) + x.shape[2:] + (x.shape[1],)
    return np.moveaxis(dx.reshape(shape), -1, 1), dgamma, dbeta


def staged_that_runs_the_closed(dy, x, gamma, eps=1e-5):
    dx, dgamma, dbeta = batch_norm_2d_backward(dy[:, :, None, None], x[:, :, None, None],
                                               gamma, eps)
    return dx[:, :, 0, 0], dgamma, dbeta
"""


def test_each_batch_norm_route_is_graded_on_its_own_work():
    """In one notebook (one namespace), the spatial closed form may call
    batch_norm_stages for x_hat, but a spatial backward that runs the staged
    backward on the channels moved last (the reuse Exercise 7 rules out), and a
    staged backward that runs the spatial one on one-pixel images, earn nothing."""
    notebook = {}
    exec(compile(_BN_NOTEBOOK, "<notebook>", "exec"), notebook)
    check_batch_norm_2d_backward_dx(notebook["batch_norm_2d_backward"])
    check_batch_norm_2d_backward_params(notebook["batch_norm_2d_backward"])
    check_batch_norm_backward_dx(notebook["batch_norm_backward"])
    closed = notebook["batch_norm_2d_backward"]
    notebook["batch_norm_2d_backward"] = notebook["closed_that_runs_the_staged"]
    for check in (check_batch_norm_2d_backward_dx, check_batch_norm_2d_backward_params):
        with pytest.raises(CheckFailed, match="ran your batch_norm_backward .*Exercise 7"):
            check(notebook["closed_that_runs_the_staged"])
    notebook["batch_norm_2d_backward"] = closed
    notebook["batch_norm_backward"] = notebook["staged_that_runs_the_closed"]
    for check in (check_batch_norm_backward_dx, check_batch_norm_backward_params):
        with pytest.raises(CheckFailed, match="ran your batch_norm_2d_backward.*Exercise 6"):
            check(notebook["staged_that_runs_the_closed"])


def _bn_staged_recording(dy, x, gamma, eps=1e-5, grads=None, xc_slip=False,
                         stored=("x_hat", "var", "xc", "mean")):
    """Exercise 6's walk in numpy, storing what `stored` names in grads; with
    xc_slip, xc's gradient is stored before its second use is added."""
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    n = x.shape[0]
    xc = x - x.mean(axis=0)
    rstd = 1 / np.sqrt((xc**2).mean(axis=0) + eps)
    dx_hat = dy * gamma
    dvar = -0.5 * rstd**3 * (dx_hat * xc).sum(axis=0)
    dxc_first = dx_hat * rstd
    dxc = dxc_first + 2 * xc * dvar / n
    dmean = -dxc.sum(axis=0)
    found = {"x_hat": dx_hat, "var": dvar[None, :],  # (1, D) is accepted
             "xc": dxc_first if xc_slip else dxc, "mean": dmean}
    if grads is not None:
        grads.update({key: found[key] for key in stored})
    return dxc + dmean / n, (dy * xc * rstd).sum(axis=0), dy.sum(axis=0)


def test_the_stage_gradients_reference_agrees_with_centred_differences():
    """Each stage's gradient, bumped into the table's forward pass by hand."""
    case = backward_judges._bn_cases(np.random.default_rng(1))[0][1]
    reference = backward_judges._bn_stage_reference(case)
    x, dy, gamma, beta = (np.asarray(case[k], np.float64) for k in ("x", "dy", "gamma", "beta"))

    def loss(name, bump):
        made = {}

        def make(key, value):
            made[key] = value + bump if key == name else value
            return made[key]

        mean = make("mean", x.mean(axis=0))
        xc = make("xc", x - mean)
        var = make("var", (xc**2).mean(axis=0))
        x_hat = make("x_hat", xc / np.sqrt(var + 1e-5))
        return np.sum(dy * (gamma * x_hat + beta))

    for name, expected in reference.items():
        bump = np.zeros(expected.shape)
        estimate = np.zeros(expected.shape)
        for index in np.ndindex(bump.shape):
            bump[index] = 1e-6
            up = loss(name, bump)
            bump[index] = -1e-6
            estimate[index] = (up - loss(name, bump)) / 2e-6
            bump[index] = 0.0
        np.testing.assert_allclose(expected, estimate, rtol=1e-6, atol=1e-8, err_msg=name)


def test_the_staged_route_is_graded_on_its_recorded_stage_gradients():
    check_batch_norm_stage_gradients(_bn_staged_recording)
    with pytest.raises(CheckFailed, match=r"grads\['xc'\].*used twice"):
        check_batch_norm_stage_gradients(
            lambda *a, grads=None: _bn_staged_recording(*a, grads=grads, xc_slip=True))


def test_a_right_dx_without_recorded_stages_earns_no_stage_points():
    """The lesson's closed form handed in as the staged route: its dx passes,
    its walk is not there to grade."""
    def closed(dy, x, gamma, eps=1e-5, grads=None):
        return backward.batch_norm_backward(dy, x, gamma, eps)

    check_batch_norm_backward_dx(closed)
    with pytest.raises(CheckFailed, match="no key 'x_hat'.*Your dx is right"):
        check_batch_norm_stage_gradients(closed)
    with pytest.raises(CheckFailed, match="no key 'mean'"):
        check_batch_norm_stage_gradients(
            lambda *a, grads=None: _bn_staged_recording(
                *a, grads=grads, stored=("x_hat", "var", "xc")))


def test_batch_norm_checks_pass_the_reference_for_any_seed():
    probe = backward_probes._call_bn_backward
    for seed in range(8):
        for name, reference in (("backward_bn_dx", backward.batch_norm_backward),
                                ("backward_bn_params", backward.batch_norm_backward),
                                ("backward_bn2d_dx", backward.batch_norm_2d_backward),
                                ("backward_bn2d_params", backward.batch_norm_2d_backward)):
            cases = _registry.make_cases(name, seed)
            outputs, errors = _runner._probe_all(reference, cases, probe)
            verdict = _registry.judge(name, cases, outputs, errors)
            assert verdict["passed"], (seed, verdict["message"])


def test_the_judges_reference_is_autograd_through_batch_norm():
    case = backward_judges._bn_cases(np.random.default_rng(0))[1][1]
    theirs = _bn_torch_grads(case["x"], case["gamma"], case["beta"], case["dy"])
    for mine, expected in zip(backward_judges._bn_torch_reference(case), theirs):
        np.testing.assert_array_equal(mine, expected)


def test_bn_cases_are_what_their_labels_say():
    cases = dict(backward_judges._bn_cases(np.random.default_rng(0)))
    assert cases["two examples, shape (2, 5)"]["x"].shape == (2, 5)
    assert cases["a square batch (6, 6)"]["x"].shape == (6, 6)
    assert cases["a float32 batch (32, 16)"]["x"].dtype == np.float32
    assert np.abs(cases["values near 100, shape (8, 4)"]["x"] - 100).max() < 6
    tiny = cases["a tiny spread, 0.001 * N(0, 1), shape (5, 4), where eps matters"]["x"]
    assert tiny.var(axis=0).max() < 1e-5  # below eps: eps changes rstd
    params = backward_judges._bn_params_cases(np.random.default_rng(0))
    assert params[0][1]["x"].shape[0] != params[0][1]["x"].shape[1]


def _bn_wrong(dx_rule=None, dgamma_rule=None, dbeta_rule=None, ddof=0):
    """A BatchNorm backward written here, independently of the judge, with one slip."""
    def batch_norm_backward(dy, x, gamma, eps=1e-5):
        x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
        n = x.shape[0]
        mean = x.mean(0)
        rstd = 1 / np.sqrt(((x - mean) ** 2).sum(0) / (n - ddof) + eps)
        x_hat = (x - mean) * rstd
        g = dy * gamma
        if dx_rule:
            dx = dx_rule(g=g, dy=dy, x=x, x_hat=x_hat, rstd=rstd, n=n, eps=eps)
        else:
            dx = rstd * (g - g.mean(0) - x_hat * (g * x_hat).mean(0))
        dgamma = dgamma_rule(dy, x_hat) if dgamma_rule else (dy * x_hat).sum(0)
        dbeta = dbeta_rule(dy) if dbeta_rule else dy.sum(0)
        return dx, dgamma, dbeta

    return batch_norm_backward


def _ln_stats_dx(g, x, eps, **_):
    mean = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(x.var(-1, keepdims=True) + eps)
    x_hat = (x - mean) * rstd
    return rstd * (g - g.mean(-1, keepdims=True)
                   - x_hat * (g * x_hat).mean(-1, keepdims=True))


def _from_squares_dx(g, x, rstd, n, **_):
    """Staged through var = mean(x^2) - mean^2, with var's path through the mean lost."""
    dvar = -0.5 * rstd**3 * (g * (x - x.mean(0))).sum(0)
    dmean = -(g * rstd).sum(0)
    return g * rstd + dvar * 2 * x / n + dmean / n


def _full(g, x_hat, rstd, **_):
    return rstd * (g - g.mean(0) - x_hat * (g * x_hat).mean(0))


BN_DX_SLIPS = {
    "mean treated as a constant": (
        _bn_wrong(dx_rule=lambda g, x_hat, rstd, **_: rstd * (g - x_hat * (g * x_hat).mean(0))),
        "-mean(g) term"),
    "variance treated as a constant": (
        _bn_wrong(dx_rule=lambda g, rstd, **_: rstd * (g - g.mean(0))), "the variance (and so"),
    "both treated as constants": (
        _bn_wrong(dx_rule=lambda g, rstd, **_: rstd * g), "mean and the variance as constants"),
    "unbiased variance, exact gradient": (
        _bn_wrong(ddof=1, dx_rule=lambda g, x_hat, rstd, n, **_: rstd * (
            g - g.mean(0) - x_hat * (g * x_hat).sum(0) / (n - 1))), "not by N - 1"),
    "unbiased variance in the closed form": (_bn_wrong(ddof=1, dx_rule=_full), "not by N - 1"),
    "variance from squares, its mean path lost": (
        _bn_wrong(dx_rule=_from_squares_dx), "depends on x through the mean too"),
    "layer norm's axis": (_bn_wrong(dx_rule=_ln_stats_dx), "that is layer norm"),
    "no gamma": (_bn_wrong(dx_rule=lambda dy, x_hat, rstd, **_: _full(dy, x_hat, rstd)),
                 "g = dy * gamma"),
    "no rstd": (_bn_wrong(dx_rule=lambda g, x_hat, rstd, **_: _full(g, x_hat, rstd) / rstd),
                "factor rstd"),
    "sign flipped": (_bn_wrong(dx_rule=lambda **kw: -_full(**kw)), "sign of dx"),
}


@pytest.mark.parametrize("slip", list(BN_DX_SLIPS))
def test_batch_norm_dx_slips_are_named_with_finite_difference_evidence(slip):
    _assert_named_with_evidence(check_batch_norm_backward_dx, *BN_DX_SLIPS[slip])


def _assert_named_with_evidence(check, wrong, hint):
    with pytest.raises(CheckFailed, match="Hint") as failure:
        check(wrong)
    assert hint in str(failure.value)
    assert "A centred finite difference" in str(failure.value)


def test_a_right_batch_norm_dx_with_wrong_parameters_passes_the_dx_checks():
    wrong_params = _bn_wrong(dgamma_rule=lambda dy, xh: dy.sum(0), dbeta_rule=lambda dy: 0 * dy)
    check_batch_norm_backward_dx(wrong_params)


@pytest.mark.parametrize("wrong, hint", [
    (_bn_wrong(dgamma_rule=lambda dy, xh: (dy * xh).sum(1)), "not over the features (axis 1)"),
    (_bn_wrong(dbeta_rule=lambda dy: dy.sum(1)), "not over the features (axis 1)"),
    (_bn_wrong(dgamma_rule=lambda dy, xh: dy * xh), "is summed over the batch"),
    (_bn_wrong(dbeta_rule=lambda dy: dy.mean(0)), "not an average"),
    (_bn_wrong(dgamma_rule=lambda dy, xh: dy.sum(0)), "swapped"),
    (_bn_wrong(ddof=1), "not by N - 1"),
])
def test_batch_norm_param_slips_are_named(wrong, hint):
    with pytest.raises(CheckFailed, match="Hint") as failure:
        check_batch_norm_backward_params(wrong)
    assert hint in str(failure.value)


def test_spatial_batch_norm_param_slips_are_named():
    slips = [
        (_bn2d_wrong(dgamma_axes=0), "not over the batch (axis 0) alone: one number per channel"),
        (_bn2d_wrong(axes=(0,)), "not over the batch (axis 0) alone"),
        (_bn2d_wrong(flat=True), "x.reshape(-1, C) does not gather"),
        (_bn2d_wrong(ddof=1), "not N * H * W - 1"),
    ]
    for wrong, hint in slips:
        with pytest.raises(CheckFailed, match="Hint|one number per channel") as failure:
            check_batch_norm_2d_backward_params(wrong)
        assert hint in str(failure.value)


def test_batch_norm_param_slips_on_a_square_batch_and_from_x_are_named():
    case = backward_judges._bn_case(np.random.default_rng(1), (6, 6), 2.0)
    x_hat = backward_judges._bn_x_hat(case["x"], 1e-5)[0]
    dy = case["dy"]
    expected = (dy * x_hat).sum(0)
    hints = {
        "not over the features (axis 1)": (dy * x_hat).sum(1),
        "not by x": (dy * case["x"]).sum(0),
        "not by N - 1": (dy * backward_judges._bn_x_hat(case["x"], 1e-5, ddof=1)[0]).sum(0),
        "not each example's": (
            dy * backward_judges._bn_x_hat(case["x"], 1e-5, axis=-1)[0]).sum(0),
    }
    for hint, wrong in hints.items():
        assert hint in backward_judges._bn_param_hint(wrong, case, "dgamma", expected)


def test_bn_eval_truth_is_what_torch_autograd_says_in_evaluation_mode():
    """Exercise 8 asks about evaluation mode, whose fixed running statistics leave no
    sum of dx at zero (d); training mode's sums over the batch do vanish."""
    gen = np.random.default_rng(2)
    x, dy = (torch.tensor(gen.normal(size=(6, 3))) for _ in range(2))
    running_mean = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    running_var = torch.tensor([1.0, 0.3, 4.0], dtype=torch.float64)
    gamma = torch.tensor([1.5, -0.7, 0.9], dtype=torch.float64)

    def dx(training):
        leaf = x.clone().requires_grad_()
        F.batch_norm(leaf, running_mean.clone(), running_var.clone(), gamma,
                     training=training).backward(dy)
        return leaf.grad

    assert torch.allclose(dx(True).sum(0), torch.zeros(3, dtype=torch.float64), atol=1e-12)
    for axis in (0, 1):
        assert dx(False).sum(axis).abs().min() > 1e-3
    assert backward_judges._bn_eval_truth() == "d"


def _released_cell(grade_id):
    release = REPO / "release" / "04_backward_pass" / "04_backward_pass.ipynb"
    (cell,) = [c for c in nbformat.read(release, as_version=4).cells
               if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id]
    return cell.source


def test_switched_off_batch_is_the_one_the_released_cell_makes():
    """The judge's truth for dgamma_off is computed on the batch the student sees."""
    namespace = {"np": np}
    exec(_released_cell("from_output_off_data"), namespace)
    _, gamma, beta, dy, y, rstd = backward_judges._switched_off_batch()
    for name, judged in (("y_kept", y), ("rstd_kept", rstd), ("gamma_kept", gamma),
                         ("beta_kept", beta), ("dy_kept", dy)):
        np.testing.assert_array_equal(namespace[name], judged)
    assert namespace["gamma_kept"][2] == 0.0


def test_dgamma_off_truth_agrees_with_torch_autograd_on_x():
    """dgamma of the switched-off feature, from x through torch's layer norm."""
    x, gamma, beta, dy, _, _ = backward_judges._switched_off_batch()
    leaf = torch.tensor(gamma, requires_grad=True)
    F.layer_norm(torch.tensor(x), (6,), leaf, torch.tensor(beta), 1e-5).backward(
        torch.tensor(dy))
    assert backward_judges._switched_off_dgamma() == pytest.approx(
        float(leaf.grad[2]), rel=1e-12)


def test_dgamma_off_judge_takes_any_number_type_and_names_the_two_guesses():
    from fractions import Fraction

    truth = backward_judges._switched_off_dgamma()
    for right in (truth, np.float32(truth), torch.tensor(truth), np.array(truth),
                  Fraction(truth)):
        check_dgamma_off_answer(right)
    for wrong, words in ((float("nan"), "do determine it"), (0.0, "safe guess"),
                         (-truth, "is not"), ([truth, truth], "one real number")):
        with pytest.raises(CheckFailed, match=words):
            check_dgamma_off_answer(wrong)
    with pytest.raises(CheckFailed):
        check_dgamma_off_answer(None)


def test_visible_dgamma_off_test_refuses_what_is_not_a_number():
    code = _visible_answer_test("from_output_off_correct")
    exec(code, {"np": np, "dgamma_off": 0.25})
    for wrong in (None, "small", [1.0, 2.0]):
        with pytest.raises(AssertionError):
            exec(code, {"np": np, "dgamma_off": wrong})


# ----- spatial BatchNorm (BatchNorm2d), Exercise 7 --------------------------------------------

def test_batch_norm_2d_backward_agrees_with_centred_differences():
    x, gamma, beta, dy = _bn_inputs(7, (2, 2, 2, 3))

    def loss():
        y = F.batch_norm(torch.from_numpy(x), None, None, torch.from_numpy(gamma),
                         torch.from_numpy(beta), training=True, eps=1e-5)
        return float((torch.from_numpy(dy) * y).sum())

    dx, dgamma, dbeta = backward.batch_norm_2d_backward(dy, x, gamma)
    for mine, array in ((dx, x), (dgamma, gamma), (dbeta, beta)):
        assert _relative_error(mine, _centred_differences(loss, array)) < 1e-8


def test_batch_norm_2d_of_one_pixel_images_is_batch_norm_of_vectors():
    x, gamma, _, dy = _bn_inputs(8, (6, 4))
    flat = backward.batch_norm_backward(dy, x, gamma)
    images = backward.batch_norm_2d_backward(dy[:, :, None, None], x[:, :, None, None], gamma)
    np.testing.assert_allclose(images[0][:, :, 0, 0], flat[0], rtol=1e-12, atol=1e-14)
    for mine, theirs in zip(images[1:], flat[1:]):
        np.testing.assert_allclose(mine, theirs, rtol=1e-12, atol=1e-14)


def test_bn2d_cases_hold_one_pixel_images_a_batch_of_one_and_a_large_channel():
    cases = _cases("backward_bn2d_dx")
    shapes = [case["x"].shape for _, case in cases]
    assert all(len(shape) == 4 for shape in shapes) and len(set(shapes)) >= 6
    assert any(shape[2:] == (1, 1) for shape in shapes)
    assert any(shape[0] == 1 and shape[2] * shape[3] > 1 for shape in shapes)
    assert any(case["x"].dtype == np.float32 for _, case in cases)
    for label, case in cases[:-1]:
        assert str(case["x"].shape) in label, label
    assert [label for label, _ in _cases("backward_bn2d_params")] == [
        label for label, _ in cases]


def _bn2d_wrong(axes=(0, 2, 3), count=None, ddof=0, mean_term=True, flat=False,
                dgamma_axes=(0, 2, 3)):
    """A spatial BatchNorm backward written here, independently of the judge, with one
    slip: statistics over other axes, the means over another count, x.reshape(-1, C)."""
    def batch_norm_2d_backward(dy, x, gamma, eps=1e-5):
        x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
        if flat:  # the channel axis left in place: each "column" mixes channels
            dx, dgamma, dbeta = backward.batch_norm_backward(
                dy.reshape(-1, x.shape[1]), x.reshape(-1, x.shape[1]), gamma, eps)
            return dx.reshape(x.shape), dgamma, dbeta
        n = count(x) if count else int(np.prod([x.shape[a] for a in axes]))
        size = int(np.prod([x.shape[a] for a in axes]))
        mean = x.mean(axis=axes, keepdims=True)
        rstd = 1 / np.sqrt(((x - mean) ** 2).sum(axis=axes, keepdims=True) / (size - ddof)
                           + eps)
        x_hat = (x - mean) * rstd
        g = dy * np.reshape(gamma, (1, -1, 1, 1))
        dx = g - x_hat * (g * x_hat).sum(axis=axes, keepdims=True) / n
        if mean_term:
            dx = dx - g.sum(axis=axes, keepdims=True) / n
        return rstd * dx, (dy * x_hat).sum(axis=dgamma_axes), dy.sum(axis=(0, 2, 3))

    return batch_norm_2d_backward


BN2D_DX_SLIPS = {
    "the count N in the means": (_bn2d_wrong(count=lambda x: x.shape[0]), "not by N"),
    "statistics over the batch alone": (_bn2d_wrong(axes=(0,)),
                                        "not over the batch (axis 0) alone"),
    "x.reshape(-1, C)": (_bn2d_wrong(flat=True), "x.reshape(-1, C) does not gather"),
    "instance norm's axes": (_bn2d_wrong(axes=(2, 3)), "that is instance norm"),
    "mean treated as a constant": (_bn2d_wrong(mean_term=False), "-mean(g) term"),
    "unbiased variance": (_bn2d_wrong(ddof=1), "not N * H * W - 1"),
}


@pytest.mark.parametrize("slip", list(BN2D_DX_SLIPS))
def test_spatial_batch_norm_dx_slips_are_named_with_finite_difference_evidence(slip):
    _assert_named_with_evidence(check_batch_norm_2d_backward_dx, *BN2D_DX_SLIPS[slip])


def test_a_right_spatial_dx_with_the_count_n_in_dx_alone_keeps_its_parameter_points():
    """The typical slip of the count costs dx, not dgamma and dbeta."""
    check_batch_norm_2d_backward_params(_bn2d_wrong(count=lambda x: x.shape[0]))




def test_spatial_batch_norm_by_channels_last_and_a_2d_closed_form_in_torch_passes():
    """Unusual but right: the channels moved last, (N * H * W, C), and a 2-D closed
    form of its own in torch tensors, without autograd."""
    def batch_norm_2d_backward(dy, x, gamma, eps=1e-5):
        dy, x = (torch.as_tensor(np.asarray(a, np.float64)).movedim(1, -1) for a in (dy, x))
        shape, c = x.shape, x.shape[-1]
        x, dy = x.reshape(-1, c), dy.reshape(-1, c)
        x_hat = (x - x.mean(0)) * torch.rsqrt(x.var(0, unbiased=False) + eps)
        g = dy * torch.as_tensor(np.asarray(gamma, np.float64))
        dx = torch.rsqrt(x.var(0, unbiased=False) + eps) * (
            g - g.mean(0) - x_hat * (g * x_hat).mean(0))
        return (dx.reshape(shape).movedim(-1, 1), (dy * x_hat).sum(0), dy.sum(0))

    check_batch_norm_2d_backward_dx(batch_norm_2d_backward)
    check_batch_norm_2d_backward_params(batch_norm_2d_backward)


class _RMSNormFunction(torch.autograd.Function):
    """Exercise 9's Function: (y, rstd) out, x, gamma and rstd saved, backward in
    torch operations with drstd passed on to x."""

    @staticmethod
    def forward(ctx, x, gamma, eps=1e-5):
        rstd = torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, gamma, rstd)
        return gamma * x * rstd, rstd

    @staticmethod
    def backward(ctx, dy, drstd):
        x, gamma, rstd = ctx.saved_tensors
        d = x.shape[-1]
        x_hat = x * rstd
        g = dy * gamma
        dx = (rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
              - drstd * rstd**3 * x / d)
        return dx, (dy * x_hat).reshape(-1, d).sum(0), None


def test_the_rms_function_check_passes_a_twice_differentiable_function():
    check_rms_norm_function(_RMSNormFunction)


def test_the_rms_function_reference_second_derivatives_match_centred_differences():
    """The judge's Hessian-vector product (torch's autograd, twice) against centred
    differences of the first derivatives, from the numpy reference backward."""
    label, case = J._rms_function_cases(np.random.default_rng(0))[1]
    expected = J._rms_function_reference(case)
    x, gamma, dy, u, v = (np.array(case[k], dtype=np.float64)
                          for k in ("x", "gamma", "dy", "u", "v"))

    def directional():
        dx, dgamma = backward.rms_norm_backward(dy, x, gamma, float(case["eps"]))
        return float(np.sum(dx * u) + np.sum(dgamma * v))

    for name, array in (("hx", x), ("hgamma", gamma)):
        estimate = np.zeros_like(array)
        for index in np.ndindex(array.shape):
            start = array[index]
            array[index] = start + 1e-5
            up = directional()
            array[index] = start - 1e-5
            down = directional()
            array[index] = start
            estimate[index] = (up - down) / 2e-5
        assert _relative_error(expected[name], estimate) < 1e-7, name


class _NumpyBackward(torch.autograd.Function):
    """The lesson's pattern: numpy on ctx, right once, opaque to autograd."""

    @staticmethod
    def forward(ctx, x, gamma, eps=1e-5):
        x, gamma = x.detach().numpy().copy(), gamma.detach().numpy().copy()
        rstd = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
        ctx.saved = (x, gamma, rstd, eps)
        return torch.from_numpy(gamma * x * rstd), torch.from_numpy(rstd)

    @staticmethod
    def backward(ctx, dy, drstd):
        x, gamma, rstd, eps = ctx.saved
        dx, dgamma = backward.rms_norm_backward(dy.numpy(), x, gamma, eps)
        dx = dx - drstd.numpy() * rstd**3 * x / x.shape[-1]
        return torch.from_numpy(dx), torch.from_numpy(dgamma), None


class _OnceDifferentiable(_RMSNormFunction):
    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy, drstd):
        return _RMSNormFunction.backward(ctx, dy, drstd)


class _IgnoresDrstd(_RMSNormFunction):
    @staticmethod
    def backward(ctx, dy, drstd):
        return _RMSNormFunction.backward(ctx, dy, torch.zeros_like(drstd))


class _SavesXHat(torch.autograd.Function):
    """x_hat, made in forward and not returned, used in backward: a constant to
    the second differentiation."""

    @staticmethod
    def forward(ctx, x, gamma, eps=1e-5):
        rstd = torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, gamma, rstd, x * rstd)
        return gamma * x * rstd, rstd

    @staticmethod
    def backward(ctx, dy, drstd):
        x, gamma, rstd, x_hat = ctx.saved_tensors
        g = dy * gamma
        dx = (rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
              - drstd * rstd**3 * x / x.shape[-1])
        return dx, (dy * x_hat).reshape(-1, x.shape[-1]).sum(0), None


class _RecomputesRstd(_RMSNormFunction):
    @staticmethod
    def forward(ctx, x, gamma, eps=1e-5):
        y, rstd = _RMSNormFunction.forward(ctx, x, gamma, eps)
        ctx.save_for_backward(x, gamma)
        ctx.eps = eps
        return y, rstd

    @staticmethod
    def backward(ctx, dy, drstd):
        x, gamma = ctx.saved_tensors
        rstd = torch.rsqrt((x * x).mean(-1, keepdim=True) + ctx.eps)
        g = dy * gamma
        x_hat = x * rstd
        dx = (rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
              - drstd * rstd**3 * x / x.shape[-1])
        return dx, (dy * x_hat).reshape(-1, x.shape[-1]).sum(0), None


class _YOnly(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gamma, eps=1e-5):
        return _RMSNormFunction.forward(ctx, x, gamma, eps)[0]

    @staticmethod
    def backward(ctx, dy):
        return _RMSNormFunction.backward(ctx, dy, 0.0)


class _OneGradient(_RMSNormFunction):
    @staticmethod
    def backward(ctx, dy):
        return _RMSNormFunction.backward(ctx, dy, 0.0)


class _FixedEps(_RMSNormFunction):
    @staticmethod
    def forward(ctx, x, gamma, eps=1e-5):
        return _RMSNormFunction.forward(ctx, x, gamma, 1e-5)


@pytest.mark.parametrize("function, named", [
    (_NumpyBackward, "autograd cannot differentiate your backward"),
    (_OnceDifferentiable, "autograd cannot differentiate your backward"),
    (_IgnoresDrstd, "arrives as backward's drstd and must reach x too"),
    (_SavesXHat, "the first derivatives are right, the second are not"),
    (_RecomputesRstd, r"rstd is not there \(your forward saved: saved_tensors\[0\] \(x\); "
                      r"saved_tensors\[1\] \(gamma\)"),
    (_YOnly, r"returned a Tensor, not the two tensors \(y, rstd\)"),
    (_OneGradient, r"one gradient per output of forward, backward\(ctx, dy, drstd\)"),
    (_FixedEps, "not a hard-coded 1e-5"),
], ids=lambda value: getattr(value, "__name__", "")[:24] or None)
def test_the_rms_function_check_names_each_typical_slip(function, named):
    with pytest.raises(CheckFailed, match=named):
        check_rms_norm_function(function)


class _DifferentiatesAgain(_RMSNormFunction):
    """Right derivatives, but backward has autograd differentiate a forward it
    builds again: what the policy forbids."""

    @staticmethod
    def backward(ctx, dy, drstd):
        x, gamma, _ = ctx.saved_tensors
        with torch.enable_grad():
            x_, gamma_ = x.detach().requires_grad_(), gamma.detach().requires_grad_()
            rstd = torch.rsqrt((x_ * x_).mean(-1, keepdim=True) + 1e-5)
            dx, dgamma = torch.autograd.grad(
                ((gamma_ * x_ * rstd) * dy).sum() + (rstd * drstd).sum(), (x_, gamma_))
        return dx, dgamma, None


def test_the_rms_function_check_marks_only_a_backward_that_differentiates_again():
    """The second derivatives are taken without grad mode on inside the engine, so
    a right Function leaves no mark; one whose backward turns autograd on does."""
    from normref.checks import _runner

    check_rms_norm_function(_RMSNormFunction)
    assert _runner.AUTOGRAD_IN_BACKWARD_MARK not in _runner.last_executed
    with pytest.raises(CheckFailed):  # its second derivatives are lost as well
        check_rms_norm_function(_DifferentiatesAgain)
    assert _runner.AUTOGRAD_IN_BACKWARD_MARK in _runner.last_executed


# ---------------------------------------------------------------- layer norm, from its output

def _from_output(seed, shape, gamma=None):
    """x and what a memory-efficient backward is given: dy, y, gamma, beta, rstd (..., 1)."""
    rng = np.random.default_rng(seed)
    x, dy = rng.normal(1.0, 2.0, size=shape), rng.normal(size=shape)
    gamma = rng.normal(1.0, 0.5, size=shape[-1]) if gamma is None else gamma
    beta = rng.normal(size=shape[-1])
    y, cache = backward.layer_norm_forward(x, gamma, beta)
    return x, dy, y, gamma, beta, cache["rstd"][..., None]


@pytest.mark.parametrize("seed, shape", [(0, (6,)), (1, (4, 8)), (2, (2, 3, 16))])
def test_layer_norm_backward_from_output_matches_torch_autograd_from_x(seed, shape):
    x, dy, y, gamma, beta, rstd = _from_output(seed, shape)
    leaves = _torch_leaves(x, gamma, beta)
    F.layer_norm(leaves[0], shape[-1:], leaves[1], leaves[2], 1e-5).backward(
        torch.from_numpy(dy))
    ours = backward.layer_norm_backward_from_output(dy, y, gamma, beta, rstd)
    for mine, leaf in zip(ours, leaves):
        assert _relative_error(mine, leaf.grad.numpy()) < 1e-12


def test_layer_norm_backward_from_output_clamps_gamma_as_apex_does():
    """Where |gamma| < eps the x_hat got back is the true one times |gamma| / eps, its sign
    kept (0 counts as +eps): dx stays finite and within the judge's clamp allowance."""
    gamma = np.array([1.5, 0.0, -4e-6, 2e-6, -0.7, 3e-5, 1.1, -2e-4])
    x, dy, y, _, beta, rstd = _from_output(3, (5, 8), gamma)
    dx, dgamma, dbeta = backward.layer_norm_backward_from_output(dy, y, gamma, beta, rstd)
    assert np.all(np.isfinite(dx)) and np.all(np.isfinite(dgamma))
    _, cache = backward.layer_norm_forward(x, gamma, beta)
    exact = backward.layer_norm_backward(dy, cache)
    x_hat = (x - x.mean(-1, keepdims=True)) * rstd
    got_back = x_hat * np.where(np.abs(gamma) < 1e-5, np.abs(gamma) / 1e-5, 1.0)
    assert np.allclose(dgamma, (dy * got_back).sum(0), rtol=1e-9, atol=1e-12)
    case = {"x": x, "gamma": gamma, "beta": beta, "dy": dy, "eps": np.array(1e-5)}
    dx_room, dgamma_room = J._clamp_allowance(case)
    assert np.all(np.abs(dx - exact[0]) <= dx_room + 1e-9)
    assert np.all(np.abs(dgamma - exact[1]) <= dgamma_room + 1e-9)
    assert np.allclose(dbeta, exact[2], rtol=1e-12)
    assert not np.allclose(dx, exact[0], rtol=1e-6)  # the clamp does cost accuracy


def test_the_from_output_checks_pass_the_reference_and_rstd_of_shape_dots():
    check_backward_from_output_dx(backward.layer_norm_backward_from_output)
    check_backward_from_output_params(backward.layer_norm_backward_from_output)

    def flat_rstd(dy, y, gamma, beta, rstd):
        """rstd taken as one number a token, shape (...)."""
        return backward.layer_norm_backward_from_output(dy, y, gamma, beta,
                                                        np.squeeze(rstd, -1))

    check_backward_from_output_dx(flat_rstd)


def _from_output_variant(slip):
    def variant(dy, y, gamma, beta, rstd):
        ref = backward.layer_norm_backward_from_output
        dx, dgamma, dbeta = ref(dy, y, gamma, beta, rstd)
        d = np.shape(y)[-1]
        r = np.reshape(rstd, np.shape(y)[:-1] + (1,))
        with np.errstate(all="ignore"):
            x_hat = (y - beta) / gamma
            g = dy * gamma
            unclamped = r * (g - g.mean(-1, keepdims=True)
                             - x_hat * (g * x_hat).mean(-1, keepdims=True))
        unsigned = np.where(np.abs(gamma) < 1e-5, 1e-5, gamma)  # the sign lost
        return {"no clamp": lambda: (unclamped, dgamma, dbeta),
                "no clamp dgamma": lambda: (dx, (dy * x_hat).reshape(-1, d).sum(0), dbeta),
                "no beta": lambda: ref(dy, y, gamma, 0 * beta, rstd),
                "unsigned clamp": lambda: (_from_y(dy, y, gamma, beta, rstd, unsigned),
                                           dgamma, dbeta),
                "unsigned clamp dgamma": lambda: (
                    dx, (dy * (y - beta) / unsigned).reshape(-1, d).sum(0), dbeta),
                "no mean term": lambda: (dx + r * (dy * gamma).mean(-1, keepdims=True),
                                         dgamma, dbeta),
                "dgamma of y": lambda: (dx, (dy * y).reshape(-1, d).sum(0), dbeta),
                "swapped": lambda: (dx, dbeta, dgamma)}[slip]()
    return variant


def _from_y(dy, y, gamma, beta, rstd, divisor):
    """Layer norm's dx with x_hat = (y - beta) / divisor."""
    r = np.reshape(rstd, np.shape(y)[:-1] + (1,))
    x_hat = (y - beta) / divisor
    g = dy * gamma
    return r * (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True))


@pytest.mark.parametrize("slip, check, message", [
    ("no clamp", check_backward_from_output_dx, "Divide by gamma clamped"),
    ("no clamp dgamma", check_backward_from_output_params, "Divide by gamma clamped"),
    ("no beta", check_backward_from_output_dx, "subtract beta before dividing"),
    ("no beta", check_backward_from_output_params, "subtract beta before dividing"),
    ("unsigned clamp", check_backward_from_output_dx, "keep gamma's sign"),
    ("unsigned clamp dgamma", check_backward_from_output_params, "keep gamma's sign"),
    ("no mean term", check_backward_from_output_dx, "missing the -mean\\(g\\) term"),
    ("dgamma of y", check_backward_from_output_params, "dgamma"),
    ("swapped", check_backward_from_output_params, "swapped"),
])
def test_from_output_checks_name_the_slip(slip, check, message):
    with pytest.raises(CheckFailed, match=message):
        check(_from_output_variant(slip))


def _small_gamma_case(seed=0):
    """The from-output case whose gamma has entries under eps (features 3, 10, 20)."""
    cases = _cases("backward_from_output_dx", seed)
    return next(case for label, case in cases if "near 0" in label)


@pytest.mark.parametrize("seed", range(8))  # seeds 5 and 6 once cited features 3 and 10
def test_from_output_dx_evidence_is_quoted_where_yours_leaves_the_clamp_allowance(seed):
    """A clamp that drops gamma's sign is quoted at an entry outside the clamp's room,
    where the finite difference is the answer; never at a gamma = 0 feature, where it
    equals the reference."""
    case = _small_gamma_case(seed)
    args = [np.asarray(case[k], np.float64) for k in ("dy", "y", "gamma", "beta", "rstd")]
    dx = _from_output_variant("unsigned clamp")(*args)[0]
    ref_dx = backward.layer_norm_backward_from_output(*args)[0]
    verdict = _judge("backward_from_output_dx", case, {"dx": dx})
    found = re.search(r"puts dx\[(\d+), (\d+)\] at (\S+); yours is (\S+)", verdict)
    assert found, verdict
    index = (int(found[1]), int(found[2]))
    assert not np.isclose(dx[index], ref_dx[index], rtol=1e-6)  # yours differs there
    exact, _, _ = J._from_output_reference(case)
    assert np.isclose(float(found[3]), exact[index], rtol=1e-5, atol=1e-8)


def test_from_output_dgamma_room_keeps_the_sign_where_gamma_is_under_eps():
    """dgamma at an under-eps feature may shrink toward 0 (x_hat scaled by a factor in
    [0, 1]) but not change sign: a clamp that drops gamma's sign loses the point."""
    case = _small_gamma_case()
    _, room = J._clamp_allowance(case)
    _, exact, _ = J._from_output_reference(case)
    under = np.abs(case["gamma"]) < 1e-5
    assert np.allclose(room[under], np.abs(exact[under])) and not np.any(room[~under])
    args = [np.asarray(case[k], np.float64) for k in ("dy", "y", "gamma", "beta", "rstd")]
    wrong = _from_output_variant("unsigned clamp dgamma")(*args)
    assert np.sign(wrong[1][20]) == -np.sign(exact[20])  # gamma = -4e-6 at feature 20
    verdict = _judge("backward_from_output_params", case,
                     {"dx": wrong[0], "dgamma": wrong[1], "dbeta": wrong[2]})
    assert verdict and "keep gamma's sign" in verdict
    right = backward.layer_norm_backward_from_output(*args)
    assert _judge("backward_from_output_params", case,
                  {"dx": right[0], "dgamma": right[1], "dbeta": right[2]}) is None


def test_from_output_check_accepts_x_hat_taken_as_zero_where_gamma_is_under_eps():
    """Any x_hat between 0 and the true one is within the clamp's range."""
    def zero_there(dy, y, gamma, beta, rstd):
        d = np.shape(y)[-1]
        r = np.reshape(rstd, np.shape(y)[:-1] + (1,))
        seen = np.abs(gamma) >= 1e-5
        x_hat = np.where(seen, (y - beta) / np.where(seen, gamma, 1.0), 0.0)
        g = dy * gamma
        dx = r * (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True))
        return dx, (dy * x_hat).reshape(-1, d).sum(0), np.reshape(dy, (-1, d)).sum(0)

    check_backward_from_output_dx(zero_there)
    check_backward_from_output_params(zero_there)


def test_gn_dx_check_names_gamma_taken_outside_the_group_means():
    case = _case("backward_gn_dx", 0)
    wrong = J._gn_dx_variant(case, gamma_outside=True)
    assert not np.allclose(wrong, J._gn_dx_variant(case))
    assert "gamma does not factor out" in _judge("backward_gn_dx", case, {"dx": wrong})


# ----- the running sum behind dgamma, kept in bfloat16 or float32 -----------------------------


def _to_bfloat16_by_bits(values):
    """float32 -> the nearest bfloat16 (ties to even), by integer arithmetic on the
    bits: an emulation that does not go through torch's bfloat16."""
    bits = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def _emulated_running_sum(dy, x_hat, bfloat16):
    """Row by row in numpy float32, each product and each sum rounded to bfloat16
    when `bfloat16` (a bfloat16 add is a float32 add rounded to bfloat16)."""
    keep = _to_bfloat16_by_bits if bfloat16 else np.float32
    total = np.zeros(dy.shape[1], np.float32)
    for dy_row, x_hat_row in zip(dy, x_hat):
        total = keep(total + keep(dy_row * x_hat_row))
    return total


def _bfloat16_rows(seed, rows, d):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, d, generator=generator).to(torch.bfloat16),
            torch.randn(rows, d, generator=generator).to(torch.bfloat16))


@pytest.mark.parametrize("acc_dtype", [torch.bfloat16, torch.float32])
def test_running_row_sum_rounds_after_every_row_in_its_dtype(acc_dtype):
    dy, x_hat = _bfloat16_rows(0, 512, 16)
    ours = backward.running_row_sum(dy, x_hat, acc_dtype)
    assert ours.dtype == acc_dtype and ours.shape == (16,)
    emulated = _emulated_running_sum(dy.float().numpy(), x_hat.float().numpy(),
                                     acc_dtype == torch.bfloat16)
    np.testing.assert_array_equal(ours.float().numpy(), emulated)


def test_a_bfloat16_running_sum_lands_thousands_of_times_further_than_a_float32_one():
    """The numbers Exercise 11 has the student measure, against float64."""
    dy, x_hat = _bfloat16_rows(11, 4096, 256)
    exact = (dy.double() * x_hat.double()).sum(dim=0).numpy()
    bf16, fp32 = (_relative_error(backward.running_row_sum(dy, x_hat, t).double().numpy(),
                                  exact) for t in (torch.bfloat16, torch.float32))
    assert 1e-2 < bf16 < 0.5 and fp32 < 1e-5
    assert 1e3 < bf16 / fp32 < 1e6
    assert J._accumulation_truth() == "c"


def _torch_sum(dy, x_hat, acc_dtype):
    return (dy.to(acc_dtype) * x_hat.to(acc_dtype)).sum(dim=0)


def _once_rounded(dy, x_hat, acc_dtype):
    """A running sum whose products stay float32: one rounding a row, not two."""
    total = torch.zeros(dy.shape[1], dtype=acc_dtype)
    for row in range(dy.shape[0]):
        total = (total.float() + dy[row].float() * x_hat[row].float()).to(acc_dtype)
    return total


def test_the_running_sum_check_passes_the_reference_and_a_once_rounded_sum():
    check_accumulate_rows(backward.running_row_sum)
    check_accumulate_rows(_once_rounded)


@pytest.mark.parametrize("wrong, message", [
    (_torch_sum, "add in float32 inside and round only at the end"),
    (lambda dy, x_hat, t: (dy.double() * x_hat.double()).sum(dim=0).to(t),
     "the sum is held wider somewhere"),
    (lambda dy, x_hat, t: _torch_sum(dy, x_hat, t).double() / dy.shape[0],
     r"further than a running sum kept in bfloat16"),
    (lambda dy, x_hat, t: (dy.to(t) * x_hat.to(t)).sum(dim=1),
     r"one number per feature: the rows are what is summed \(axis 0\)"),
    (lambda dy, x_hat, t: backward.running_row_sum(dy, x_hat, torch.bfloat16),
     r"accumulate_rows\(dy, x_hat, torch.float32\) lands .* further than a running sum "
     "kept in float32"),
])
def test_the_running_sum_check_names_the_slip(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        check_accumulate_rows(wrong)


def _bf16_products(dy, x_hat, acc_dtype):
    """A running sum of acc_dtype, each row's products formed in bfloat16 first."""
    total = torch.zeros(dy.shape[-1], dtype=acc_dtype)
    for dy_row, x_hat_row in zip(dy, x_hat):
        total = total + (dy_row * x_hat_row).to(acc_dtype)
    return total


def test_the_running_sum_check_names_products_formed_in_bfloat16():
    with pytest.raises(CheckFailed, match=r"rounded to bfloat16 before it reaches the sum\. "
                       "Convert dy and x_hat to acc_dtype first, then multiply"):
        check_accumulate_rows(_bf16_products)


def _fixed_eps(backward_pass):
    """`backward_pass` that ignores the eps it is given and uses 1e-5."""
    def fixed(*args, **kwargs):
        kwargs.pop("eps", None)
        return backward_pass(*args[:-1], **kwargs)
    return fixed


@pytest.mark.parametrize("check, backward_pass", [
    (check_rms_norm_backward_dx, backward.rms_norm_backward),
    (check_rms_norm_backward_dgamma, backward.rms_norm_backward),
    (check_group_norm_backward_dx, backward.group_norm_backward),
    (check_group_norm_backward_params, backward.group_norm_backward),
    (check_batch_norm_2d_backward_dx, backward.batch_norm_2d_backward),
    (check_batch_norm_2d_backward_params, backward.batch_norm_2d_backward),
])
def test_a_backward_pass_that_ignores_eps_fails_and_is_told_so(check, backward_pass):
    check(backward_pass)  # the same pass, eps used: passes
    with pytest.raises(CheckFailed, match=r"(?s)eps = 0\.1, not 1e-5.*this case's eps is 0\.1, "
                       r"and your answer is the right one for eps = 1e-05.*hard-coded 1e-5"):
        check(_fixed_eps(backward_pass))


def test_a_float32_result_for_a_float64_input_is_named():
    def in_float32(dy, x, gamma, eps=1e-5):
        """The inputs cast to float32 and the pass computed there."""
        return backward.batch_norm_2d_backward(
            *(np.asarray(a, np.float32) for a in (dy, x, gamma)), eps)
    with pytest.raises(CheckFailed, match=r"your dx is float32, though the input is "
                       r"float64: compute in float64"):
        check_batch_norm_2d_backward_dx(in_float32)


def test_the_running_sum_verdicts_quote_only_the_students_own_error():
    """A verdict must not hand out the reference's errors (the prediction's answer)."""
    cases = _registry.make_cases("backward_running_sum")
    label, case = cases[0]
    dy, x_hat = (torch.from_numpy(case[key]).to(torch.bfloat16) for key in ("dy", "x_hat"))
    output = {"bf16": _torch_sum(dy, x_hat, torch.bfloat16).float().numpy(),
              "fp32": _torch_sum(dy, x_hat, torch.float32).numpy()}
    message = J._judge_running_sum(case, output)
    exact = (dy.double() * x_hat.double()).sum(dim=0).numpy()
    reference = _relative_error(
        backward.running_row_sum(dy, x_hat, torch.bfloat16).double().numpy(), exact)
    assert f"{reference:.1e}" not in message
    assert f"{_relative_error(output['bf16'].astype(np.float64), exact):.1e}" in message


# ----- Exercise 2's derived prediction: RMSNorm's sum(dx * x) for eps > 0 ------------------


@pytest.mark.parametrize("eps", [1e-5, 0.3, 0.0])
def test_rms_dx_dot_x_is_what_torch_autograd_gives(eps):
    x, gamma, _, dy = _inputs(7, (6, 16), scale=0.5)
    x[0] *= 1e-3  # a token whose mean square is near eps
    x_t, gamma_t = _torch_leaves(x, gamma)
    y = F.rms_norm(x_t, (16,), gamma_t, eps=eps)
    (y * torch.from_numpy(dy)).sum().backward()
    row_loss = (dy * y.detach().numpy()).sum(axis=-1)
    ours = backward.rms_dx_dot_x(row_loss, (x**2).mean(axis=-1), eps)
    np.testing.assert_allclose(ours, (x_t.grad.numpy() * x).sum(axis=-1),
                               rtol=1e-8, atol=1e-14)


def test_the_dx_dot_x_check_passes_the_reference_and_a_rearranged_formula():
    check_rms_dx_dot_x(backward.rms_dx_dot_x)
    check_rms_dx_dot_x(lambda row_loss, mean_square, eps:
                       0.0 if eps == 0 else row_loss / (1.0 + mean_square / eps))


@pytest.mark.parametrize("wrong, hint", [
    (lambda L, ms, eps: 0.0, "the value when eps = 0"),
    (lambda L, ms, eps: L * eps / (ms + eps) ** 1.5, "that is sum\\(dx \\* x_hat\\)"),
    (lambda L, ms, eps: L * ms / (ms + eps), "your value goes to sum\\(dy \\* y\\)"),
    (lambda L, ms, eps: L * eps / ms, "not by mean\\(x\\^2\\) alone"),
    (lambda L, ms, eps: -L * eps / (ms + eps), "check the sign"),
])
def test_the_dx_dot_x_check_names_the_slip_without_the_answer(wrong, hint):
    with pytest.raises(CheckFailed, match=hint) as failed:
        check_rms_dx_dot_x(wrong)
    label, case = _registry.make_cases("backward_rms_dx_dot_x")[0]
    right = backward.rms_dx_dot_x(*(float(case[k]) for k in ("row_loss", "mean_square",
                                                               "eps")))
    assert label in str(failed.value)
    if hint != "check the sign":  # there the student's own number is the answer negated
        assert f"{right:.6g}" not in str(failed.value)


@pytest.mark.parametrize("exact", [Fraction, Decimal, np.float64,
                                   lambda v: torch.tensor(v, dtype=torch.float64)])
def test_a_right_dx_dot_x_in_any_exact_number_type_passes(exact):
    """The assignment allows the standard library's maths modules: a right formula
    in Fractions or Decimals (or numpy scalars, 0-d tensors) earns its points."""
    check_rms_dx_dot_x(lambda L, ms, eps: exact(L) * exact(eps) / (exact(ms) + exact(eps)))


@pytest.mark.parametrize("answer, problem", [
    (lambda L, ms, eps: None, "is a NoneType, not an array of numbers"),
    (lambda L, ms, eps: [L, ms], "an array of shape \\(2,\\); it should give one number"),
])
def test_the_dx_dot_x_check_explains_a_result_that_is_not_one_number(answer, problem):
    with pytest.raises(CheckFailed, match=problem):
        check_rms_dx_dot_x(answer)


# ---------------------------------------------------------------- numerical differentiation

GRADED_BACKWARDS = ["backward_rms_dx", "backward_rms_dgamma", "backward_gn_dx",
                    "backward_gn_params", "backward_bn_dx", "backward_bn_stages",
                    "backward_bn_params", "backward_bn2d_dx", "backward_bn2d_params",
                    "backward_from_output_dx",
                    "backward_from_output_params"]


@pytest.mark.parametrize("name", GRADED_BACKWARDS)
def test_every_graded_backward_ends_with_a_large_timed_case(name):
    """An O(n) numerical derivative (a forward pass per input) cannot pass: the last
    case has 65,536 values and a time budget, and the budget is what is judged."""
    label, case = _cases(name)[-1]
    assert case["x"].size == 65536 and float(case["time_budget"]) == J.TIME_BUDGET
    assert f"within {J.TIME_BUDGET:g} s" in label
    assert all("time_budget" not in c for _, c in _cases(name)[:-1])
    slow = _judge(name, case, {"seconds": np.array(J.TIME_BUDGET + 1)})
    stopped = _judge(name, case, {"seconds": np.array(J.TIME_BUDGET), "stopped": np.array(True)})
    assert "took 6.0 s" in slow and "numerical differentiation" in slow
    assert "was stopped after 5 s" in stopped


def _coupled(name, case):
    """How many values of the case share one set of statistics (a token, a group,
    a column): what a numerical derivative must perturb, one forward pass each."""
    x = case["x"]
    if name.startswith("backward_gn"):
        return x[0].size // int(case["num_groups"])
    if name.startswith("backward_bn"):
        return x.size // x.shape[1]  # one feature's N values, or a channel's N * H * W
    return x.shape[-1]


@pytest.mark.parametrize("name", GRADED_BACKWARDS)
def test_the_large_case_couples_its_values_so_no_batched_derivative_fits(name):
    """Many short rows let a complex step perturb feature j of every row in one pass
    (64 passes, under a second): the large case is one token, group or column wide."""
    _, case = _cases(name)[-1]
    assert _coupled(name, case) >= 32768


@pytest.mark.parametrize("name", GRADED_BACKWARDS)
def test_running_out_of_memory_on_the_large_case_is_judged_with_why(name):
    """A per-token Jacobian of the large case is 34 GB: the MemoryError is a verdict."""
    _, case = _cases(name)[-1]
    out = {"seconds": np.array(0.1), "out_of_memory": np.array("MemoryError: 32 GiB"),
           "other_route": np.array(True)}
    message = _judge(name, case, out)
    shared = 32768 if name.startswith("backward_gn") else 65536
    assert "ran out of memory" in message and f"{shared:,} values by {shared:,}" in message
    assert ("34.4 GB" if shared == 65536 else "8.59 GB") in message, message
    stopped = _judge(name, case, {"seconds": np.array(5.0), "stopped": np.array(True),
                                  "other_route": np.array(True)})
    assert "was stopped after 5 s" in stopped, stopped


def test_the_probe_reports_a_memory_error_on_the_large_case():
    from normref.checks import backward_probes as P

    case = {**_case("backward_rms_dx", -1)}

    def jacobian(dy, x, gamma, eps):
        raise MemoryError("Unable to allocate 32.0 GiB")

    out = P._call_rms_backward(jacobian, case)
    assert "32.0 GiB" in str(out["out_of_memory"]) and "stopped" not in out


def test_the_probe_stops_a_call_past_its_budget_and_times_a_fast_one():
    import time

    from normref.checks import backward_probes as P

    case = {**_case("backward_rms_dx", -1), "time_budget": np.array(0.2)}

    def slow(dy, x, gamma, eps):
        while True:
            time.sleep(0.01)

    started = time.perf_counter()
    out = P._call_rms_backward(slow, case)
    assert bool(out["stopped"]) and time.perf_counter() - started < 2
    fast = P._call_rms_backward(backward.rms_norm_backward, case)
    assert "stopped" not in fast and float(fast["seconds"]) < 0.2
    assert _judge("backward_rms_dx", {**case, "time_budget": np.array(0.2)}, fast) is None


@pytest.mark.parametrize("name", ["backward_rms_dx", "backward_gn_dx", "backward_bn2d_dx",
                                  "backward_from_output_dx"])
def test_a_complex_gradient_is_refused_though_its_real_part_is_right(name):
    """Complex-step differentiation leaves complex arrays: refused, whatever their real part."""
    label, case = _cases(name)[0]
    outputs = {}
    probe = {"backward_rms_dx": ("dx", "dgamma"), "backward_gn_dx": ("dx", "dgamma", "dbeta"),
             "backward_bn2d_dx": ("dx", "dgamma", "dbeta"),
             "backward_from_output_dx": ("dx", "dgamma", "dbeta")}[name]
    for key in probe:
        outputs[key] = np.zeros(1, complex)
    message = _judge(name, case, outputs)
    assert message and "complex" in message and "numerical differentiation" in message


def test_dx_dot_x_may_not_be_complex():
    case = _case("backward_rms_dx_dot_x", 0)
    right = backward.rms_dx_dot_x(1.0, 4.0, 1e-5)
    assert _judge("backward_rms_dx_dot_x", case, {"dot": np.array(right)}) is None
    assert "complex" in _judge("backward_rms_dx_dot_x", case, {"dot": np.array(right + 0j)})


# ----- the released notebook's visible checks -----------------------------------------

def _released_assert_agrees():
    """assert_agrees, as the released notebook's helpers cell defines it."""
    nb = nbformat.read(REPO / "release/04_backward_pass/04_backward_pass.ipynb", as_version=4)
    helpers = next(c.source for c in nb.cells
                   if c.cell_type == "code" and "def assert_agrees" in c.source)
    namespace = {"np": np, "torch": torch}
    exec(helpers, namespace)
    return namespace["assert_agrees"]


@pytest.mark.parametrize("narrow", [np.float32(1.0), torch.tensor(1.0, dtype=torch.float32),
                                    torch.tensor(1.0, dtype=torch.bfloat16)],
                         ids=["numpy float32", "torch float32", "torch bfloat16"])
def test_visible_check_refuses_a_float32_result_as_the_grader_does(narrow):
    """A float32 result lands within the visible 1e-6 of a float64 estimate, yet the
    grader's float64 tolerance refuses it: Validate says so first, in the grader's words."""
    assert_agrees = _released_assert_agrees()
    estimate = np.full(3, 1.0 + 1e-7)
    yours = np.full(3, narrow) if isinstance(narrow, np.floating) else narrow.repeat(3)
    with pytest.raises(AssertionError, match="compute in float64, as the exercise asks"):
        assert_agrees("dx", yours, estimate)
    # the grader words a float32 result it refuses the same way
    judge_message = backward_judges.mismatch(
        np.full(3, 1.0, np.float32), np.full(3, 2.0), dtype=np.float64, what="dx")
    assert "compute in float64, as the exercise asks" in judge_message


@pytest.mark.parametrize("wide", [np.float64, np.longdouble])
def test_visible_check_accepts_a_float64_or_wider_result(wide):
    assert_agrees = _released_assert_agrees()
    estimate = np.full(3, 1.0 + 1e-9)
    assert_agrees("dx", np.full(3, 1.0, dtype=wide), estimate)
    assert_agrees("dx", torch.ones(3, dtype=torch.float64), estimate)
