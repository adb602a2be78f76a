"""Unit 02 references against torch, and the unit's checks against typical mistakes."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from normref import batch_norm, group_norm, rms_norm
from normref.checks import (
    CheckFailed,
    _registry,
    _runner,
    check_batch_dependence,
    check_batch_norm_eval,
    check_batch_norm_training,
    check_group_norm,
    check_rms_norm,
    rows_probes,
)

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


def test_syllabus_divisibility_message():
    with pytest.raises(ValueError, match=r"^num_channels \(4\) must be divisible by "
                                         r"num_groups \(3\)$"):
        group_norm(np.zeros((2, 4, 5)), 3)


# ---------------------------------------------------------------- typical mistakes


def make_batch_norm(*, axis=0, running_var_ddof=1, cs231n_momentum=False,
                    eval_uses_batch=False, raise_on_one=True, normalize_ddof=0):
    """A student's batch_norm for x (N, C), with one switch per typical slip."""

    def student_batch_norm(x, gamma, beta, running_mean, running_var, training,
                           momentum=0.1, eps=1e-5):
        if training or eval_uses_batch:
            if training and raise_on_one and x.shape[0] == 1:
                raise ValueError("Expected more than 1 value per channel when training")
            mean = x.mean(axis=axis, keepdims=True)
            var = x.var(axis=axis, ddof=normalize_ddof, keepdims=True)
        else:
            mean, var = running_mean, running_var
        y = gamma * (x - mean) / np.sqrt(var + eps) + beta
        if training:
            keep = momentum if cs231n_momentum else 1 - momentum
            running_mean = keep * running_mean + (1 - keep) * np.squeeze(mean)
            running_var = keep * running_var + (1 - keep) * x.var(axis=axis,
                                                                   ddof=running_var_ddof)
        return y, running_mean, running_var

    return student_batch_norm


def _failure(check, function):
    with pytest.raises(CheckFailed) as failed:
        check(function)
    return str(failed.value)


def test_batch_norm_checks_pass_correct_and_unusual_code():
    correct = make_batch_norm()
    check_batch_norm_training(correct)
    check_batch_norm_eval(correct)

    def einsum_batch_norm(x, gamma, beta, running_mean, running_var, training,
                          momentum=0.1, eps=1e-5):
        x = torch.as_tensor(x, dtype=torch.float64)
        if training:
            n = x.shape[0]
            if n < 2:
                raise ValueError("need two tokens")
            mean = torch.einsum("nc->c", x) / n
            var = torch.einsum("nc,nc->c", x - mean, x - mean) / n
            running_mean = running_mean + momentum * (mean.numpy() - running_mean)
            running_var = running_var + momentum * (var.numpy() * n / (n - 1) - running_var)
        else:
            mean, var = torch.as_tensor(running_mean), torch.as_tensor(running_var)
        y = torch.as_tensor(gamma) * (x - mean) * torch.rsqrt(var + eps) + torch.as_tensor(beta)
        return y, running_mean, running_var

    check_batch_norm_training(einsum_batch_norm)
    check_batch_norm_eval(einsum_batch_norm)


@pytest.mark.parametrize("slip,hint", [
    ({"running_var_ddof": 0}, "unbiased variance of the batch"),
    ({"cs231n_momentum": True}, "CS231n"),
    ({"axis": 1}, "axis 0"),
    ({"normalize_ddof": 1}, "normalize with the biased variance"),
    ({"raise_on_one": False}, "raise a ValueError"),
])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the no-raise slip divides by 0
def test_training_check_names_the_slip_and_eval_still_passes(slip, hint):
    student = make_batch_norm(**slip)
    assert hint in _failure(check_batch_norm_training, student)
    check_batch_norm_eval(student)  # the slip costs the training cell only


def test_eval_check_catches_batch_statistics_in_eval():
    message = _failure(check_batch_norm_eval, make_batch_norm(eval_uses_batch=True))
    assert "running mean and variance, not with the batch's" in message


def test_eval_check_catches_a_changed_running_statistic():
    def updates_in_eval(x, gamma, beta, running_mean, running_var, training, momentum, eps):
        y, _, _ = batch_norm(x, gamma, beta, running_mean, running_var, False, momentum, eps)
        return y, 0.9 * running_mean, running_var

    assert "leaves the running statistics" in _failure(check_batch_norm_eval, updates_in_eval)


def test_rms_norm_check():
    check_rms_norm(lambda x, gamma, eps: x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)
                   * gamma)

    def with_mean(x, gamma, eps):
        centred = x - x.mean(-1, keepdims=True)
        return centred / np.sqrt(np.mean(centred**2, -1, keepdims=True) + eps) * gamma

    assert "does not subtract the mean" in _failure(check_rms_norm, with_mean)

    def eps_outside(x, gamma, eps):
        return x / (np.sqrt(np.mean(x * x, -1, keepdims=True)) + eps) * gamma

    assert "inside the square root" in _failure(check_rms_norm, eps_outside)


def _grouped(x, num_groups, gamma, beta, eps, interleave=False, size_not_count=False,
             over_batch=False, check=True):
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
        blocks.var(axes, keepdims=True) + eps)
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
    }
    for hint, slip in cases.items():
        def student(x, g, gamma, beta, eps, slip=slip):
            return _grouped(x, g, gamma, beta, eps, **slip)

        assert hint in _failure(check_group_norm, student)


# ---------------------------------------------------------------- questions

RIGHT_ANSWERS = {
    "layer_norm": False, "rms_norm": False, "group_norm": False,
    "batch_norm_training": True, "batch_norm_eval": False,
    "groups_for_layer_norm": 1, "groups_for_instance_norm": 6,
}


def test_questions_check():
    check_batch_dependence(**RIGHT_ANSWERS)
    check_batch_dependence(**{**RIGHT_ANSWERS, "groups_for_instance_norm": 6.0})
    with pytest.raises(CheckFailed, match="eval mode"):
        check_batch_dependence(**{**RIGHT_ANSWERS, "batch_norm_eval": True})
    with pytest.raises(CheckFailed, match="no answer"):
        check_batch_dependence(**{k: v for k, v in RIGHT_ANSWERS.items() if k != "rms_norm"})
    with pytest.raises(CheckFailed, match="instance"):
        check_batch_dependence(**{**RIGHT_ANSWERS, "groups_for_instance_norm": 1})


# ---------------------------------------------------------------- any seed

PROBES = {
    "rows_batch_norm_training": (rows_probes._call_batch_norm_training, batch_norm),
    "rows_batch_norm_eval": (rows_probes._call_batch_norm_eval, batch_norm),
    "rows_rms_norm": (rows_probes._call_rms_norm, rms_norm),
    "rows_group_norm": (rows_probes._call_group_norm, group_norm),
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
    correct = make_batch_norm()

    def own_error(x, gamma, beta, running_mean, running_var, training, momentum=0.1,
                  eps=1e-5):
        if training and x.shape[0] == 1:
            raise BatchTooSmall(x.shape[0])
        return correct(x, gamma, beta, running_mean, running_var, training, momentum, eps)

    check_batch_norm_training(own_error)

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
