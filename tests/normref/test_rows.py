"""Unit 02 references against torch, and the unit's checks against typical mistakes.
"""

import contextlib
import io
import re
import socket

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from check_calls import fails, passes

from normref import batch_norm, group_norm, rms_norm
from normref.batchnorm import batch_norm_train, fold_batch_norm
from normref.checks import (
    CheckFailed,
    _registry,
    _runner,
    _wire,
    check_batch_norm_train_cs231n,
    check_batch_norm_train_one_example,
    check_batch_norm_train_pytorch,
    check_group_norm,
    check_nudge_answer,
    check_running_var_answers,
    rows_probes,
)
from normref.checks.rows_judges import (
    _block_outputs_moved,
    _channel_cases,
    _fold_cases,
    _group_cases,
    _judge_batch_norm_train,
    _judge_group_norm,
    _judge_nudge_answer,
    _judge_running_var_answers,
    _train_cases,
    block_outputs_moved_by_rule,
    raised_as_asked,
)


def check_batch_norm_train(batch_norm_train):
    """Exercise 3's three graded cells in their order: PyTorch's convention, CS231n's,
    then batches of one example (the first failure raises)."""
    for check in (check_batch_norm_train_pytorch, check_batch_norm_train_cs231n,
                  check_batch_norm_train_one_example):
        check(batch_norm_train)

DTYPES = {np.float64: torch.float64, np.float32: torch.float32}
TOL = {np.float64: 1e-10, np.float32: 1e-4}


def _random_shape(rng, ndim):
    return tuple(int(s) for s in rng.integers(2, 7, size=ndim))


# ---------------------------------------------------------------- batch norm vs torch


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_batch_norm_matches_batchnorm1d_over_several_steps(seed, dtype):
    rng = np.random.default_rng(seed)
    shape = _random_shape(rng, 2 + seed % 2)  # (N, C) or (N, C, L)
    channels = shape[1]
    momentum, eps = [0.1, 0.3, 0.01][seed % 3], [1e-5, 1e-3][seed % 2]
    module = torch.nn.BatchNorm1d(channels, eps=eps, momentum=momentum, dtype=DTYPES[dtype])
    gamma = rng.normal(size=channels).astype(dtype)
    beta = rng.normal(size=channels).astype(dtype)
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(gamma))
        module.bias.copy_(torch.from_numpy(beta))
    running_mean = np.zeros(channels, dtype)
    running_var = np.ones(channels, dtype)
    for _ in range(4):
        x = rng.normal(2.0, 3.0, size=shape).astype(dtype)
        y, running_mean, running_var = batch_norm(x, gamma, beta, running_mean, running_var,
                                                  True, momentum, eps)
        expected = module(torch.from_numpy(x)).detach().numpy()
        assert y.dtype == dtype
        np.testing.assert_allclose(y, expected, atol=TOL[dtype], rtol=TOL[dtype])
        np.testing.assert_allclose(running_mean, module.running_mean.numpy(), rtol=TOL[dtype])
        np.testing.assert_allclose(running_var, module.running_var.numpy(), rtol=TOL[dtype])
    module.eval()
    x = rng.normal(size=shape).astype(dtype)
    y, mean_after, var_after = batch_norm(x, gamma, beta, running_mean, running_var, False,
                                          momentum, eps)
    np.testing.assert_allclose(y, module(torch.from_numpy(x)).detach().numpy(),
                               atol=TOL[dtype], rtol=TOL[dtype])
    np.testing.assert_array_equal(mean_after, running_mean)
    np.testing.assert_array_equal(var_after, running_var)


def test_batch_norm_without_running_statistics_matches_torch():
    x = np.random.default_rng(1).normal(size=(5, 3, 4))
    module = torch.nn.BatchNorm1d(3, affine=False, track_running_stats=False).double()
    for training in (True, False):
        module.train(training)
        y, mean, var = batch_norm(x, None, None, None, None, training)
        np.testing.assert_allclose(y, module(torch.from_numpy(x)).numpy(), atol=1e-12)
        assert mean is None and var is None


def test_batch_norm_momentum_weights_the_new_value_and_running_var_is_unbiased():
    x = np.array([[1.0, 10.0], [3.0, 10.0], [8.0, 16.0]])
    _, mean, var = batch_norm(x, None, None, np.zeros(2), np.ones(2), True)
    np.testing.assert_allclose(mean, 0.9 * 0 + 0.1 * x.mean(axis=0))
    np.testing.assert_allclose(var, 0.9 * 1 + 0.1 * x.var(axis=0, ddof=1))
    assert not np.allclose(var, 0.9 + 0.1 * x.var(axis=0))


def test_batch_norm_eval_is_independent_of_batch_mates_and_accepts_one_token():
    rng = np.random.default_rng(3)
    token, mean, var = rng.normal(size=(1, 4)), rng.normal(size=4), rng.uniform(1, 2, size=4)
    alone, _, _ = batch_norm(token, None, None, mean, var, False)
    crowd, _, _ = batch_norm(np.vstack([token, rng.normal(5, 3, size=(6, 4))]), None, None,
                             mean, var, False)
    np.testing.assert_allclose(alone[0], crowd[0])
    trained, _, _ = batch_norm(np.vstack([token, rng.normal(5, 3, size=(6, 4))]), None, None,
                               mean, var, True)
    assert not np.allclose(trained[0], crowd[0])


@pytest.mark.parametrize("shape", [(1, 3), (1, 3, 1), (1, 7)])
def test_batch_of_one_error_is_torchs(shape):
    with pytest.raises(ValueError) as torch_error:
        torch.nn.BatchNorm1d(shape[1])(torch.zeros(shape))
    with pytest.raises(ValueError) as ours:
        batch_norm(np.zeros(shape), None, None, np.zeros(shape[1]), np.ones(shape[1]), True)
    assert str(ours.value) == str(torch_error.value)
    assert str(ours.value).startswith("Expected more than 1 value per channel when training")


def test_one_example_with_several_positions_trains():
    x = np.random.default_rng(0).normal(size=(1, 3, 5))
    y, _, _ = batch_norm(x, None, None, np.zeros(3), np.ones(3), True)
    expected = torch.nn.BatchNorm1d(3).double()(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(y, expected, atol=1e-12)


# ---------------------------------------------------------------- rms norm vs torch


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_rms_norm_matches_torch(seed, dtype):
    rng = np.random.default_rng(seed)
    shape = _random_shape(rng, 1 + seed % 3)
    d = shape[-1]
    x = rng.normal(seed, 2.0, size=shape).astype(dtype)
    gamma = rng.normal(size=d).astype(dtype)
    eps = [1e-5, 1e-6, 1e-2][seed % 3]
    y = rms_norm(x, gamma, eps)
    assert y.dtype == dtype
    functional = F.rms_norm(torch.from_numpy(x), (d,), torch.from_numpy(gamma), eps=eps)
    np.testing.assert_allclose(y, functional.numpy(), atol=TOL[dtype], rtol=TOL[dtype])
    module = torch.nn.RMSNorm(d, eps=eps, dtype=DTYPES[dtype])
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(gamma))
    np.testing.assert_allclose(y, module(torch.from_numpy(x)).detach().numpy(),
                               atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype, torch_dtype", [
    (np.float64, torch.float64), (np.float32, torch.float32), (np.float16, torch.float16)])
def test_rms_norm_eps_none_is_the_epsilon_torch_computes_with(dtype, torch_dtype):
    """eps=None: float64 and float32 input use their own machine epsilon, float16
    input float32's (torch computes half precision in float32); at values of size
    1e-2, float16's own epsilon (about 1e-3) shows, while float64's could not."""
    x = (np.random.default_rng(3).normal(2.0, 1.0, size=(3, 8)) * 1e-2).astype(dtype)
    torchs = F.rms_norm(torch.from_numpy(x).to(torch_dtype), (8,)).double().numpy()
    ours = rms_norm(x, None, None).astype(np.float64)
    np.testing.assert_allclose(ours, torchs, rtol=5e-3 if dtype == np.float16 else 1e-5)
    own_eps = x.astype(np.float64) / np.sqrt(
        (x.astype(np.float64) ** 2).mean(-1, keepdims=True) + np.finfo(dtype).eps)
    assert (dtype == np.float16) == (not np.allclose(own_eps, torchs, rtol=5e-3))


def test_rms_norm_equals_layer_norm_for_zero_mean_tokens():
    x = np.random.default_rng(0).normal(size=(4, 8))
    x -= x.mean(axis=-1, keepdims=True)
    expected = F.layer_norm(torch.from_numpy(x), (8,)).numpy()
    np.testing.assert_allclose(rms_norm(x), expected, atol=1e-12)


def test_rms_norm_of_zeros_is_zeros():
    np.testing.assert_array_equal(rms_norm(np.zeros((2, 5))), np.zeros((2, 5)))


# ---------------------------------------------------------------- group norm vs torch


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_group_norm_matches_torch(seed, dtype):
    rng = np.random.default_rng(seed)
    groups, per_group = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    channels = groups * per_group
    shape = (int(rng.integers(2, 4)), channels) + _random_shape(rng, seed % 3)
    x = rng.normal(1.0, 3.0, size=shape).astype(dtype)
    gamma, beta = rng.normal(size=channels).astype(dtype), rng.normal(size=channels).astype(dtype)
    eps = [1e-5, 1e-3][seed % 2]
    y = group_norm(x, groups, gamma, beta, eps)
    assert y.dtype == dtype
    expected = F.group_norm(torch.from_numpy(x), groups, torch.from_numpy(gamma),
                            torch.from_numpy(beta), eps)
    np.testing.assert_allclose(y, expected.numpy(), atol=TOL[dtype], rtol=TOL[dtype])


def test_one_group_is_layer_norm_over_channels_and_length():
    x = np.random.default_rng(0).normal(size=(3, 6, 5))
    expected = F.layer_norm(torch.from_numpy(x), (6, 5)).numpy()
    np.testing.assert_allclose(group_norm(x, 1), expected, atol=1e-12)


def test_channels_many_groups_is_instance_norm():
    x = np.random.default_rng(0).normal(size=(3, 6, 5))
    expected = F.instance_norm(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(group_norm(x, 6), expected, atol=1e-12)


@pytest.mark.parametrize("channels,groups", [(4, 3), (6, 4), (5, 2)])
def test_group_norm_divisibility_error_is_torchs(channels, groups):
    with pytest.raises(ValueError) as torch_error:
        torch.nn.GroupNorm(groups, channels)
    with pytest.raises(ValueError) as ours:
        group_norm(np.zeros((2, channels, 3)), groups)
    assert str(ours.value) == str(torch_error.value)


def test_divisibility_message_is_torchs_text():
    with pytest.raises(ValueError, match=r"^num_channels \(4\) must be divisible by "
                                         r"num_groups \(3\)$"):
        group_norm(np.zeros((2, 4, 5)), 3)


# ---------------------------------------------------------------- running statistics


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_pytorch_convention_matches_batchnorm1d_over_several_steps(seed, dtype):
    rng = np.random.default_rng(seed)
    shape = _random_shape(rng, 2 + seed % 2)  # (N, C) or (N, C, L)
    channels, momentum, eps = shape[1], [0.1, 0.3, 0.01][seed % 3], [1e-5, 1e-3][seed % 2]
    module = torch.nn.BatchNorm1d(channels, eps=eps, momentum=momentum, dtype=DTYPES[dtype])
    gamma, beta = (rng.normal(size=channels).astype(dtype) for _ in range(2))
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(gamma))
        module.bias.copy_(torch.from_numpy(beta))
    mean, var = np.zeros(channels, dtype), np.ones(channels, dtype)
    for _ in range(4):
        x = rng.normal(2.0, 3.0, size=shape).astype(dtype)
        y, mean, var = batch_norm_train(x, gamma, beta, mean, var, momentum, "pytorch", eps)
        assert y.dtype == mean.dtype == var.dtype == dtype
        np.testing.assert_allclose(y, module(torch.from_numpy(x)).detach().numpy(),
                                   atol=TOL[dtype], rtol=TOL[dtype])
        np.testing.assert_allclose(mean, module.running_mean.numpy(), rtol=TOL[dtype])
        np.testing.assert_allclose(var, module.running_var.numpy(), rtol=TOL[dtype])


def cs231n_batchnorm_train(x, gamma, beta, running_mean, running_var, momentum, eps):
    """CS231n's batchnorm_forward in "train" mode, transcribed: x (N, D)."""
    sample_mean = x.mean(axis=0)
    sample_var = x.var(axis=0)
    out = gamma * (x - sample_mean) / np.sqrt(sample_var + eps) + beta
    running_mean = momentum * running_mean + (1 - momentum) * sample_mean
    running_var = momentum * running_var + (1 - momentum) * sample_var
    return out, running_mean, running_var


@pytest.mark.parametrize("momentum", [0.9, 0.99, 0.5])
def test_cs231n_convention_matches_cs231ns_update(momentum):
    rng = np.random.default_rng(3)
    gamma, beta = rng.normal(size=4), rng.normal(size=4)
    ours = theirs = (None, np.zeros(4), np.ones(4))
    for _ in range(5):
        x = rng.normal(1.0, 2.0, size=(6, 4))
        ours = batch_norm_train(x, gamma, beta, ours[1], ours[2], momentum, "cs231n")
        theirs = cs231n_batchnorm_train(x, gamma, beta, theirs[1], theirs[2], momentum, 1e-5)
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, atol=1e-12)


def test_complementary_momenta_share_the_mean_and_differ_in_the_variance():
    x = np.random.default_rng(4).normal(size=(5, 3, 2))  # n = 10 values per channel
    start = (np.zeros(3), np.ones(3))
    y_t, mean_t, var_t = batch_norm_train(x, np.ones(3), np.zeros(3), *start, 0.1, "pytorch")
    y_c, mean_c, var_c = batch_norm_train(x, np.ones(3), np.zeros(3), *start, 0.9, "cs231n")
    np.testing.assert_allclose(y_t, y_c)
    np.testing.assert_allclose(mean_t, mean_c)
    np.testing.assert_allclose((var_t - 0.9) / (var_c - 0.9), 10 / 9)


@pytest.mark.parametrize("convention", ["pytorch", "cs231n"])
@pytest.mark.parametrize("shape", [(1, 3), (1, 3, 1)])
def test_one_value_per_channel_raises_and_one_example_of_several_positions_trains(
        convention, shape):
    start = (np.zeros(3), np.ones(3))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        batch_norm_train(np.ones(shape), np.ones(3), np.zeros(3), *start, 0.1, convention)
    batch_norm_train(np.ones((1, 3, 5)), np.ones(3), np.zeros(3), *start, 0.1, convention)


@pytest.mark.parametrize("values", [4, 8])
def test_the_biased_running_var_settles_at_var_times_n_minus_1_over_n(values):
    """The experiment of the assignment, and the truth its question is judged by."""
    rng = np.random.default_rng(5)
    state = {"pytorch": (np.zeros(64), np.ones(64)), "cs231n": (np.zeros(64), np.ones(64))}
    momenta, late = {"pytorch": 0.02, "cs231n": 0.98}, {"pytorch": [], "cs231n": []}
    for step in range(1500):
        batch = rng.normal(0.0, 2.0, size=(values, 64))
        for convention, momentum in momenta.items():
            _, *state[convention] = batch_norm_train(batch, np.ones(64), np.zeros(64),
                                                     *state[convention], momentum, convention)
            if step >= 500:
                late[convention].append(state[convention][1].mean())
    assert np.mean(late["pytorch"]) == pytest.approx(4.0, abs=0.1)
    assert np.mean(late["cs231n"]) == pytest.approx(4.0 * (values - 1) / values, abs=0.1)


# ---------------------------------------------------------------- typical mistakes


def _failure(check, *subject):
    with pytest.raises(CheckFailed) as failed:
        check(*subject)
    return str(failed.value)


def _grouped(x, num_groups, gamma, beta, eps, interleave=False, size_not_count=False,
             over_batch=False, check=True, eps_dropped=False):
    n, c = x.shape[:2]
    if check and c % num_groups:
        raise ValueError("channels must divide into groups")
    count = c // num_groups if size_not_count else num_groups
    if interleave:
        blocks = np.swapaxes(x.reshape(n, c // count, count, -1), 1, 2)
    else:
        blocks = x.reshape(n, count, c // count, -1)
    axes = (0, 2, 3) if over_batch else (2, 3)
    normed = (blocks - blocks.mean(axes, keepdims=True)) / np.sqrt(
        blocks.var(axes, keepdims=True) + (0.0 if eps_dropped else eps))
    if interleave:
        normed = np.swapaxes(normed, 1, 2)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return normed.reshape(x.shape) * gamma.reshape(shape) + beta.reshape(shape)


def test_group_norm_check():
    check_group_norm(_grouped)
    check_group_norm(lambda x, g, gamma, beta, eps: F.group_norm(
        torch.as_tensor(x), g, torch.as_tensor(gamma), torch.as_tensor(beta), eps))
    cases = {
        "consecutive": {"interleave": True},
        "how many groups there are": {"size_not_count": True},
        "each example on its own": {"over_batch": True},
        "raise a ValueError": {"check": False},
        "your output has no eps in it": {"eps_dropped": True},
    }
    for hint, slip in cases.items():
        def student(x, g, gamma, beta, eps, slip=slip):
            return _grouped(x, g, gamma, beta, eps, **slip)

        assert hint in _failure(check_group_norm, student)




def make_batch_norm_train(*, swap=False, unbiased=None, n_from_batch=False,
                          per_token=False, normalize_unbiased=False, raise_on_one=True):
    """A student's batch_norm_train, with one switch per typical slip."""

    def student(x, gamma, beta, running_mean, running_var, momentum, convention="pytorch",
                eps=1e-5):
        x = np.asarray(x, dtype=float)
        axes = (0,) if x.ndim == 2 else (0, 2)
        n = x.shape[0] if n_from_batch else x.size // x.shape[1]
        if raise_on_one and x.size == x.shape[1]:
            raise ValueError("one value per channel")
        shape = (1, -1) + (1,) * (x.ndim - 2)
        mean, var = x.mean(axis=axes), x.var(axis=axes)
        if per_token:
            stats = (x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True))
        else:
            stats = (mean.reshape(shape), var.reshape(shape))
        spread = stats[1] * n / (n - 1) if normalize_unbiased else stats[1]
        y = (x - stats[0]) / np.sqrt(spread + eps) * np.reshape(gamma, shape) + np.reshape(
            beta, shape)
        pytorch = convention == "pytorch"
        new = momentum if pytorch != swap else 1 - momentum
        use_unbiased = pytorch if unbiased is None else unbiased
        with np.errstate(all="ignore"):
            batch_var = var * n / (n - 1) if use_unbiased else var
        return (y, (1 - new) * running_mean + new * mean,
                (1 - new) * running_var + new * batch_var)

    return student


def test_batch_norm_train_check_passes_correct_and_unusual_code():
    check_batch_norm_train(make_batch_norm_train())
    check_batch_norm_train(batch_norm_train)

    def torch_arithmetic(x, gamma, beta, running_mean, running_var, momentum,
                         convention="pytorch", eps=1e-5):
        t = torch.as_tensor(np.asarray(x, dtype=np.float64)).transpose(0, 1)
        flat = t.reshape(t.shape[0], -1)  # C, values
        if flat.shape[1] < 2:
            raise ValueError("need two values per channel")
        var, mean = torch.var_mean(flat, dim=1, correction=0)
        shape = (1, -1) + (1,) * (t.dim() - 2)
        y = ((torch.as_tensor(x) - mean.reshape(shape)) * torch.rsqrt(var.reshape(shape) + eps)
             * torch.as_tensor(gamma).reshape(shape) + torch.as_tensor(beta).reshape(shape))
        keep = 1 - momentum if convention == "pytorch" else momentum
        target = flat.var(dim=1) if convention == "pytorch" else var  # torch: unbiased
        return (y, keep * torch.as_tensor(running_mean) + (1 - keep) * mean,
                keep * torch.as_tensor(running_var) + (1 - keep) * target)

    check_batch_norm_train(torch_arithmetic)


@pytest.mark.parametrize("slip,hint", [
    ({"swap": True}, "weigh the new batch value differently"),
    ({"unbiased": True}, "CS231n's running_var follows the biased batch variance"),
    ({"unbiased": False}, "PyTorch's running_var follows the unbiased"),
    ({"n_from_batch": True}, "N * L for x (N, C, L)"),
    ({"per_token": True}, "one mean and one variance per channel"),
    ({"normalize_unbiased": True}, "under both conventions"),
    ({"raise_on_one": False}, "raise a ValueError"),
])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the no-raise slip divides by 0
def test_batch_norm_train_check_names_the_slip(slip, hint):
    assert hint in _failure(check_batch_norm_train, make_batch_norm_train(**slip))


# ---------------------------------------------------------------- questions


RIGHT_NUDGE = 64 * (512 // 32) * 128 * 128  # batch (64, 512, 128, 128), G = 32


def test_nudge_answer_is_judged_exactly():
    check_nudge_answer(outputs_moved=RIGHT_NUDGE)
    check_nudge_answer(outputs_moved=np.int64(RIGHT_NUDGE))
    check_nudge_answer(outputs_moved=torch.tensor(float(RIGHT_NUDGE)))
    for wrong in (16 * 128 * 128, 64 * 128 * 128, 512 * 128 * 128, RIGHT_NUDGE + 1,
                  None, "many"):
        with pytest.raises(CheckFailed, match="OUTPUTS_MOVED"):
            check_nudge_answer(outputs_moved=wrong)


def test_running_var_answers_are_judged_within_their_tolerance():
    """A number of any exact type the text allows counts (Fraction(7, 8) * 4 is
    exactly 3.5 and once scored 0); a wrong one is named."""
    from decimal import Decimal
    from fractions import Fraction

    eval_std = 2 / np.sqrt(3.5)  # data std 2 over sqrt(running_var 3.5)
    check_running_var_answers(cs231n_var_for_8=3.5, cs231n_eval_std=eval_std)
    check_running_var_answers(cs231n_var_for_8=Fraction(7, 8) * 4, cs231n_eval_std=eval_std)
    check_running_var_answers(cs231n_var_for_8=Decimal("3.5"),
                              cs231n_eval_std=torch.tensor(eval_std))
    check_running_var_answers(cs231n_var_for_8=3.45, cs231n_eval_std=np.float32(1.07))
    with pytest.raises(CheckFailed, match="CS231N_RUNNING_VAR_FOR_8"):
        check_running_var_answers(cs231n_var_for_8=4.0, cs231n_eval_std=eval_std)
    # train's, the experiment's (batches of 4, printed by the notebook), upside down
    for wrong in (1.0, 2 / np.sqrt(3), np.sqrt(3.5) / 2, None):
        with pytest.raises(CheckFailed, match="CS231N_EVAL_STD"):
            check_running_var_answers(cs231n_var_for_8=3.5, cs231n_eval_std=wrong)


def test_the_eval_std_question_matches_a_simulation():
    """The truth the eval question is judged by, measured: settle CS231n's running
    statistics on batches of 8, then normalize fresh data with them."""
    rng = np.random.default_rng(0)
    mean, var = np.zeros(256), np.ones(256)
    for _ in range(2000):
        _, mean, var = batch_norm_train(rng.normal(0.0, 2.0, size=(8, 256)), np.ones(256),
                                        np.zeros(256), mean, var, 0.99, "cs231n")
    fresh = rng.normal(0.0, 2.0, size=(4000, 256))
    std = ((fresh - mean) / np.sqrt(var + 1e-5)).std(axis=0).mean()
    assert std == pytest.approx(2 / np.sqrt(3.5), abs=0.01)
    check_running_var_answers(cs231n_var_for_8=3.5, cs231n_eval_std=float(std))


# ---------------------------------------------------------------- any seed

def through_group_norm(x, eps):
    """Layer norm over the channels, the way the exercise asks: one group norm call."""
    channels_last = np.moveaxis(x, 1, -1)
    c = x.shape[1]
    y = group_norm(channels_last.reshape(-1, c, 1), 1, np.ones(c), np.zeros(c), eps)
    return np.moveaxis(y.reshape(channels_last.shape), -1, 1)


PROBES = {
    "rows_group_norm": (rows_probes._call_group_norm, group_norm),
    "rows_channel_layer_norm": (rows_probes._call_channel_layer_norm, through_group_norm),
    "rows_fold_batch_norm": (rows_probes._call_fold_batch_norm, fold_batch_norm),
    "rows_batch_norm_train_pytorch": (rows_probes._call_batch_norm_train, batch_norm_train),
    "rows_batch_norm_train_cs231n": (rows_probes._call_batch_norm_train, batch_norm_train),
    "rows_batch_norm_train_one_example": (rows_probes._call_batch_norm_train,
                                          batch_norm_train),
}


@pytest.mark.parametrize("seed", [1, 7, 12345])
@pytest.mark.parametrize("name", sorted(PROBES))
def test_references_pass_for_any_seed(name, seed):
    probe, reference = PROBES[name]
    cases = _registry.make_cases(name, seed)
    outputs, errors = _runner._probe_all(reference, cases, probe)
    verdict = _registry.judge(name, cases, outputs, errors)
    assert verdict["passed"], verdict["message"]


# ---------------------------------------------------------------- exception classes

class ShapeError(ValueError):
    """A student's own error class: a ValueError, as the text asks."""


class BatchTooSmall(ShapeError):
    def __init__(self, n):
        super().__init__(f"Expected more than 1 value per channel when training, got {n}")


def test_a_subclass_of_value_error_counts_as_a_value_error():
    """Before, the probe sent type(exc).__name__ and the judge compared names, so
    a ValueError subclass (ShapeError) failed; now the classes of its MRO travel."""
    correct = make_batch_norm_train(raise_on_one=False)

    def own_error(x, gamma, beta, running_mean, running_var, momentum, convention, eps):
        if np.size(x) == np.shape(x)[1]:
            raise BatchTooSmall(1)
        return correct(x, gamma, beta, running_mean, running_var, momentum, convention, eps)

    check_batch_norm_train(own_error)

    def grouped_own_error(x, num_groups, gamma, beta, eps):
        if x.shape[1] % num_groups:
            raise ShapeError(f"num_channels ({x.shape[1]}) must be divisible by num_groups")
        return _grouped(x, num_groups, gamma, beta, eps, check=False)

    check_group_norm(grouped_own_error)


def test_the_probe_reports_the_exception_mro():
    report = rows_probes._raised(lambda: (_ for _ in ()).throw(BatchTooSmall(1)))
    assert str(report["raised"]) == "BatchTooSmall"
    assert "builtins.ValueError" in report["raised_classes"].tolist()
    assert rows_probes._raised(lambda: None)["raised_classes"].size == 0


def test_not_written_and_look_alike_errors_do_not_count():
    """NotImplementedError is a RuntimeError, but means the answer is blank; a class
    that is merely named ValueError is not one."""
    ValueError_ = type("ValueError", (Exception,), {})  # noqa: N806

    def grouped_raising(error):
        def student(x, num_groups, gamma, beta, eps):
            if x.shape[1] % num_groups:
                raise error("channels")
            return _grouped(x, num_groups, gamma, beta, eps, check=False)

        return student

    assert "raise a ValueError" in _failure(check_group_norm, grouped_raising(NotImplementedError))
    assert "raise a ValueError" in _failure(check_group_norm, grouped_raising(ValueError_))
    check_group_norm(grouped_raising(RuntimeError))  # F.group_norm's own error


# Unit 02's checks (normref/checks/rows_probes.py and rows_judges.py): group
# norm, layer norm over channels, batch norm's running statistics, and the questions.


def _rng():
    return np.random.default_rng(0)


def _cases(make):
    return dict(make(_rng()))




def _t(a):
    return torch.from_numpy(np.asarray(a)).double()


# ---------------------------------------------------------------- students


def slipped_group_norm(x, num_groups, gamma, beta, eps, *, size_not_count=False, interleave=False,
               over_batch=False, per_channel=False, one_group=False, eps_outside=False,
               check=True, error=ValueError):
    """A numpy group norm with one switch per typical slip."""
    x = np.asarray(x, dtype=np.float64)
    n, c = x.shape[:2]
    if check and c % num_groups:
        raise error(f"num_channels ({c}) must be divisible by num_groups ({num_groups})")
    g = c // num_groups if size_not_count else num_groups
    g = c if per_channel else 1 if one_group else g
    if interleave:
        blocks = np.swapaxes(x.reshape(n, c // g, g, -1), 1, 2).reshape(n, g, -1)
    else:
        blocks = x.reshape(n, g, -1)
    axes = (0, 2) if over_batch else (2,)
    mean, var = blocks.mean(axes, keepdims=True), blocks.var(axes, keepdims=True)
    spread = np.sqrt(var) + eps if eps_outside else np.sqrt(var + eps)
    normed = (blocks - mean) / spread
    if interleave:
        normed = np.swapaxes(normed.reshape(n, g, c // g, -1), 1, 2)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return normed.reshape(x.shape) * np.reshape(gamma, shape) + np.reshape(beta, shape)


def torch_group_norm(x, num_groups, gamma, beta, eps):
    if x.shape[1] % num_groups:
        raise ValueError("indivisible")  # nn.GroupNorm's check
    return F.group_norm(_t(x), num_groups, _t(gamma), _t(beta), eps).numpy()


# ---------------------------------------------------------------- probes


class Outer:
    class Nested(ValueError):
        pass


def test_the_probe_sends_every_class_of_the_exception():
    """The qualified names, most derived first, so that a subclass of
    ValueError counts and a look-alike named ValueError does not."""
    assert rows_probes.exception_classes(Outer.Nested("x")).tolist() == [
        f"{__name__}.Outer.Nested", "builtins.ValueError", "builtins.Exception",
        "builtins.BaseException", "builtins.object"]
    report = rows_probes._raised(lambda: int("x"))
    assert str(report["raised"]) == "ValueError"
    assert report["raised_classes"].tolist()[0] == "builtins.ValueError"
    nothing = rows_probes._raised(lambda: 3)
    assert str(nothing["raised"]) == "nothing"
    assert nothing["raised_classes"].shape == (0,)
    assert nothing["raised_classes"].dtype.kind == "U"


def test_the_group_norm_probe_calls_with_the_cases_values_as_python_numbers():
    seen = []

    def student(x, num_groups, gamma, beta, eps):
        seen.append((type(num_groups), type(eps)))
        y = torch_group_norm(x, num_groups, gamma, beta, eps)
        x[...] = 0.0  # an in-place edit of the student's copy
        gamma[...] = 0.0
        beta[...] = 0.0
        return y

    assert "rows_group_norm: all 8 cases passed" in passes(check_group_norm, student)
    assert set(seen) == {(int, float)}




def cs231n_step(x, gamma, beta, running_mean, running_var, momentum, eps):
    """CS231n's batchnorm_forward in "train" mode, transcribed: x (N, D)."""
    sample_mean, sample_var = x.mean(axis=0), x.var(axis=0)
    out = gamma * (x - sample_mean) / np.sqrt(sample_var + eps) + beta
    return (out, momentum * running_mean + (1 - momentum) * sample_mean,
            momentum * running_var + (1 - momentum) * sample_var)


def bn_train(x, gamma, beta, running_mean, running_var, momentum, convention, eps, *,
             swap=False, unbiased=None, n_from_batch=False, per_token=False,
             normalize_unbiased=False, raise_on_one=True, weight=None, positions_apart=False):
    """A student's batch_norm_train with one switch per typical slip; x (N, C) or
    (N, C, L). With no switch it is nn.BatchNorm1d's step or CS231n's."""
    x = np.asarray(x, dtype=np.float64)
    if raise_on_one and x.size == x.shape[1]:
        raise ValueError("Expected more than 1 value per channel when training")
    axes = (0,) if x.ndim == 2 else (0, 2)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    n = x.shape[0] if n_from_batch else x.size // x.shape[1]
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    if per_token:
        m, v = x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True)
    elif positions_apart:
        m, v = x.mean(axis=0, keepdims=True), x.var(axis=0, keepdims=True)
    else:
        m, v = mean.reshape(shape), var.reshape(shape)
    if normalize_unbiased:
        v = v * n / (n - 1)
    y = (x - m) / np.sqrt(v + eps) * np.reshape(gamma, shape) + np.reshape(beta, shape)
    pytorch = convention == "pytorch"
    new = momentum if pytorch != swap else 1 - momentum
    if weight is not None:
        new = weight
    use_unbiased = pytorch if unbiased is None else unbiased
    with np.errstate(all="ignore"):
        batch_var = var * n / (n - 1) if use_unbiased else var
    return y, (1 - new) * running_mean + new * mean, (1 - new) * running_var + new * batch_var


def test_right_batch_norm_steps_pass_as_torch_and_cs231n_compute_them():
    """The student step agrees with nn.BatchNorm1d and CS231n's code, and passes."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 3, 4))
    module = torch.nn.BatchNorm1d(3, momentum=0.3).double()
    y, mean, var = bn_train(x, np.ones(3), np.zeros(3), np.zeros(3), np.ones(3), 0.3,
                            "pytorch", 1e-5)
    np.testing.assert_allclose(y, module(_t(x)).detach().numpy(), atol=1e-10)
    np.testing.assert_allclose(mean, module.running_mean.numpy())
    np.testing.assert_allclose(var, module.running_var.numpy())
    x2 = rng.normal(size=(6, 3))
    expected = cs231n_step(x2, np.ones(3), np.zeros(3), np.zeros(3), np.ones(3), 0.9, 1e-5)
    for a, b in zip(bn_train(x2, np.ones(3), np.zeros(3), np.zeros(3), np.ones(3), 0.9,
                             "cs231n", 1e-5), expected):
        np.testing.assert_allclose(a, b)
    assert "rows_batch_norm_train_one_example: all 3 cases passed" in passes(
        check_batch_norm_train, bn_train)


def test_the_batch_norm_probe_chains_the_steps_and_passes_python_numbers():
    """Each step gets the running statistics the previous one returned (as
    arrays, even when the student returns tensors), momentum and eps as floats
    and the convention as text."""
    seen = []

    def student(x, gamma, beta, running_mean, running_var, momentum, convention, eps):
        seen.append((type(running_mean), type(momentum), type(convention), type(eps)))
        y, mean, var = bn_train(x, gamma, beta, running_mean, running_var, momentum,
                                convention, eps)
        running_mean[...] = -1.0  # the student's copy only
        return torch.from_numpy(y), torch.from_numpy(mean), list(var)

    assert passes(check_batch_norm_train, student).count("all 3 cases passed") == 3
    assert set(seen) == {(np.ndarray, float, str, float)}


def test_the_batch_norm_probe_returns_every_steps_output():
    case = _cases(_train_cases)["pytorch, momentum 0.1: 3 steps of a batch of 4 tokens, C = 4"]
    out = rows_probes._call_batch_norm_train(
        lambda *args: bn_train(*args), case)
    assert out["y"].shape == (3, 4, 4)
    assert out["running_mean"].shape == out["running_var"].shape == (3, 4)
    module = torch.nn.BatchNorm1d(4, momentum=0.1).double()
    for step in range(3):
        module(_t(case["x"][step]))
        np.testing.assert_allclose(out["running_mean"][step], module.running_mean.numpy())
        np.testing.assert_allclose(out["running_var"][step], module.running_var.numpy())


def test_running_statistics_that_are_not_numbers_are_named():
    class Stats:
        pass

    def returns_object_mean(x, gamma, beta, running_mean, running_var, momentum, convention,
                            eps):
        y, _, var = bn_train(x, gamma, beta, running_mean, running_var, momentum, convention,
                             eps)
        return y, Stats(), var

    def returns_object_var(x, gamma, beta, running_mean, running_var, momentum, convention,
                           eps):
        y, mean, _ = bn_train(x, gamma, beta, running_mean, running_var, momentum, convention,
                              eps)
        return y, mean, Stats()

    assert "your code raised TypeError: the new running mean is a Stats, not an array of " \
           "numbers" in fails(check_batch_norm_train, returns_object_mean)
    assert "your code raised TypeError: the new running variance is a Stats, not an array " \
           "of numbers" in fails(check_batch_norm_train, returns_object_var)


def test_the_one_value_cases_are_called_with_the_first_batch():
    calls = []

    def student(x, gamma, beta, running_mean, running_var, momentum, convention, eps):
        calls.append((np.shape(x), momentum, convention, eps))
        return bn_train(x, gamma, beta, running_mean, running_var, momentum, convention, eps)

    passes(check_batch_norm_train, student)
    assert calls[-2:] == [((1, 3), 0.1, "pytorch", 1e-5), ((1, 3, 1), 0.9, "cs231n", 1e-5)]


def test_the_answer_probe_sends_text():
    out = rows_probes._answers_as_text({"a": 2048, "b": None}, {})
    assert {k: str(v) for k, v in out.items()} == {"a": "2048", "b": "None"}


# ---------------------------------------------------------------- the cases, as labelled


def _about(x, mean, std):
    """Sample mean within 0.5 and spread within 15 % of what the case was made with."""
    return abs(x.mean() - mean) < 0.5 and abs(x.std() / std - 1) < 0.15


def _shape_in_label(label):
    found = re.search(r"x ?\((\d+(?:, \d+)*)\)|batch \((\d+(?:, \d+)*)\)", label)
    if not found:
        return None
    return tuple(int(n) for n in (found.group(1) or found.group(2)).split(", "))


def test_group_norm_cases_are_as_labelled():
    """Shapes, group counts, eps, dtype and gamma/beta as the labels say."""
    cases = _group_cases(_rng())
    assert len(cases) == 8
    for label, case in cases:
        x = case["x"]
        shape = _shape_in_label(label)
        if shape:
            assert x.shape == shape, label
        groups = re.search(r"with (\d+) groups", label)
        if groups:
            assert int(case["num_groups"]) == int(groups.group(1)), label
        assert x.dtype == (np.float32 if "float32" in label else np.float64), label
        assert case["gamma"].dtype == case["beta"].dtype == x.dtype, label
        assert case["gamma"].shape == case["beta"].shape == (x.shape[1],), label
        eps = re.search(r"eps (\d[\d.e-]*)", label)
        assert float(case["eps"]) == (float(eps.group(1)) if eps else 1e-5), label
        assert ("must_raise" in case) == ("must raise" in label), label
        if "random gamma" not in label and "image" not in label:
            np.testing.assert_array_equal(case["gamma"], np.ones(x.shape[1]))
            np.testing.assert_array_equal(case["beta"], np.zeros(x.shape[1]))
        else:
            assert np.all(case["gamma"] != 1) and np.all(case["beta"] != 0)
    by_label = dict(cases)
    assert int(by_label["1 group: layer norm over (C, L) of each example"]["num_groups"]) == 1
    four = by_label["C groups: instance norm (each channel of each example on its own)"]
    assert int(four["num_groups"]) == four["x"].shape[1] == 4
    indivisible = by_label["C = 6 channels in 4 groups (must raise ValueError)"]
    assert indivisible["x"].shape[1] == 6 and int(indivisible["num_groups"]) == 4
    image = by_label["an image batch (2, 8, 3, 3) with 4 groups"]
    assert np.all(image["gamma"] != 1)


def test_group_norm_cases_have_channels_at_their_own_offsets():
    """Channel k sits near k, so that grouping the wrong channels shows."""
    for label, case in _group_cases(_rng()):
        if "must_raise" in case or "random gamma" in label and "image" not in label:
            continue
        x = case["x"].astype(np.float64)
        per_channel = np.moveaxis(x, 1, 0).reshape(x.shape[1], -1).mean(-1)
        np.testing.assert_allclose(per_channel, np.arange(x.shape[1]), atol=1.0,
                                   err_msg=label)
    x = _cases(_group_cases)["x (3, 4, 5) with 2 groups, random gamma and beta"]["x"]
    assert _about(x, 1.0, 2.0)




def test_batch_norm_cases_are_as_labelled():
    cases = _train_cases(_rng())
    assert len(cases) == 9
    for label, case in cases:
        x = case["x"]
        steps = re.search(r"(\d+) steps", label)
        if steps:
            assert x.shape[0] == int(steps.group(1)), label
        convention = "cs231n" if label.startswith("cs231n") else "pytorch"
        assert str(case["convention"]) == convention, label
        momentum = re.search(r"momentum ([\d.]+)", label)
        assert float(case["momentum"]) == (float(momentum.group(1)) if momentum
                                           else {"pytorch": 0.1, "cs231n": 0.9}[convention])
        assert float(case["eps"]) == (1e-3 if "eps 1e-3" in label else 1e-5), label
        assert x.dtype == (np.float32 if "float32" in label else np.float64), label
        c = x.shape[2]
        for key in ("gamma", "beta", "running_mean", "running_var"):
            assert case[key].dtype == x.dtype and case[key].shape == (c,), (label, key)
        if "random gamma" not in label and "float32" not in label:
            np.testing.assert_array_equal(case["gamma"], np.ones(c))
            np.testing.assert_array_equal(case["beta"], np.zeros(c))
        else:
            assert np.all(case["gamma"] != 1) and np.all(case["beta"] != 0)
        if "starting from" in label:
            np.testing.assert_array_equal(case["running_mean"], np.ones(c))
            np.testing.assert_array_equal(case["running_var"], np.full(c, 2.0))
        else:
            np.testing.assert_array_equal(case["running_mean"], np.zeros(c))
            np.testing.assert_array_equal(case["running_var"], np.ones(c))
        assert ("must_raise" in case) == ("must raise" in label), label
    shapes = [c["x"].shape for _, c in cases]
    assert shapes == [(3, 4, 4), (3, 4, 4), (4, 6, 3, 5), (3, 2, 3, 4), (2, 1, 3, 5),
                      (2, 2, 3), (3, 16, 8), (1, 1, 3), (1, 1, 3, 1)]
    by_label = dict(cases)
    x = by_label["pytorch, momentum 0.3: 4 steps of x (6, 3, 5), random gamma and beta, "
                 "starting from running mean 1 and var 2"]["x"]
    assert _about(x, 3.0, 2.0)
    x = by_label["cs231n, momentum 0.99, eps 1e-3: 3 steps of x (2, 3, 4)"]["x"]
    assert _about(x, -1.0, 3.0)
    x = by_label["cs231n, momentum 0.9: 3 steps of a float32 batch of 16 tokens, C = 8"]["x"]
    assert _about(x, 1.0, 2.0)
    for label in ("pytorch, momentum 0.1: 3 steps of a batch of 4 tokens, C = 4",
                  "cs231n, momentum 0.9: 3 steps of a batch of 4 tokens, C = 4"):
        assert abs(by_label[label]["x"].mean()) < 0.7 and 0.6 < by_label[label]["x"].std() < 1.5


# ---------------------------------------------------------------- group norm verdicts


def test_group_norm_right_answers_pass_and_errors_are_judged_by_class():
    assert "all 8 cases passed" in passes(check_group_norm, torch_group_norm)
    assert "all 8 cases passed" in passes(check_group_norm, group_norm)

    def runtime(x, g, gamma, beta, eps):
        return slipped_group_norm(x, g, gamma, beta, eps, error=RuntimeError)

    assert "all 8 cases passed" in passes(check_group_norm, runtime)


def test_a_guard_on_the_batch_size_costs_only_the_one_example_cell():
    """Raising when x.shape[0] < 2, instead of when a channel has one value, is wrong
    only for one example of several positions: the two conventions' cells still pass,
    the one-example cell fails on the case that should train."""
    def student(*args):
        if np.shape(args[0])[0] < 2:
            raise ValueError("need two examples")
        return bn_train(*args)

    assert "all 3 cases passed" in passes(check_batch_norm_train_pytorch, student)
    assert "all 3 cases passed" in passes(check_batch_norm_train_cs231n, student)
    message = fails(check_batch_norm_train_one_example, student)
    assert message.startswith("rows_batch_norm_train_one_example, pytorch: one example of 5 "
                              "positions, x (1, 3, 5), trains"), message


@pytest.mark.parametrize("error, said", [(None, "returned normally"),
                                         (NotImplementedError, "raised NotImplementedError"),
                                         (KeyError, "raised KeyError"),
                                         (type("ValueError", (Exception,), {}),
                                          "raised ValueError")])
def test_indivisible_channels_must_raise_a_value_error(error, said):
    def student(x, g, gamma, beta, eps):
        return slipped_group_norm(x, g, gamma, beta, eps, check=error is not None,
                          error=error or ValueError)

    message = fails(check_group_norm, student)
    assert message == ("rows_group_norm, C = 6 channels in 4 groups (must raise ValueError): "
                       "6 channels cannot be split into 4 equal groups: raise a ValueError, "
                       f"as torch does (your code {said})")


def test_raised_as_asked_reads_the_classes():
    assert raised_as_asked({"raised_classes": np.array(["builtins.ValueError"])})
    assert raised_as_asked({"raised_classes": np.array(["m.Mine", "builtins.RuntimeError"])})
    assert not raised_as_asked({"raised_classes": np.array(["builtins.NotImplementedError",
                                                            "builtins.RuntimeError"])})
    assert not raised_as_asked({"raised_classes": np.array(["builtins.KeyError"])})
    assert not raised_as_asked({"raised_classes": np.array([], dtype=str)})
    assert not raised_as_asked({})
    assert raised_as_asked({"raised_classes": np.array("builtins.ValueError")})


GROUP_SLIPS = {
    "size_not_count": "num_groups is how many groups there are, each of C // num_groups "
                      "consecutive channels, not how many channels a group holds",
    "interleave": "group consecutive channels (0 .. C/G - 1 form the first group), not every "
                  "G-th channel",
    "over_batch": "take the statistics of each example on its own, not over the batch",
    "per_channel": "normalize over the group's channels AND positions of one example, not "
                   "each channel on its own",
    "one_group": "one set of statistics per group of channels, not one per example",
    "eps_outside": "eps goes inside the square root: sqrt(var + eps)",
}


@pytest.mark.parametrize("slip", sorted(GROUP_SLIPS))
def test_each_group_norm_slip_is_named(slip):
    message = fails(check_group_norm, lambda *a: slipped_group_norm(*a, **{slip: True}))
    assert message.endswith(f". Hint: {GROUP_SLIPS[slip]}"), message
    assert "expected" in message


@pytest.mark.parametrize("label", [label for label, c in _group_cases(_rng())
                                   if "must_raise" not in c])
@pytest.mark.parametrize("slip", sorted(GROUP_SLIPS))
def test_group_norm_slips_are_named_on_every_case_where_they_show(label, slip):
    """Every case, with random gamma and beta and images too; a slip that
    changes nothing on a case passes it."""
    case = _cases(_group_cases)[label]
    args = (case["x"], int(case["num_groups"]), case["gamma"], case["beta"], float(case["eps"]))
    right = torch_group_norm(*args)
    y = slipped_group_norm(*args, **{slip: True}) if not (
        slip in ("size_not_count", "interleave") and case["x"].shape[1] % (
            case["x"].shape[1] // int(case["num_groups"]))) else right
    verdict = _judge_group_norm(case, {"y": y})
    tol = 1e-4 if case["x"].dtype == np.float32 else 1e-6
    if np.allclose(y, right, rtol=tol, atol=tol):
        assert verdict is None
    else:
        hint = verdict.split(". Hint: ")[-1] if ". Hint: " in verdict else None
        assert hint is not None, verdict
        assert hint in GROUP_SLIPS.values()


def test_a_group_norm_no_slip_explains_gets_no_hint():
    case = _cases(_group_cases)["x (2, 6, 4) with 3 groups"]
    args = (case["x"], 3, case["gamma"], case["beta"], 1e-5)
    verdict = _judge_group_norm(case, {"y": 2 * torch_group_norm(*args)})
    assert verdict.startswith("your result is") and "Hint" not in verdict
    assert _judge_group_norm(case, {"y": np.zeros((2, 6))}) == (
        "your result has shape (2, 6); expected shape (2, 6, 4)")


# ---------------------------------------------------------------- batch norm verdicts


BN_SLIPS = [
    ({"swap": True}, "your running_mean after each step",
     "the conventions weigh the new batch value differently: PyTorch's momentum is the weight "
     "of the NEW value, CS231n's the weight of the OLD one"),
    ({"unbiased": False}, "your running_var after each step",
     "PyTorch's running_var follows the unbiased batch variance (divide by n - 1)"),
    ({"n_from_batch": True}, "your running_var after each step",
     "n in n / (n - 1) is the number of values per channel: N * L for x (N, C, L)"),
    ({"weight": 0.0}, "your running_mean after each step",
     "a training step moves the running statistics towards the batch's"),
    ({"weight": 1.0}, "your running_mean after each step",
     "blend the batch's statistic into the running one; do not replace it"),
    ({"per_token": True}, "your y",
     "batch norm takes one mean and one variance per channel, over the batch (and the "
     "positions), not per token"),
    ({"normalize_unbiased": True}, "your y",
     "normalize with the biased batch variance (divide by n) under both conventions"),
]


@pytest.mark.parametrize("slip, what, hint", BN_SLIPS)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_each_batch_norm_slip_is_named(slip, what, hint):
    message = fails(check_batch_norm_train, lambda *a: bn_train(*a, **slip))
    assert f": {what} is " in message
    assert message.endswith(f". Hint: {hint}"), message


def _judge_slip(label, **slip):
    case = _cases(_train_cases)[label]
    output = rows_probes._call_batch_norm_train(lambda *a: bn_train(*a, **slip), case)
    return _judge_batch_norm_train(case, output)


CS = "cs231n, momentum 0.9: 3 steps of a batch of 4 tokens, C = 4"
PT_L = ("pytorch, momentum 0.3: 4 steps of x (6, 3, 5), random gamma and beta, starting from "
        "running mean 1 and var 2")
CS_L = "cs231n, momentum 0.99, eps 1e-3: 3 steps of x (2, 3, 4)"
CS_32 = "cs231n, momentum 0.9: 3 steps of a float32 batch of 16 tokens, C = 8"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_batch_norm_running_stat_hints_under_cs231n():
    assert _judge_slip(CS, unbiased=True).endswith(
        ". Hint: CS231n's running_var follows the biased batch variance (divide by n), the "
        "one it normalizes with")
    assert _judge_slip(CS, swap=True).endswith(
        "PyTorch's momentum is the weight of the NEW value, CS231n's the weight of the OLD one")
    assert _judge_slip(CS, swap=True, unbiased=True).endswith(
        "PyTorch's momentum is the weight of the NEW value, CS231n's the weight of the OLD one")
    assert _judge_slip(CS_32, swap=True).endswith("the weight of the OLD one")
    assert _judge_slip(CS_L, weight=1.0).endswith("do not replace it")
    assert _judge_slip(CS_L, weight=0.0).endswith("towards the batch's")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_batch_norm_hints_with_positions_and_a_random_affine():
    assert _judge_slip(PT_L, n_from_batch=True).endswith("N * L for x (N, C, L)")
    assert _judge_slip(PT_L, unbiased=False).endswith(
        "PyTorch's running_var follows the unbiased batch variance (divide by n - 1)")
    assert _judge_slip(PT_L, positions_apart=True).endswith(
        ". Hint: for x (N, C, L) a channel's statistics cover the batch AND the positions")
    assert _judge_slip(PT_L, per_token=True).endswith("not per token")
    assert _judge_slip(PT_L, normalize_unbiased=True).endswith("under both conventions")
    assert _judge_slip(CS_L, positions_apart=True).endswith("the batch AND the positions")


@pytest.mark.parametrize("label, unbiased", [(CS, True), (PT_L, False)])
def test_a_variance_with_swapped_weights_and_the_other_flavour_is_named(label, unbiased):
    """Right running mean, but the running variance weighs the new batch as the
    other convention does and follows the other convention's variance."""
    case = _cases(_train_cases)[label]
    right = rows_probes._call_batch_norm_train(bn_train, case)
    slipped = rows_probes._call_batch_norm_train(
        lambda *a: bn_train(*a, swap=True, unbiased=unbiased), case)
    verdict = _judge_batch_norm_train(case, {**right, "running_var": slipped["running_var"]})
    assert verdict.startswith("your running_var after each step is")
    assert verdict.endswith("the weight of the OLD one; and each convention has its own "
                            "variance (PyTorch unbiased, CS231n biased)")


def test_eps_outside_the_root_in_batch_norm_is_named():
    def eps_outside(x, gamma, beta, running_mean, running_var, momentum, convention, eps):
        y, mean, var = bn_train(x, gamma, beta, running_mean, running_var, momentum,
                                convention, eps)
        x = np.asarray(x, dtype=np.float64)
        axes = (0,) if x.ndim == 2 else (0, 2)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        m, v = x.mean(axes).reshape(shape), x.var(axes).reshape(shape)
        y = (x - m) / (np.sqrt(v) + eps) * np.reshape(gamma, shape) + np.reshape(beta, shape)
        return y, mean, var

    case = _cases(_train_cases)[CS_L]
    verdict = _judge_batch_norm_train(case, rows_probes._call_batch_norm_train(eps_outside,
                                                                               case))
    assert verdict.endswith(". Hint: eps goes inside the square root: (x - mean) / "
                            "sqrt(var + eps)")


def test_a_batch_norm_no_slip_explains_gets_no_hint():
    def doubled(*args):
        y, mean, var = bn_train(*args)
        return 2 * y, mean, var

    message = fails(check_batch_norm_train, doubled)
    assert message.startswith("rows_batch_norm_train_pytorch, pytorch, momentum 0.1: 3 steps of a "
                              "batch of 4 tokens, C = 4: your y is ")
    assert "Hint" not in message

    def var_off(*args):
        y, mean, var = bn_train(*args)
        return y, mean, var * 3

    message = fails(check_batch_norm_train, var_off)
    assert ": your running_var after each step is " in message and "Hint" not in message


@pytest.mark.parametrize("error, said", [(None, "returned normally"),
                                         (NotImplementedError, "raised NotImplementedError")])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_one_value_per_channel_must_raise(error, said):
    def student(*args):
        if error is not None and np.size(args[0]) == np.shape(args[0])[1]:
            raise error("one value")
        return bn_train(*args, raise_on_one=False)

    message = fails(check_batch_norm_train, student)
    assert message == ("rows_batch_norm_train_one_example, pytorch: a batch of one token "
                       "(must raise ValueError): one value per channel has no variance to "
                       f"measure: raise a ValueError, as torch does (your code {said})")


def test_the_running_statistics_of_each_step_are_compared():
    """A student whose running mean is right only at the last step fails."""
    case = _cases(_train_cases)["pytorch: 2 steps of a batch of 2 tokens (the smallest batch "
                                "training allows)"]
    output = rows_probes._call_batch_norm_train(bn_train, case)
    assert _judge_batch_norm_train(case, output) is None
    output["running_mean"][0] += 1.0
    assert _judge_batch_norm_train(case, output).startswith(
        "your running_mean after each step is")


# ---------------------------------------------------------------- questions


@pytest.mark.parametrize("shape, groups, count", [
    ((2, 8, 3, 3), 4, 2 * 2 * 9), ((3, 6, 2, 2), 3, 3 * 2 * 4), ((1, 4, 5, 1), 1, 4 * 5),
    ((2, 4, 3, 3), 4, 2 * 1 * 9)])
def test_the_nudge_rule_is_what_the_block_moves_when_run(shape, groups, count):
    """Spatial batch norm moves channel 0 of every example at every position; group
    norm then moves channel 0's whole group in every example: N * C / G * positions,
    counted by running the references on batches small enough to run."""
    assert _block_outputs_moved(shape, groups) == count
    assert block_outputs_moved_by_rule(shape, groups) == count


@pytest.mark.parametrize("wrong, hint", [
    (16 * 128 * 128, "group norm alone"), (64 * 128 * 128, "batch norm alone"),
    (64 * 32 * 128 * 128, "G = 32 is the number of groups"),
    (512 * 128 * 128, "cross from one example to the others"),
    (64 * 512 * 128 * 128, "keeps the groups apart"), (12345, "follow the nudge")])
def test_each_nudge_slip_is_named(wrong, hint):
    message = _judge_nudge_answer({}, {"outputs_moved": np.array(str(wrong))})
    assert message.startswith(f"OUTPUTS_MOVED: {wrong} is not right. Hint: ")
    assert hint in message and str(RIGHT_NUDGE) not in message


def test_the_nudge_judge_reads_numbers_and_refuses_the_rest():
    assert _judge_nudge_answer({}, {"outputs_moved": np.array(str(RIGHT_NUDGE))}) is None
    assert _judge_nudge_answer({}, {"outputs_moved": np.array(f"{RIGHT_NUDGE}.0")}) is None
    assert _judge_nudge_answer({}, {"outputs_moved": np.array("many")}) == (
        "give OUTPUTS_MOVED as a number (you gave many)")
    assert _judge_nudge_answer({}, {}) == "give OUTPUTS_MOVED as a number (you gave None)"


def test_the_nudge_check_passes_the_right_count():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        check_nudge_answer(outputs_moved=RIGHT_NUDGE)
    assert "rows_nudge_answer: all 1 cases passed" in out.getvalue()


def test_the_running_var_answers_follow_from_the_biased_average():
    """sigma^2 = 4: the biased variance of 8 values averages 4 * 7 / 8 = 3.5, where
    running_var settles, so eval divides data of std 2 by sqrt(3.5 + 1e-5). The
    experiment's batches of 4 (running_var 3) give the std the notebook prints."""
    eval_std = 2 / np.sqrt(3.5 + 1e-5)

    def judge(var, std):
        return _judge_running_var_answers({}, {"cs231n_var_for_8": np.array(str(var)),
                                               "cs231n_eval_std": np.array(str(std))})

    assert judge(3.5, eval_std) is None
    assert judge(3.59, eval_std + 0.009) is None
    assert judge(3.41, eval_std - 0.009) is None
    var_wrong = ("CS231N_RUNNING_VAR_FOR_8 (you answered {}): what does the biased variance "
                 "of 8 values average to?")
    std_wrong = ("CS231N_EVAL_STD (you answered {}): in eval mode the data's own spread is "
                 "divided by sqrt(running_var + eps); where does CS231n's running_var settle "
                 "for batches of 8?")
    assert judge(3.62, eval_std) == "not yet right: " + var_wrong.format("3.62")
    assert judge(3.38, eval_std) == "not yet right: " + var_wrong.format("3.38")
    assert judge(4.0, 1.0) == ("not yet right: " + var_wrong.format("4.0") + "; "
                               + std_wrong.format("1.0"))
    for wrong in (eval_std + 0.02, eval_std - 0.02, 2 / np.sqrt(4), "x"):
        assert judge(3.5, wrong) == "not yet right: " + std_wrong.format(wrong)
    assert "that is the eval std after training on batches of 4" in judge(3.5, 2 / np.sqrt(3))
    assert _judge_running_var_answers({}, {}).startswith(
        "not yet right: CS231N_RUNNING_VAR_FOR_8 (you answered None)")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        check_running_var_answers(cs231n_var_for_8=3.5, cs231n_eval_std=eval_std)
    assert "rows_running_var_answers: all 1 cases passed" in out.getvalue()


# ---------------------------------------------------------------- every slip on every case


def _slips(convention):
    """slip -> (switches, the hint's ending), for a case of this convention."""
    pytorch = convention == "pytorch"
    return {
        "swap": ({"swap": True}, "CS231n's the weight of the OLD one"),
        "flavour": ({"unbiased": not pytorch},
                    "(divide by n - 1)" if pytorch else "the one it normalizes with"),
        "n": ({"n_from_batch": True}, "N * L for x (N, C, L)"),
        "frozen": ({"weight": 0.0}, "moves the running statistics towards the batch's"),
        "replaced": ({"weight": 1.0}, "do not replace it"),
        "per_token": ({"per_token": True}, "not per token"),
        "unbiased_y": ({"normalize_unbiased": True}, "under both conventions"),
        "positions": ({"positions_apart": True}, "cover the batch AND the positions"),
    }


TRAIN_LABELS = [label for label, case in _train_cases(_rng()) if "must_raise" not in case]


@pytest.mark.parametrize("label", TRAIN_LABELS)
@pytest.mark.parametrize("slip", sorted(_slips("pytorch")))
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_batch_norm_slips_are_named_on_every_case_where_they_show(label, slip):
    """Each slip, on each case: passes where it changes nothing, else gets its hint
    (including the one-example case, where n counted from the batch is 1, and the
    2-token case, where n - 1 is 1)."""
    case = _cases(_train_cases)[label]
    switches, hint = _slips(str(case["convention"]))[slip]
    output = rows_probes._call_batch_norm_train(lambda *a: bn_train(*a, **switches), case)
    right = rows_probes._call_batch_norm_train(bn_train, case)
    verdict = _judge_batch_norm_train(case, output)
    tol = 1e-4 if case["x"].dtype == np.float32 else 1e-6
    same = all(np.allclose(output[k], right[k], rtol=tol, atol=tol) for k in right)
    if same:
        assert verdict is None
    elif not all(np.isfinite(output[k]).all() for k in output):
        # n = 1 from the batch: the student's n / (n - 1) is infinite; no hint fits
        assert verdict is not None and "Hint" not in verdict, verdict
    else:
        assert verdict is not None and verdict.endswith(hint), verdict


@pytest.mark.parametrize("label", TRAIN_LABELS)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_running_var_slip_alone_is_named_on_every_case(label):
    """Right y and running mean, running_var with one slip: the variance's hint."""
    case = _cases(_train_cases)[label]
    right = rows_probes._call_batch_norm_train(bn_train, case)
    for slip in ("swap", "flavour", "n", "frozen", "replaced"):
        switches, hint = _slips(str(case["convention"]))[slip]
        slipped = rows_probes._call_batch_norm_train(
            lambda *a, switches=switches: bn_train(*a, **switches), case)
        tol = 1e-4 if case["x"].dtype == np.float32 else 1e-6
        verdict = _judge_batch_norm_train(case, {**right, "running_var": slipped["running_var"]})
        if np.allclose(slipped["running_var"], right["running_var"], rtol=tol, atol=tol):
            assert verdict is None, (slip, verdict)
        elif not np.isfinite(slipped["running_var"]).all():
            assert "Hint" not in verdict, (slip, verdict)
        else:
            assert verdict.startswith("your running_var after each step is"), slip
            assert verdict.endswith(hint), (slip, verdict)


# ---------------------------------------------------------------- the cases cross the wire


@pytest.mark.parametrize("make", [_group_cases, _channel_cases, _fold_cases, _train_cases])
def test_the_cases_survive_the_wire(make):
    """In grading, the cases reach the student's kernel through the wire format,
    which refuses object arrays: every value must be a plain array."""
    cases = make(_rng())
    labels, flat = _wire.flatten_cases(cases)
    sender, receiver = socket.socketpair()
    with sender, receiver:
        _wire.send(sender, {"labels": labels}, flat)
        header, arrays = _wire.receive(receiver)
    back = _wire.unflatten_cases(header["labels"], arrays)
    for (label, case), (_, returned) in zip(cases, back):
        assert sorted(case) == sorted(returned), label
        for key in case:
            np.testing.assert_array_equal(returned[key], case[key])


# ---------------------------------------------------------------- tolerances and eps






def test_the_eval_std_is_judged_against_eps_in_the_root():
    """The truth is sqrt(4 / (3.5 + 1e-5)), within 0.01: just past the edge is wrong."""
    truth = float(np.sqrt(4 / (3.5 + 1e-5)))

    def judge(std):
        return _judge_running_var_answers({}, {"cs231n_var_for_8": np.array("3.5"),
                                               "cs231n_eval_std": np.array(repr(std))})

    assert judge(truth + 0.01 - 1e-6) is None
    assert judge(truth - 0.01 + 1e-6) is None
    assert judge(truth + 0.01 + 1e-6) is not None
    assert judge(truth - 0.01 - 1e-6) is not None


def test_explicit_statistics_take_the_batches_dtype():
    from normref.checks.rows_judges import _bn_case

    x = np.ones((2, 4, 3), np.float32)
    case = _bn_case(x, "pytorch", 0.1, gamma=[2.0] * 3, beta=[1.0] * 3,
                    running_mean=[0.5] * 3, running_var=[2.0] * 3, eps=1e-3)
    for key, value in (("gamma", 2.0), ("beta", 1.0), ("running_mean", 0.5),
                       ("running_var", 2.0)):
        assert case[key].dtype == np.float32, key
        np.testing.assert_array_equal(case[key], [value] * 3)
    assert float(case["eps"]) == 1e-3 and float(case["momentum"]) == 0.1


def test_float32_batch_norm_is_held_to_float32_accuracy():
    """A float32 answer 2e-5 off passes; a slip 2e-5 off is still named."""
    case = _cases(_train_cases)[CS_32]
    right = rows_probes._call_batch_norm_train(bn_train, case)
    near = {k: (v * (1 + 2e-5)).astype(np.float32) for k, v in right.items()}
    assert _judge_batch_norm_train(case, near) is None
    swapped = rows_probes._call_batch_norm_train(lambda *a: bn_train(*a, swap=True), case)
    near = {k: (v * (1 + 2e-5)).astype(np.float32) for k, v in swapped.items()}
    assert _judge_batch_norm_train(case, near).endswith("CS231n's the weight of the OLD one")
    per_token = rows_probes._call_batch_norm_train(lambda *a: bn_train(*a, per_token=True),
                                                   case)
    near = {k: (v * (1 + 2e-5)).astype(np.float32) for k, v in per_token.items()}
    assert _judge_batch_norm_train(case, near).endswith("not per token")


def test_eps_outside_the_root_is_named_with_a_random_affine():
    case = _cases(_train_cases)[PT_L]
    right = rows_probes._call_batch_norm_train(bn_train, case)
    x = case["x"].astype(np.float64)
    g, b = case["gamma"].reshape(1, 1, -1, 1), case["beta"].reshape(1, 1, -1, 1)
    mean, var = x.mean(axis=(1, 3), keepdims=True), x.var(axis=(1, 3), keepdims=True)
    y = g * (x - mean) / (np.sqrt(var) + 1e-5) + b
    assert _judge_batch_norm_train(case, {**right, "y": y}).endswith(
        "eps goes inside the square root: (x - mean) / sqrt(var + eps)")


def test_a_single_step_case_is_diagnosed():
    """One step only: the hints still work on x of shape (1, N, C)."""
    from normref.checks.rows_judges import _bn_case

    x = np.random.default_rng(9).normal(size=(1, 5, 3))
    case = _bn_case(x, "pytorch", 0.1)
    output = rows_probes._call_batch_norm_train(lambda *a: bn_train(*a, per_token=True), case)
    assert _judge_batch_norm_train(case, output).endswith("not per token")
    output = rows_probes._call_batch_norm_train(
        lambda *a: bn_train(*a, normalize_unbiased=True), case)
    assert _judge_batch_norm_train(case, output).endswith("under both conventions")






# ---------------------------------------------------------------- cases as graded, dtypes


def test_the_group_norm_cases_have_the_shapes_they_are_graded_on():
    """The unlabelled shapes too: the 1-group and C-group cases hold several
    examples, so that statistics taken over the batch show there."""
    assert [c["x"].shape for _, c in _group_cases(_rng())] == [
        (2, 6, 4), (3, 4, 5), (2, 4, 3), (3, 4, 5), (2, 8, 3, 3), (4, 8, 16), (2, 4, 3), (2, 6, 2)]


def test_default_and_given_parameters_take_the_batches_dtype():
    """A float32 case gives the student float32 gamma and beta, whether they are
    the defaults or given, in group norm's cases and batch norm's."""
    from normref.checks.rows_judges import _bn_case, _gn_case

    x = np.ones((2, 4, 3), np.float32)
    case = _bn_case(x, "cs231n", 0.9)
    for key, value in (("gamma", 1.0), ("beta", 0.0), ("running_mean", 0.0),
                       ("running_var", 1.0)):
        assert case[key].dtype == np.float32, key
        np.testing.assert_array_equal(case[key], [value] * 3)
    case = _gn_case(np.ones((2, 4, 3), np.float32), 2, gamma=[2.0] * 4, beta=[1.0] * 4)
    for key, value in (("gamma", 2.0), ("beta", 1.0)):
        assert case[key].dtype == np.float32, key
        np.testing.assert_array_equal(case[key], [value] * 4)


F32_GN = "a float32 batch (4, 8, 16) with 2 groups, eps 1e-3"


def test_float32_group_norm_is_held_to_float32_accuracy():
    """A float32 answer 2e-5 off passes the float32 case; a slip 2e-5 off its own
    value is still named there."""
    case = _cases(_group_cases)[F32_GN]
    args = (case["x"], 2, case["gamma"], case["beta"], 1e-3)
    near = (torch_group_norm(*args) * (1 + 2e-5)).astype(np.float32)
    assert _judge_group_norm(case, {"y": near}) is None
    for slip in ("interleave", "over_batch", "eps_outside"):
        y = (slipped_group_norm(*args, **{slip: True}) * (1 + 2e-5)).astype(np.float32)
        assert _judge_group_norm(case, {"y": y}).endswith(f". Hint: {GROUP_SLIPS[slip]}"), slip


def test_the_one_value_case_is_named_as_students_see_it():
    """A student who raises for one token but not for one value per channel of
    x (N, C, L) is told which case, in the label's words."""
    def student(*args):
        x = np.asarray(args[0])
        if x.ndim == 2 and x.shape[0] == 1:
            raise ValueError("one token")
        return bn_train(*args, raise_on_one=False)

    message = fails(check_batch_norm_train, student)
    assert message == ("rows_batch_norm_train_one_example, cs231n: x (1, 3, 1), one value per "
                       "channel (must raise ValueError): one value per channel has no variance to "
                       "measure: raise a ValueError, as torch does (your code returned "
                       "normally)")
