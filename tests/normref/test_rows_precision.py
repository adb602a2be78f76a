"""Unit 02's precision rule: a function that computes in float32 on float64 input is
judged at float32 precision by its own check, and loses the one half point of
rows_precision_kept, which names it."""

import numpy as np
import pytest
import torch
from check_calls import fails, passes

from normref import batchnorm
from normref.checks import (
    check_batch_norm_eval,
    check_batch_norm_train_cs231n,
    check_batch_norm_train_one_example,
    check_batch_norm_train_pytorch,
    check_channel_layer_norm,
    check_fold_batch_norm,
    check_group_norm,
    check_precision_kept,
    check_spatial_batch_norm,
)
from normref.rmsnorm import rms_norm


def _in_float32(function):
    """The function computed in float32, as torch.as_tensor(x).float() would."""
    def wrapped(*args, **kwargs):
        cast = [np.asarray(a, np.float32) if isinstance(a, np.ndarray) else a for a in args]
        out = function(*cast, **kwargs)
        if isinstance(out, tuple):
            return tuple(torch.from_numpy(np.asarray(o, np.float32)) for o in out)
        return torch.from_numpy(np.asarray(out, np.float32))
    return wrapped


RIGHT = {
    "group_norm": batchnorm.group_norm,
    "channel_layer_norm": batchnorm.channel_layer_norm,
    "batch_norm_train": batchnorm.batch_norm_train,
    "spatial_batch_norm_forward": batchnorm.spatial_batch_norm_forward,
    "batch_norm_eval": batchnorm.batch_norm_eval,
    "fold_batch_norm": batchnorm.fold_batch_norm,
    "rms_norm": rms_norm,
}
OWN_CHECK = {
    "group_norm": check_group_norm,
    "batch_norm_train": lambda f: [check(f) for check in (  # Exercise 3's three cells
        check_batch_norm_train_pytorch, check_batch_norm_train_cs231n,
        check_batch_norm_train_one_example)],
    "spatial_batch_norm_forward": check_spatial_batch_norm,
    "batch_norm_eval": check_batch_norm_eval,
    "fold_batch_norm": check_fold_batch_norm,
}  # rms_norm: casting x to float32 first changes what eps=None means, a real slip


def test_the_reference_functions_keep_float64():
    assert "passed" in passes(lambda f: check_precision_kept(**f), RIGHT)


@pytest.mark.parametrize("name", sorted(OWN_CHECK))
def test_a_float32_function_keeps_its_own_points_and_loses_the_precision_one(name):
    in_float32 = _in_float32(RIGHT[name])
    assert "passed" in passes(OWN_CHECK[name], in_float32)
    message = fails(lambda f: check_precision_kept(**f), {**RIGHT, name: in_float32})
    assert f"your {name} returned float32 for float64 input" in message, message


group_norm = batchnorm.group_norm  # what the check swaps for its exact one


def channel_layer_norm_float32(x, eps=1e-5):
    x = np.moveaxis(np.asarray(x, np.float32), 1, -1)
    y = group_norm(x.reshape(-1, x.shape[-1], 1), 1, None, None, eps)
    return np.moveaxis(np.asarray(y).reshape(x.shape), -1, 1)


def test_float32_channel_layer_norm_is_judged_at_float32():
    assert "passed" in passes(check_channel_layer_norm, channel_layer_norm_float32)


def test_a_wrong_float32_group_norm_still_fails():
    def biased_wrong(x, num_groups, gamma, beta, eps=1e-5):  # eps outside the root
        x = np.asarray(x, np.float32)
        n = x.shape[0]
        g = x.reshape(n, num_groups, -1)
        y = ((g - g.mean(-1, keepdims=True)) / (g.std(-1, keepdims=True) + eps))
        shape = (1, -1) + (1,) * (x.ndim - 2)
        y = y.reshape(x.shape) * np.reshape(gamma, shape) + np.reshape(beta, shape)
        return y.astype(np.float32)  # judged at float32 precision, and still wrong

    message = fails(check_group_norm, biased_wrong)
    assert "eps goes inside" in message, message


def test_rms_norm_computed_in_float32_after_reading_eps_keeps_its_points():
    def rms_norm_float32(x, gamma, eps=None):
        if eps is None:  # torch's: float32's epsilon for half-precision input
            eps = np.finfo(np.promote_types(np.asarray(x).dtype, np.float32)).eps
        x32 = torch.as_tensor(x).float()
        y = x32 / torch.sqrt((x32**2).mean(-1, keepdim=True) + eps)
        return y * torch.as_tensor(gamma).float()

    from normref.checks import check_rms_norm
    assert "passed" in passes(check_rms_norm, rms_norm_float32)
    message = fails(lambda f: check_precision_kept(**f), {**RIGHT, "rms_norm": rms_norm_float32})
    assert "your rms_norm returned float32" in message


def _eval_eps_outside(x, gamma, beta, running_mean, running_var, eps=1e-5):
    shape = (1, -1) + (1,) * (np.ndim(x) - 2)
    def line(v):
        return np.reshape(np.asarray(v, np.float32), shape)
    x = np.asarray(x, np.float32)
    y = (x - line(running_mean)) / (np.sqrt(line(running_var)) + eps)
    return (y * line(gamma) + line(beta)).astype(np.float32)


def _spatial_eps_outside(x, gamma, beta, eps=1e-5):
    x = np.asarray(x, np.float32)
    mean, std = x.mean((0, 2, 3), keepdims=True), x.std((0, 2, 3), keepdims=True)
    y = (x - mean) / (std + eps)
    return (y * np.reshape(gamma, (1, -1, 1, 1)) + np.reshape(beta, (1, -1, 1, 1))
            ).astype(np.float32)


def _fold_eps_outside(weight, bias, gamma, beta, running_mean, running_var, eps=1e-5):
    scale = np.asarray(gamma) / (np.sqrt(running_var) + eps)
    return ((weight * scale[:, None]).astype(np.float32),
            ((bias - running_mean) * scale + beta).astype(np.float32))


@pytest.mark.parametrize("check, slip", [(check_batch_norm_eval, _eval_eps_outside),
                                         (check_spatial_batch_norm, _spatial_eps_outside),
                                         (check_fold_batch_norm, _fold_eps_outside)])
def test_an_eps_slip_in_float32_is_still_caught(check, slip):
    """Judged at float32 precision, eps added outside the root still fails: each
    check holds a case with a large eps, where the slip is far above float32's
    tolerance."""
    fails(check, slip)
