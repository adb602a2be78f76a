"""Unit 02, eval mode, RMSNorm and the batch question: the references against
torch, and their checks against right code written other ways and the slips."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from check_calls import fails, passes

from normref.batchnorm import batch_norm_eval
from normref.checks import (
    check_batch_dependence_answer,
    check_batch_norm_eval,
    check_rms_norm,
    check_rms_offset_answer,
)
from normref.checks.rows_judges import rms_offset_std
from normref.rmsnorm import rms_norm


def _t(a):
    return torch.from_numpy(np.asarray(a)).double()


# ---------------------------------------------------------------- references vs torch


@pytest.mark.parametrize("shape", [(4, 3), (1, 3), (2, 3, 5), (2, 3, 4, 4)])
def test_batch_norm_eval_matches_torch_in_eval_mode(shape):
    rng = np.random.default_rng(len(shape))
    x = rng.normal(2.0, 3.0, size=shape)
    gamma, beta, mean = rng.normal(size=(3, 3))
    var = rng.uniform(0.5, 4.0, size=3)
    expected = F.batch_norm(_t(x), _t(mean), _t(var), _t(gamma), _t(beta), training=False)
    np.testing.assert_allclose(batch_norm_eval(x, gamma, beta, mean, var), expected.numpy(),
                               atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rms_norm_with_eps_none_matches_torchs_default(dtype):
    x = (np.random.default_rng(1).normal(2.0, 1.0, size=(3, 8)) * 1e-3).astype(dtype)
    gamma = np.random.default_rng(2).normal(size=8).astype(dtype)
    expected = F.rms_norm(torch.from_numpy(x), (8,), torch.from_numpy(gamma)).double()
    np.testing.assert_allclose(rms_norm(x, gamma, None), expected.numpy(), rtol=1e-5)


def test_the_offset_answer_matches_a_long_token():
    """A token of a million features with mean 3 and std 1, normalized by torch."""
    token = torch.from_numpy(np.random.default_rng(3).normal(3.0, 1.0, size=10**6))
    y = F.rms_norm(token, token.shape, eps=1e-5)
    assert abs(float(y.std(unbiased=False)) - rms_offset_std()) < 2e-3


# ---------------------------------------------------------------- right code passes


def torch_eval(x, gamma, beta, running_mean, running_var, eps):
    shape = (1, -1) + (1,) * (np.ndim(x) - 2)
    rm, rv, g, b = (_t(v).reshape(shape) for v in (running_mean, running_var, gamma, beta))
    return (_t(x) - rm) * torch.rsqrt(rv + eps) * g + b


def test_right_eval_code_passes_in_numpy_and_torch():
    assert "all 6 cases passed" in passes(check_batch_norm_eval, batch_norm_eval)
    assert "all 6 cases passed" in passes(check_batch_norm_eval, torch_eval)


def test_right_rms_code_passes_in_numpy_and_torch():
    def in_torch(x, gamma, eps):
        t = torch.from_numpy(x)
        return F.rms_norm(t, t.shape[-1:], torch.from_numpy(gamma), eps)

    assert "all 5 cases passed" in passes(check_rms_norm, rms_norm)
    assert "all 5 cases passed" in passes(check_rms_norm, in_torch)


@pytest.mark.parametrize("answer", [rms_offset_std(), 0.316, np.float32(0.3162),
                                    torch.tensor(10.0).rsqrt(), "0.3162"])
def test_the_offset_answer_passes_in_any_numeric_type(answer):
    assert "passed" in passes(lambda a: check_rms_offset_answer(rms_std_at_offset_3=a), answer)


@pytest.mark.parametrize("names", [["batch_norm_train", "spatial_batch_norm_forward"],
                                   {"BATCH_NORM_TRAIN", " Spatial_Batch_Norm_Forward"},
                                   ("spatial_batch_norm_forward", "batch_norm_train"),
                                   np.array(["batch_norm_train",
                                             "spatial_batch_norm_forward"])])
def test_the_batch_answer_passes_in_any_collection_and_case(names):
    assert "passed" in passes(check_batch_dependence_answer, names)


# ---------------------------------------------------------------- slips are named


def _in_place(x, gamma, beta, running_mean, running_var, eps):
    y = batch_norm_eval(x, gamma, beta, running_mean, running_var, eps)
    running_mean *= 0.9  # as a training step would
    return y


def _batch_stats(x, gamma, beta, running_mean, running_var, eps):
    axes = (0,) + tuple(range(2, x.ndim))
    return batch_norm_eval(x, gamma, beta, x.mean(axis=axes), x.var(axis=axes), eps)


def _no_root(x, gamma, beta, running_mean, running_var, eps):
    return batch_norm_eval(x, gamma, beta, running_mean, (running_var + eps) ** 2 - eps, eps)


def _gamma_last(x, gamma, beta, running_mean, running_var, eps):
    return (x - running_mean) / np.sqrt(running_var + eps) * gamma + beta


EVAL_SLIPS = {
    _in_place: "leaves them as they are",
    _batch_stats: "not with the batch's own statistics",
    _no_root: "divide by sqrt(running_var + eps)",
    _gamma_last: "line up with axis 1",
}


@pytest.mark.parametrize("slip", list(EVAL_SLIPS), ids=lambda f: f.__name__)
def test_each_eval_slip_is_named(slip):
    message = fails(check_batch_norm_eval, slip)
    assert EVAL_SLIPS[slip] in message, message


RMS_SLIPS = {
    "eps_1e-5": (lambda x, g, eps: rms_norm(x, g, 1e-5 if eps is None else eps),
                 "machine epsilon of x's dtype"),
    "float64_eps": (lambda x, g, eps: rms_norm(
        x.astype(np.float64), g, eps), "float32's for float32 input"),
    "centred": (lambda x, g, eps: rms_norm(x - x.mean(-1, keepdims=True), g, eps),
                "does not subtract the mean"),
}


@pytest.mark.parametrize("slip", sorted(RMS_SLIPS))
def test_each_rms_slip_is_named(slip):
    function, hint = RMS_SLIPS[slip]
    message = fails(check_rms_norm, function)
    assert "Hint: " in message and hint in message, message


@pytest.mark.parametrize("answer, hint", [(1.0, "layer norm's answer"),
                                          (1 / 3, "sqrt(3 ** 2 + 1 ** 2)"),
                                          (0.1, "variance of the output"),
                                          (0.5, "counts their mean")])
def test_each_offset_slip_is_named(answer, hint):
    assert hint in fails(lambda a: check_rms_offset_answer(rms_std_at_offset_3=a), answer)


@pytest.mark.parametrize("names, said", [
    (["batch_norm_train"], "spatial_batch_norm_forward is missing"),
    (["batch_norm_train", "spatial_batch_norm_forward", "batch_norm_eval"],
     "batch_norm_eval is listed but does not depend on the batch"),
    (["batch_norm_train", "spatial_batch_norm_forward", "group_norm"],
     "group norm's statistics stay inside one example"),
    (["batch_norm"], "not one of this assignment's functions"),
    (None, "not one of this assignment's functions"),
])
def test_each_batch_answer_slip_is_named(names, said):
    assert said in fails(check_batch_dependence_answer, names)
