"""Unit 02, images (N, C, H, W): the spatial references against torch, and their
checks against right code written other ways and against the typical slips."""


import numpy as np
import pytest
import torch
import torch.nn.functional as F
from check_calls import fails, passes

from normref.batchnorm import spatial_batch_norm_forward, spatial_group_norm_forward
from normref.checks import check_spatial_batch_norm, check_spatial_group_norm
from normref.checks.rows_judges import _judge_spatial, _spatial_bn_cases, _spatial_gn_cases

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


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_spatial_group_norm_matches_torch_group_norm(seed, dtype):
    rng = np.random.default_rng(seed)
    groups = int(rng.integers(1, 4))
    shape = (int(rng.integers(1, 4)), groups * int(rng.integers(1, 4)),
             int(rng.integers(1, 5)), int(rng.integers(2, 5)))
    x = rng.normal(-1.0, 2.0, size=shape).astype(dtype)
    gamma, beta = rng.normal(size=shape[1]), rng.normal(size=shape[1])
    y = spatial_group_norm_forward(x, gamma, beta, groups, 1e-5)
    expected = F.group_norm(_t(x), groups, _t(gamma), _t(beta), 1e-5).numpy()
    assert y.dtype == dtype and y.shape == shape
    np.testing.assert_allclose(y, expected, rtol=TOL[dtype], atol=TOL[dtype])


def test_spatial_group_norm_refuses_indivisible_channels_with_torchs_message():
    with pytest.raises(ValueError, match=r"num_channels \(6\) must be divisible by "
                                         r"num_groups \(4\)"):
        spatial_group_norm_forward(np.zeros((1, 6, 2, 2)), np.ones(6), np.zeros(6), 4)


# ---------------------------------------------------------------- right code passes


def einsum_batch_norm(x, gamma, beta, eps):
    """Right, and written nothing like the reference: sums by einsum."""
    count = x.shape[0] * x.shape[2] * x.shape[3]
    mean = np.einsum("nchw->c", x) / count
    centred = x - mean[:, None, None]
    var = np.einsum("nchw,nchw->c", centred, centred) / count
    return (np.einsum("nchw,c->nchw", centred, gamma / np.sqrt(var + eps))
            + beta[:, None, None])


def looped_group_norm(x, gamma, beta, groups, eps):
    """Right, one image and one group at a time, no reshape."""
    y = np.empty_like(x)
    size = x.shape[1] // groups
    for n in range(x.shape[0]):
        for g in range(groups):
            block = x[n, g * size:(g + 1) * size]
            y[n, g * size:(g + 1) * size] = (block - block.mean()) / np.sqrt(
                block.var() + eps)
    return y * gamma[:, None, None] + beta[:, None, None]


def test_right_spatial_batch_norms_pass():
    assert "all 5 cases passed" in passes(check_spatial_batch_norm,
                                           spatial_batch_norm_forward)
    assert "all 5 cases passed" in passes(check_spatial_batch_norm, einsum_batch_norm)
    assert "passed" in passes(check_spatial_batch_norm, lambda x, g, b, eps: F.batch_norm(
        torch.as_tensor(x), None, None, torch.as_tensor(g), torch.as_tensor(b),
        training=True, eps=eps))


def test_right_spatial_group_norms_pass():
    assert "all 6 cases passed" in passes(check_spatial_group_norm,
                                           spatial_group_norm_forward)
    assert "all 6 cases passed" in passes(check_spatial_group_norm, looped_group_norm)


_NOTEBOOK = """
import numpy as np
from normref.batchnorm import spatial_group_norm_forward as written_out


def group_norm(x, num_groups, gamma, beta, eps=1e-5):
    return written_out(x, gamma, beta, num_groups, eps)


def spatial_group_norm_forward(x, gamma, beta, G, eps=1e-5):
    return written_out(x, gamma, beta, G, eps)


def through_exercise_1(x, gamma, beta, G, eps=1e-5):
    mine = group_norm
    return mine(x, G, gamma, beta, eps)
"""


def test_spatial_group_norm_is_graded_only_when_written_out():
    """Exercise 6 asks for the four axes by hand: in one notebook, a spatial group
    norm that runs the notebook's group_norm, under any name, earns nothing, with
    the reason; one that does not call it passes."""
    notebook = {}
    exec(compile(_NOTEBOOK, "<notebook>", "exec"), notebook)
    assert "all 6 cases passed" in passes(check_spatial_group_norm,
                                           notebook["spatial_group_norm_forward"])
    message = fails(check_spatial_group_norm, notebook["through_exercise_1"])
    assert "ran your group_norm" in message and "four axes written out" in message


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


def slipped_group_norm(x, gamma, beta, groups, eps, interleave=False, size_not_count=False,
                       reduce=(2, 3, 4), eps_outside=False, gamma_last=False):
    x = x.astype(np.float64)
    n, c, h, w = x.shape
    count = c // groups if size_not_count else groups
    if interleave:
        blocks = np.swapaxes(x.reshape(n, c // count, count, h, w), 1, 2)
    else:
        blocks = x.reshape(n, count, c // count, h, w)
    mean = blocks.mean(axis=reduce, keepdims=True)
    var = blocks.var(axis=reduce, keepdims=True)
    spread = np.sqrt(var) + eps if eps_outside else np.sqrt(var + eps)
    normed = (blocks - mean) / spread
    if interleave:
        normed = np.swapaxes(normed, 1, 2)
    return _affine(normed.reshape(x.shape), gamma, beta, gamma_last)


GN_SLIPS = {
    "interleave": ({"interleave": True}, "groups every G-th channel together"),
    "size_not_count": ({"size_not_count": True}, "not how many channels a group holds"),
    "per_position": ({"reduce": (2,)}, "not each position on its own"),
    "over_batch": ({"reduce": (0, 2, 3, 4)}, "no statistic crosses the batch"),
    "eps_outside": ({"eps_outside": True}, "eps goes inside the square root"),
    "gamma_last": ({"gamma_last": True}, "not with the last axis (W)"),
}


@pytest.mark.parametrize("slip", sorted(GN_SLIPS))
def test_each_spatial_group_norm_slip_is_named(slip):
    knobs, hint = GN_SLIPS[slip]
    message = fails(check_spatial_group_norm,
                     lambda x, g, b, groups, eps: slipped_group_norm(x, g, b, groups, eps,
                                                                     **knobs))
    assert "Hint: " in message and hint in message.split("Hint: ")[1], message


def test_per_channel_statistics_in_group_norm_are_named_as_instance_norm():
    def per_channel(x, gamma, beta, groups, eps):
        return slipped_group_norm(x, gamma, beta, x.shape[1], eps)

    message = fails(check_spatial_group_norm, per_channel)
    assert "not per channel (that is instance norm)" in message


@pytest.mark.parametrize("make", [_spatial_bn_cases, _spatial_gn_cases])
def test_a_wrong_answer_no_slip_explains_fails_without_a_hint(make):
    label, case = make(np.random.default_rng(0))[0]
    doubled = 2 * _affine((case["x"] - case["x"].mean()) / case["x"].std(),
                          case["gamma"], case["beta"])
    verdict = _judge_spatial(case, {"y": doubled})
    assert verdict is not None and "Hint" not in verdict


def test_the_spatial_cases_give_gamma_on_the_last_axis_a_chance_to_run():
    """The first case of each has W == C, so x_hat * gamma broadcasts and runs."""
    for make in (_spatial_bn_cases, _spatial_gn_cases):
        label, case = make(np.random.default_rng(0))[0]
        assert case["x"].shape[1] == case["x"].shape[3], label


def test_float32_spatial_cases_are_held_to_float32_accuracy():
    for make in (_spatial_bn_cases, _spatial_gn_cases):
        for label, case in make(np.random.default_rng(0)):
            if case["x"].dtype != np.float32:
                continue
            args = (case["x"], case["gamma"], case["beta"])
            if "num_groups" in case:
                y = spatial_group_norm_forward(*args, int(case["num_groups"]),
                                               float(case["eps"]))
            else:
                y = spatial_batch_norm_forward(*args, float(case["eps"]))
            assert _judge_spatial(case, {"y": y.astype(np.float32)}) is None, label
            assert _judge_spatial(case, {"y": y + 1e-2}) is not None, label
