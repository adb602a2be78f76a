"""Unit 02 references against torch, and the unit's checks against typical mistakes."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from normref import batch_norm, group_norm, rms_norm
from normref.batchnorm import batch_norm_train, example_layer_norm, instance_norm
from normref.checks import (
    CheckFailed,
    _registry,
    _runner,
    check_batch_norm_train,
    check_group_norm,
    check_group_norm_limits,
    check_nudge_answer,
    check_running_var_answers,
    check_running_var_prediction,
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


def test_divisibility_message_is_torchs_text():
    with pytest.raises(ValueError, match=r"^num_channels \(4\) must be divisible by "
                                         r"num_groups \(3\)$"):
        group_norm(np.zeros((2, 4, 5)), 3)


# ---------------------------------------------------------------- group norm's limits vs torch


@pytest.mark.parametrize("shape", [(3, 6, 5), (2, 4, 3, 3), (1, 8, 16)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_limits_match_torchs_instance_and_layer_norm(shape, dtype):
    x = (np.random.default_rng(0).normal(size=shape)
         + np.arange(shape[1]).reshape((1, -1) + (1,) * (len(shape) - 2))).astype(dtype)
    t = torch.from_numpy(x)
    for eps in (1e-5, 1e-3):
        np.testing.assert_allclose(instance_norm(x, eps), F.instance_norm(t, eps=eps).numpy(),
                                   atol=TOL[dtype], rtol=TOL[dtype])
        np.testing.assert_allclose(example_layer_norm(x, eps),
                                   F.layer_norm(t, shape[1:], eps=eps).numpy(),
                                   atol=TOL[dtype], rtol=TOL[dtype])


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


def test_limits_check():
    def instance(x, eps):
        return _grouped(x, x.shape[1], np.ones(x.shape[1]), np.zeros(x.shape[1]), eps)

    def whole(x, eps):
        return _grouped(x, 1, np.ones(x.shape[1]), np.zeros(x.shape[1]), eps)

    def over_channels(x, eps):
        return (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + eps)

    check_group_norm_limits(instance, whole)
    check_group_norm_limits(lambda x, eps: F.instance_norm(torch.as_tensor(x), eps=eps),
                            example_layer_norm)
    assert "num_groups = C" in _failure(check_group_norm_limits, whole, whole)
    assert "a single group" in _failure(check_group_norm_limits, instance, instance)
    assert "channels and positions" in _failure(check_group_norm_limits, instance,
                                                over_channels)


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


def test_nudge_answer_is_judged_exactly():
    check_nudge_answer(outputs_moved=2048)
    check_nudge_answer(outputs_moved=np.int64(2048))
    for wrong in (4096, 1024, 2 * 64 * 32 * 32, None, "many"):
        with pytest.raises(CheckFailed, match="OUTPUTS_MOVED"):
            check_nudge_answer(outputs_moved=wrong)


def test_a_prediction_counts_when_it_is_a_number_right_or_wrong():
    check_running_var_prediction(pytorch=4.0, cs231n=3.0)
    check_running_var_prediction(pytorch=1, cs231n=100.5)
    for missing in ({"pytorch": None, "cs231n": 3.0}, {"pytorch": 4.0, "cs231n": "three"},
                    {"pytorch": 4.0, "cs231n": float("nan")}, {"pytorch": 4.0}):
        with pytest.raises(CheckFailed, match="prediction"):
            check_running_var_prediction(**missing)


def test_running_var_answers_are_judged_within_their_tolerance():
    eval_std = 2 / np.sqrt(3)  # data std 2 over sqrt(running_var 3)
    check_running_var_answers(cs231n_var_for_8=3.5, cs231n_eval_std=eval_std)
    check_running_var_answers(cs231n_var_for_8=3.45, cs231n_eval_std=np.float32(1.15))
    with pytest.raises(CheckFailed, match="CS231N_RUNNING_VAR_FOR_8"):
        check_running_var_answers(cs231n_var_for_8=4.0, cs231n_eval_std=eval_std)
    for wrong in (1.0, 2 / np.sqrt(3.5), np.sqrt(3) / 2, None):  # train's, n = 8's, upside down
        with pytest.raises(CheckFailed, match="CS231N_EVAL_STD"):
            check_running_var_answers(cs231n_var_for_8=3.5, cs231n_eval_std=wrong)


def test_the_eval_std_question_matches_a_simulation():
    """The truth the eval question is judged by, measured: settle CS231n's running
    statistics on batches of 4, then normalize fresh data with them."""
    rng = np.random.default_rng(0)
    mean, var = np.zeros(256), np.ones(256)
    for _ in range(2000):
        _, mean, var = batch_norm_train(rng.normal(0.0, 2.0, size=(4, 256)), np.ones(256),
                                        np.zeros(256), mean, var, 0.99, "cs231n")
    fresh = rng.normal(0.0, 2.0, size=(4000, 256))
    std = ((fresh - mean) / np.sqrt(var + 1e-5)).std(axis=0).mean()
    assert std == pytest.approx(2 / np.sqrt(3), abs=0.01)
    check_running_var_answers(cs231n_var_for_8=3.5, cs231n_eval_std=float(std))


# ---------------------------------------------------------------- any seed

PROBES = {
    "rows_group_norm": (rows_probes._call_group_norm, group_norm),
    "rows_group_norm_limits": (rows_probes._call_group_norm_limits,
                               (instance_norm, example_layer_norm)),
    "rows_batch_norm_train": (rows_probes._call_batch_norm_train, batch_norm_train),
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
