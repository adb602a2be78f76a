"""Unit 02, images (N, C, H, W): the spatial references against torch, and their
checks against right code written other ways and against the typical slips."""


import numpy as np
import pytest
import torch
import torch.nn.functional as F
from check_calls import fails, passes

from normref.batchnorm import spatial_batch_norm_forward
from normref.checks import check_spatial_batch_norm
from normref.checks.rows_judges import _judge_spatial, _spatial_bn_cases

TOL = {np.float64: 1e-10, np.float32: 1e-4}


def _t(a):
    return torch.from_numpy(np.asarray(a)).double()




# ---------------------------------------------------------------- references vs torch


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_spatial_batch_norm_matches_torch_batch_norm_in_training_mode(seed, dtype):
    rng = np.random.default_rng(seed)
    shape = tuple(int(s) for s in rng.integers(1, 6, size=4))
    shape = (shape[0] + 1,) + shape[1:]  # at least 2 values per channel
    x = rng.normal(1.0, 3.0, size=shape).astype(dtype)
    gamma, beta = rng.normal(size=shape[1]), rng.normal(size=shape[1])
    eps = [1e-5, 1e-3][seed % 2]
    y = spatial_batch_norm_forward(x, gamma, beta, eps)
    expected = F.batch_norm(_t(x), None, None, _t(gamma), _t(beta), training=True,
                            eps=eps).numpy()
    assert y.dtype == dtype and y.shape == shape
    np.testing.assert_allclose(y, expected, rtol=TOL[dtype], atol=TOL[dtype])


def test_spatial_batch_norm_matches_batchnorm2d_module():
    x = np.random.default_rng(7).normal(size=(3, 4, 5, 2))
    module = torch.nn.BatchNorm2d(4, dtype=torch.float64)
    expected = module(_t(x)).detach().numpy()
    np.testing.assert_allclose(spatial_batch_norm_forward(x, np.ones(4), np.zeros(4)),
                               expected, atol=1e-10)


# ---------------------------------------------------------------- right code passes


def einsum_batch_norm(x, gamma, beta, eps):
    """Right, and written nothing like the reference: sums by einsum."""
    count = x.shape[0] * x.shape[2] * x.shape[3]
    mean = np.einsum("nchw->c", x) / count
    centred = x - mean[:, None, None]
    var = np.einsum("nchw,nchw->c", centred, centred) / count
    return (np.einsum("nchw,c->nchw", centred, gamma / np.sqrt(var + eps))
            + beta[:, None, None])


def test_right_spatial_batch_norms_pass():
    assert "all 5 cases passed" in passes(check_spatial_batch_norm,
                                           spatial_batch_norm_forward)
    assert "all 5 cases passed" in passes(check_spatial_batch_norm, einsum_batch_norm)
    assert "passed" in passes(check_spatial_batch_norm, lambda x, g, b, eps: F.batch_norm(
        torch.as_tensor(x), None, None, torch.as_tensor(g), torch.as_tensor(b),
        training=True, eps=eps))


def test_a_torch_tensor_result_is_judged_like_an_array():
    """Torch is allowed: a tensor result, whose .var() would be the unbiased
    variance, is graded on its values."""
    def in_torch(x, gamma, beta, eps):
        t = torch.as_tensor(x)
        mean = t.mean(dim=(0, 2, 3), keepdim=True)
        var = t.var(dim=(0, 2, 3), unbiased=False, keepdim=True)
        shape = (1, -1, 1, 1)
        return ((t - mean) / torch.sqrt(var + eps) * torch.as_tensor(gamma).reshape(shape)
                + torch.as_tensor(beta).reshape(shape))

    assert "all 5 cases passed" in passes(check_spatial_batch_norm, in_torch)


# ---------------------------------------------------------------- slips are named


def _affine(y, gamma, beta, last_axis=False):
    if last_axis:
        return y * gamma + beta
    return y * gamma[:, None, None] + beta[:, None, None]


def slipped_batch_norm(x, gamma, beta, eps, axes=(0, 2, 3), unbiased=False,
                       eps_outside=False, gamma_last=False):
    x = x.astype(np.float64)
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True, ddof=1 if unbiased else 0)
    spread = np.sqrt(var) + eps if eps_outside else np.sqrt(var + eps)
    return _affine((x - mean) / spread, gamma, beta, gamma_last)


BN_SLIPS = {
    "per_image_and_channel": ({"axes": (2, 3)}, "that is instance norm"),
    "batch_only": ({"axes": (0,)}, "not axis 0 alone"),
    "per_image": ({"axes": (1, 2, 3)}, "not (1, 2, 3)"),
    "unbiased": ({"unbiased": True}, "biased variance (divide by N * H * W)"),
    "eps_outside": ({"eps_outside": True}, "eps goes inside the square root"),
    "gamma_last": ({"gamma_last": True}, "not with the last axis (W)"),
}


@pytest.mark.parametrize("slip", sorted(BN_SLIPS))
def test_each_spatial_batch_norm_slip_is_named(slip):
    knobs, hint = BN_SLIPS[slip]
    message = fails(check_spatial_batch_norm,
                     lambda x, g, b, eps: slipped_batch_norm(x, g, b, eps, **knobs))
    assert "Hint: " in message and hint in message.split("Hint: ")[1], message


def test_a_wrong_answer_no_slip_explains_fails_without_a_hint():
    label, case = _spatial_bn_cases(np.random.default_rng(0))[0]
    doubled = 2 * _affine((case["x"] - case["x"].mean()) / case["x"].std(),
                          case["gamma"], case["beta"])
    verdict = _judge_spatial(case, {"y": doubled})
    assert verdict is not None and "Hint" not in verdict


def test_the_spatial_cases_give_gamma_on_the_last_axis_a_chance_to_run():
    """The first case has W == C, so x_hat * gamma broadcasts and runs."""
    label, case = _spatial_bn_cases(np.random.default_rng(0))[0]
    assert case["x"].shape[1] == case["x"].shape[3], label


def test_float32_spatial_cases_are_held_to_float32_accuracy():
    for label, case in _spatial_bn_cases(np.random.default_rng(0)):
        if case["x"].dtype != np.float32:
            continue
        y = spatial_batch_norm_forward(case["x"], case["gamma"], case["beta"],
                                       float(case["eps"]))
        assert _judge_spatial(case, {"y": y.astype(np.float32)}) is None, label
        assert _judge_spatial(case, {"y": y + 1e-2}) is not None, label
