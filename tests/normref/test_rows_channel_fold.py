"""Unit 02, layer norm over channels written with group norm, and batch norm folded
into the Linear layer before it: the references against torch, and their checks
against right code written other ways and against the typical slips."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from check_calls import fails, passes

from normref.batchnorm import (
    channel_layer_norm,
    fold_batch_norm,
    fold_conv_batch_norm,
    group_norm,
)
from normref.checks import (
    check_channel_layer_norm,
    check_fold_batch_norm,
    check_fold_conv_batch_norm,
)
from normref.checks.rows_judges import _judge_channel_layer_norm
from normref.checks.rows_probes import GROUP_NORM_MARK

TOL = {np.float64: 1e-10, np.float32: 1e-4}


# ---------------------------------------------------------------- references vs torch


@pytest.mark.parametrize("shape", [(2, 4, 4), (3, 6, 5), (2, 3, 4, 5), (1, 8, 1)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_channel_layer_norm_is_torchs_layer_norm_over_the_channel_axis(shape, dtype):
    x = np.random.default_rng(0).normal(2.0, 3.0, size=shape).astype(dtype)
    t = torch.from_numpy(x.astype(np.float64))
    expected = F.layer_norm(t.movedim(1, -1), (shape[1],), eps=1e-3).movedim(-1, 1)
    y = channel_layer_norm(x, 1e-3)
    assert y.dtype == dtype
    np.testing.assert_allclose(y, expected.numpy(), rtol=TOL[dtype], atol=TOL[dtype])


def _layer_then_norm(layer, norm, dtype):
    """The torch pair with batch norm's statistics and affine far from 0 and 1, in
    eval mode, and its six parameters as numpy arrays of dtype."""
    norm.eval()
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.5)
        norm.bias.normal_()
        norm.running_mean.normal_()
        norm.running_var.uniform_(0.01, 4.0)
    return [p.detach().numpy().astype(dtype) for p in (
        layer.weight, layer.bias, norm.weight, norm.bias, norm.running_mean, norm.running_var)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_folded_linear_is_linear_then_batch_norm_in_eval_mode(seed, dtype):
    rng = np.random.default_rng(seed)
    inputs, channels = (int(n) for n in rng.integers(2, 9, size=2))
    eps = [1e-5, 1e-3][seed % 2]
    linear = torch.nn.Linear(inputs, channels, dtype=torch.float64)
    norm = torch.nn.BatchNorm1d(channels, eps=eps, dtype=torch.float64)
    weight, bias = fold_batch_norm(*_layer_then_norm(linear, norm, dtype), eps)
    assert weight.dtype == bias.dtype == dtype
    x = torch.from_numpy(rng.normal(size=(16, inputs)))
    expected = norm(linear(x)).detach().numpy()
    folded = x.numpy() @ weight.astype(np.float64).T + bias.astype(np.float64)
    np.testing.assert_allclose(folded, expected, rtol=10 * TOL[dtype], atol=10 * TOL[dtype])


# ---------------------------------------------------------------- layer norm over channels


def through_group_norm(x, eps):
    channels_last = np.moveaxis(x, 1, -1)
    c = x.shape[1]
    y = group_norm(channels_last.reshape(-1, c, 1), 1, np.ones(c), np.zeros(c), eps)
    return np.moveaxis(y.reshape(channels_last.shape), -1, 1)


def through_group_norm_in_torch(x, eps):
    """Right too: torch tensors, a transpose and flatten instead of moveaxis."""
    t = torch.as_tensor(x).transpose(1, -1)
    shape = t.shape
    y = group_norm(t.reshape(-1, shape[-1], 1), 1, eps=eps)
    return y.reshape(shape).transpose(1, -1)


def whole_example(x, eps):
    return group_norm(x, 1, np.ones(x.shape[1]), np.zeros(x.shape[1]), eps)


def reshaped_in_place(x, eps):
    c = x.shape[1]
    return np.reshape(group_norm(x.reshape(-1, c, 1), 1, eps=eps), x.shape)


def by_hand(x, eps):
    x = np.asarray(x, dtype=float)
    return (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + eps)


def by_hand_with_a_decoy_call(x, eps):
    """Wrong: layer norm by hand, with a call of group_norm whose output is thrown
    away; the grader's group_norm marks its output, and this one lacks the mark."""
    group_norm(np.zeros((1, 1, 2)), 1, np.ones(1), np.zeros(1))
    return by_hand(x, eps)


def eps_dropped(x, eps):
    """Wrong: eps is not handed on, so group_norm's default 1e-5 is used."""
    channels_last = np.moveaxis(np.asarray(x), 1, -1)
    c = channels_last.shape[-1]
    y = group_norm(channels_last.reshape(-1, c, 1), 1, np.ones(c), np.zeros(c))
    return np.moveaxis(y.reshape(channels_last.shape), -1, 1)


def one_call_per_position(x, eps):
    """Right values, but one group_norm call for every position of every example
    where the exercise asks for a single call."""
    x = np.asarray(x, dtype=float)
    out, c = np.empty_like(x), x.shape[1]
    for index in np.ndindex(x.shape[:1] + x.shape[2:]):
        where = (index[0], slice(None)) + index[1:]
        out[where] = group_norm(x[where].reshape(1, c, 1), 1, np.ones(c),
                                np.zeros(c), eps)[0, :, 0]
    return out


@pytest.mark.parametrize("right", [through_group_norm, through_group_norm_in_torch])
def test_channel_layer_norm_written_with_group_norm_passes(right):
    assert "all 4 cases passed" in passes(check_channel_layer_norm, right)


@pytest.mark.parametrize("slip, hint", [
    (whole_example, "normalizes everything one example holds"),
    (reshaped_in_place, "move the channel axis last first"),
    (by_hand, "not through group_norm"),
    (by_hand_with_a_decoy_call, "not through group_norm"),
    (eps_dropped, "hand eps on to group_norm"),
    (one_call_per_position, "called group_norm 12 times for one input"),
])
def test_each_channel_layer_norm_slip_is_named(slip, hint):
    assert hint in fails(check_channel_layer_norm, slip)


def test_the_feedback_quotes_torchs_layer_norm_not_the_graders_marked_values():
    """The grader's group_norm marks its output by 1 + GROUP_NORM_MARK; the expected
    values the feedback quotes are F.layer_norm's own, with no mark in them."""
    x = (np.random.default_rng(0).normal(size=(2, 8, 16))
         + np.arange(8.0)[None, :, None]).astype(np.float32)
    marked = eps_dropped(x, 1e-3) * (1 + GROUP_NORM_MARK)  # what the probe sends back
    message = _judge_channel_layer_norm({"x": x, "eps": np.array(1e-3)},
                                        {"y": marked, "group_norm_calls": np.array(1)})
    quoted = float(message.split("expected [")[1].split(",")[0])
    torchs = F.layer_norm(torch.as_tensor(x).transpose(1, -1), (8,), eps=1e-3)
    assert quoted == pytest.approx(float(torchs[0, 0, 0]), abs=1e-4)
    assert "hand eps on to group_norm" in message


def test_a_wrong_group_norm_of_the_students_own_costs_nothing_here():
    """The probe swaps the notebook's group_norm for an exact one: two cancelling
    bugs (num_groups as channels per group, the group count swapped) cannot pass,
    and one bug in group_norm is not charged twice."""
    namespace = {"np": np}
    exec("def group_norm(x, num_groups, gamma=None, beta=None, eps=1e-5):\n"
         "    return x * 0\n", namespace)
    namespace["channel_layer_norm"] = through_group_norm.__class__(
        through_group_norm.__code__, namespace)
    assert "all 4 cases passed" in passes(check_channel_layer_norm,
                                          namespace["channel_layer_norm"])
    assert namespace["group_norm"].__code__.co_name == "group_norm"
    assert namespace["group_norm"](np.ones(2), 1).sum() == 0  # put back afterwards


# ---------------------------------------------------------------- folding batch norm


def fold_in_torch(weight, bias, gamma, beta, running_mean, running_var, eps):
    """Right too: torch tensors back, and the scale as a diagonal matrix."""
    t = [torch.as_tensor(v) for v in (weight, bias, gamma, beta, running_mean, running_var)]
    scale = t[2] * torch.rsqrt(t[5] + eps)
    return torch.diag(scale) @ t[0], (t[1] - t[4]) * scale + t[3]


def bias_unscaled(weight, bias, gamma, beta, running_mean, running_var, eps):
    scale = gamma / np.sqrt(running_var + eps)
    return weight * scale[:, None], bias - running_mean + beta


def columns_scaled(weight, bias, gamma, beta, running_mean, running_var, eps):
    scale = gamma / np.sqrt(running_var + eps)
    return weight * scale, (bias - running_mean) * scale + beta


def eps_forgotten(weight, bias, gamma, beta, running_mean, running_var, eps):
    return fold_batch_norm(weight, bias, gamma, beta, running_mean, running_var, 0.0)


def one_array(weight, bias, gamma, beta, running_mean, running_var, eps):
    return np.hstack(fold_batch_norm(weight, bias, gamma, beta, running_mean,
                                     running_var, eps)[0])


@pytest.mark.parametrize("right", [fold_batch_norm, fold_in_torch])
def test_a_right_fold_passes(right):
    assert "all 5 cases passed" in passes(check_fold_batch_norm, right)


@pytest.mark.parametrize("slip, hint", [
    (bias_unscaled, "scale the bias part too"),
    (columns_scaled, "scale each ROW"),
    (eps_forgotten, "eps belongs inside the square root"),
])
def test_each_fold_slip_is_named(slip, hint):
    assert hint in fails(check_fold_batch_norm, slip)


def test_a_fold_that_returns_no_pair_is_told_what_to_return():
    assert "a pair" in fails(check_fold_batch_norm, one_array)


# ---------------------------------------------------------------- folding into a Conv2d


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_folded_conv_is_conv_then_batch_norm_2d_in_eval_mode(seed, dtype):
    rng = np.random.default_rng(seed)
    c_in, c_out = (int(n) for n in rng.integers(1, 6, size=2))
    kernel, eps = [1, 3][seed % 2], [1e-5, 1e-3][seed // 2]
    conv = torch.nn.Conv2d(c_in, c_out, kernel, dtype=torch.float64)
    norm = torch.nn.BatchNorm2d(c_out, eps=eps, dtype=torch.float64)
    params = _layer_then_norm(conv, norm, dtype)
    weight, bias = fold_conv_batch_norm(*params, eps)
    assert weight.shape == params[0].shape and weight.dtype == bias.dtype == dtype
    x = torch.from_numpy(rng.normal(size=(3, c_in, 6, 6)))
    expected = norm(conv(x)).detach().numpy()
    folded = F.conv2d(x, torch.from_numpy(weight.astype(np.float64)),
                      torch.from_numpy(bias.astype(np.float64))).numpy()
    np.testing.assert_allclose(folded, expected, rtol=10 * TOL[dtype], atol=10 * TOL[dtype])


def conv_fold_in_torch(weight, bias, gamma, beta, running_mean, running_var, eps):
    """Right too: torch tensors back, the scale applied by einsum."""
    t = [torch.as_tensor(v) for v in (weight, bias, gamma, beta, running_mean, running_var)]
    scale = t[2] * torch.rsqrt(t[5] + eps)
    return torch.einsum("o,oikl->oikl", scale, t[0]), (t[1] - t[4]) * scale + t[3]


def conv_fold_by_torch(weight, bias, gamma, beta, running_mean, running_var, eps):
    """PyTorch's own fold: right values, but the exercise is to write the fold."""
    from torch.nn.utils.fusion import fuse_conv_bn_weights
    t = [torch.as_tensor(v) for v in (weight, bias, running_mean, running_var, gamma, beta)]
    folded_weight, folded_bias = fuse_conv_bn_weights(*t[:4], eps, *t[4:])
    return folded_weight.detach(), folded_bias.detach()


def linear_fold_by_torch(weight, bias, gamma, beta, running_mean, running_var, eps):
    """PyTorch's own Linear fold, through the module-level helper."""
    from torch.nn.utils import fusion
    t = [torch.as_tensor(v) for v in (weight, bias, running_mean, running_var, gamma, beta)]
    folded_weight, folded_bias = fusion.fuse_linear_bn_weights(*t[:4], eps, *t[4:])
    return folded_weight.detach(), folded_bias.detach()


@pytest.mark.parametrize("check, library_fold", [
    (check_fold_batch_norm, linear_fold_by_torch),
    (check_fold_conv_batch_norm, conv_fold_by_torch),
])
def test_a_fold_made_by_pytorchs_own_fusion_helper_earns_nothing(check, library_fold):
    assert "torch.nn.utils.fusion" in fails(check, library_fold)


def conv_input_axis(weight, bias, gamma, beta, running_mean, running_var, eps):
    scale = gamma / np.sqrt(running_var + eps)
    return weight * scale[None, :, None, None], (bias - running_mean) * scale + beta


def conv_shift_forgotten(weight, bias, gamma, beta, running_mean, running_var, eps):
    scale = gamma / np.sqrt(running_var + eps)
    return weight * scale[:, None, None, None], bias


def conv_mean_forgotten(weight, bias, gamma, beta, running_mean, running_var, eps):
    scale = gamma / np.sqrt(running_var + eps)
    return weight * scale[:, None, None, None], bias * scale + beta


def conv_eps_forgotten(weight, bias, gamma, beta, running_mean, running_var, eps):
    return fold_conv_batch_norm(weight, bias, gamma, beta, running_mean, running_var, 0.0)


@pytest.mark.parametrize("right", [fold_conv_batch_norm, conv_fold_in_torch])
def test_a_right_conv_fold_passes(right):
    assert "all 4 cases passed" in passes(check_fold_conv_batch_norm, right)


@pytest.mark.parametrize("slip, hint", [
    (conv_input_axis, "scale along axis 0"),
    (conv_shift_forgotten, "the bias is folded too"),
    (conv_mean_forgotten, "with running_mean subtracted before the scaling"),
    (conv_eps_forgotten, "eps belongs inside the square root"),
])
def test_each_conv_fold_slip_is_named(slip, hint):
    assert hint in fails(check_fold_conv_batch_norm, slip)


ALIASED = {
    "a default argument": ("def channel_layer_norm(x, eps, _norm=group_norm):\n"
                           "    c = x.shape[1]\n"
                           "    y = _norm(np.moveaxis(x, 1, -1).reshape(-1, c, 1), 1, eps=eps)\n"
                           "    return np.moveaxis(y.reshape(np.moveaxis(x, 1, -1).shape),"
                           " -1, 1)\n"),
    "a module-level alias": ("gn = group_norm\n"
                             "def channel_layer_norm(x, eps):\n"
                             "    c = x.shape[1]\n"
                             "    y = gn(np.moveaxis(x, 1, -1).reshape(-1, c, 1), 1, eps=eps)\n"
                             "    return np.moveaxis(y.reshape(np.moveaxis(x, 1, -1).shape),"
                             " -1, 1)\n"),
    "a closure": ("def make(norm):\n"
                  "    def channel_layer_norm(x, eps):\n"
                  "        c = x.shape[1]\n"
                  "        y = norm(np.moveaxis(x, 1, -1).reshape(-1, c, 1), 1, eps=eps)\n"
                  "        return np.moveaxis(y.reshape(np.moveaxis(x, 1, -1).shape), -1, 1)\n"
                  "    return channel_layer_norm\n"
                  "channel_layer_norm = make(group_norm)\n"),
}


@pytest.mark.parametrize("how", sorted(ALIASED))
def test_the_students_own_group_norm_called_under_another_name_counts(how):
    """A correct channel_layer_norm that holds the student's own group_norm under
    another name still goes through group_norm; the grader finds it there, and puts
    it back afterwards."""
    namespace = {"np": np, "group_norm": group_norm}
    exec(ALIASED[how], namespace)
    function = namespace["channel_layer_norm"]
    assert "all 4 cases passed" in passes(check_channel_layer_norm, function)
    assert namespace["group_norm"] is group_norm
    assert namespace.get("gn", group_norm) is group_norm
    held = list(function.__defaults__ or ()) + [
        cell.cell_contents for cell in function.__closure__ or ()]
    assert all(value is group_norm for value in held)
