"""Unit 02, eval mode, RMSNorm, the batch question and a batch of two: the
references against torch, and their checks against right code written other
ways and the slips."""

import json
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from check_calls import fails, passes

from normref.batchnorm import batch_norm_eval
from normref.checks import (
    _registry,
    check_batch_norm_eval,
    check_pair_information_answers,
    check_pair_output_answer,
    check_rms_norm,
    check_rms_offset_answer,
    check_sign_only_gap_answer,
    rows_judges,
)
from normref.checks.rows_judges import (
    pair_output,
    rms_offset_for_spread,
    rms_offset_std,
    sign_only_gap,
)
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


def test_the_offset_answer_halves_the_spread_of_a_long_token():
    """A token of a million features with std 2 at the answer's mean, normalized by
    torch: its output's std is 0.5."""
    features = np.random.default_rng(3).normal(0.0, 1.0, size=10**6)
    features = (features - features.mean()) / features.std() * 2.0
    token = torch.from_numpy(features + rms_offset_for_spread())
    y = F.rms_norm(token, token.shape, eps=1e-5)
    assert abs(float(y.std(unbiased=False)) - 0.5) < 1e-9
    assert rms_offset_std(rms_offset_for_spread()) == pytest.approx(0.5)


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

    assert "all 6 cases passed" in passes(check_rms_norm, rms_norm)
    assert "all 6 cases passed" in passes(check_rms_norm, in_torch)


@pytest.mark.parametrize("answer", [rms_offset_for_spread(), 3.464, np.float32(3.4641),
                                    torch.tensor(12.0).sqrt(), "3.4641"])
def test_the_offset_answer_passes_in_any_numeric_type(answer):
    assert "passed" in passes(
        lambda a: check_rms_offset_answer(rms_offset_for_half_spread=a), answer)


RIGHT_POSITIONS = ["group_norm", "batch_norm_train", "spatial_batch_norm_forward"]
SOURCE = (Path(__file__).resolve().parents[2] / "source" / "02_rows_versus_columns"
          / "02_rows_versus_columns.ipynb")


def _exercise_9_answer():
    """The functions the folded answer of Exercise 9 names before its "Not"."""
    cells = json.loads(SOURCE.read_text())["cells"]
    (cell,) = [c for c in cells if c.get("metadata", {}).get("nbgrader", {}).get(
        "grade_id") == "batch_dependence_question"]
    answer = "".join(cell["source"]).split("<summary>Answer")[1].split("Not ")[0]
    return set(re.findall(r"`(\w+)`", answer)) - {"N", "C", "L"}


def test_the_positions_answer_is_what_the_reference_functions_do():
    """Nudge x[0, 0, 0] (example 0, channel 0, position 0) and see which reference
    functions move the output at another position of example 0."""
    from normref import batchnorm

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 4, 5))
    nudged = x.copy()
    nudged[0, 0, 0] += 1.0
    c, ones, zeros = 4, np.ones(4), np.zeros(4)
    calls = {
        "group_norm": lambda v: batchnorm.group_norm(v, 2, ones, zeros),
        "channel_layer_norm": lambda v: batchnorm.channel_layer_norm(v),
        "batch_norm_train": lambda v: batchnorm.batch_norm_train(
            v, ones, zeros, zeros, ones, 0.1)[0],
        "spatial_batch_norm_forward": lambda v: batchnorm.spatial_batch_norm_forward(
            v[..., None], ones, zeros)[..., 0],
        "batch_norm_eval": lambda v: batchnorm.batch_norm_eval(v, ones, zeros, zeros, ones),
        # rms_norm over the last axis: positions are the axes before it, (N, L, C)
        "rms_norm": lambda v: np.moveaxis(rms_norm(np.moveaxis(v, 1, -1), ones), -1, 1),
    }
    moved = {name for name, call in calls.items()
             if not np.allclose(call(x)[0, :, 1:], call(nudged)[0, :, 1:], rtol=0, atol=1e-12)}
    assert c == 4 and moved == set(RIGHT_POSITIONS) == _exercise_9_answer()


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
    # float32's epsilon for every dtype: right for float32 input, 1.9e-9 too large for
    # float64's small values
    "float32_eps": (lambda x, g, eps: rms_norm(
        x, g, float(np.finfo(np.float32).eps) if eps is None else eps),
        "float64's for float64 input, not float32's"),
    # the epsilon of x's own dtype for every dtype: right but for float16 input
    "float16_eps": (lambda x, g, eps: rms_norm(
        x, g, float(np.finfo(x.dtype).eps) if eps is None else eps),
        "torch computes half-precision input in float32"),
    "centred": (lambda x, g, eps: rms_norm(x - x.mean(-1, keepdims=True), g, eps),
                "does not subtract the mean"),
    # float64's epsilon, or none, for float16 input: right for float32 and float64
    "float64_eps_for_half": (lambda x, g, eps: rms_norm(
        x, g, float(np.finfo(np.float64).eps) if eps is None and x.dtype == np.float16
        else eps), "not float64's and not 0"),
    "no_eps_for_half": (lambda x, g, eps: rms_norm(
        x, g, 0.0 if eps is None and x.dtype == np.float16 else eps),
        "not float64's and not 0"),
}


@pytest.mark.parametrize("slip", sorted(RMS_SLIPS))
def test_each_rms_slip_is_named(slip):
    function, hint = RMS_SLIPS[slip]
    message = fails(check_rms_norm, function)
    assert "Hint: " in message and hint in message, message


def _half_in_half(x, gamma, eps):
    """RMSNorm computed in float16 throughout, as torch tensors of float16 are, with
    torch's eps for them (float32's): the squares of tiny values underflow there."""
    x = torch.as_tensor(x)
    eps = torch.finfo(torch.float32).eps if eps is None else eps
    if x.dtype != torch.float16:
        return rms_norm(x.numpy(), gamma, eps)
    rms = x.pow(2).mean(dim=-1, keepdim=True).add(eps).sqrt()
    return x / rms * torch.as_tensor(gamma, dtype=x.dtype)


@pytest.mark.parametrize("seed", range(40))
def test_the_float16_case_tells_torchs_eps_from_the_others_for_any_seed(seed):
    """The float16 case's values are tiny, so float16's, float64's and no eps each
    fail it with their own hint, for the seed of any grading run, while float16
    arithmetic with torch's eps passes (its squares underflow, but eps outweighs
    them)."""
    cases = _registry.make_cases("rows_rms_norm", seed)
    label, case = cases[-1]
    assert "float16" in label and "eps" not in case
    for eps, hint in ((np.finfo(np.float16).eps, "yours is far larger"),
                      (np.finfo(np.float64).eps, "not float64's and not 0"),
                      (0.0, "not float64's and not 0")):
        y = rms_norm(case["x"], case["gamma"], float(eps)).astype(np.float64)
        problem = rows_judges._judge_rms_norm(case, {"y": y})
        assert problem and hint in problem, problem
    y = _half_in_half(case["x"], case["gamma"], None).double().numpy()
    assert rows_judges._judge_rms_norm(case, {"y": y}) is None


@pytest.mark.parametrize("answer, hint", [(np.sqrt(3), "standard deviation 1"),
                                          (2.0, "variance, not its standard deviation"),
                                          (4.0, "not the mean alone"),
                                          (1.0, "counts their mean")])
def test_each_offset_slip_is_named(answer, hint):
    assert hint in fails(lambda a: check_rms_offset_answer(rms_offset_for_half_spread=a),
                         answer)


# ---------------------------------------------------------------- a batch of two


def _torch_pair_output(low, high, eps=1e-5):
    """torch's training-mode batch norm of one channel holding low and high: the
    output for high."""
    pair = torch.tensor([[low], [high]], dtype=torch.float64)
    return F.batch_norm(pair, None, None, training=True, eps=eps)[1, 0].item()


def test_the_close_pair_answer_is_torchs_output():
    assert pair_output(0.005) == pytest.approx(_torch_pair_output(3.0, 3.005), rel=1e-9)
    assert pair_output(5.0) == pytest.approx(_torch_pair_output(-2.0, 3.0), rel=1e-9)


def test_the_sign_only_gap_is_where_torchs_output_reaches_099():
    """Bisect on torch's own output: the gap at which the larger value's output
    crosses 0.99."""
    low, high = 1e-4, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if _torch_pair_output(0.0, middle) < 0.99 else (low, middle)
    assert sign_only_gap() == pytest.approx(high, rel=1e-6)


def test_group_norm_with_groups_of_two_keeps_one_bit_a_group_with_eps_0():
    """GroupNorm(32, 64) with eps = 0 on examples of 64 different features: count
    the patterns each group's two outputs take over many examples: two, one bit a
    group, and the 32 groups are normalized apart: 32 bits an example."""
    rng = np.random.default_rng(0)
    examples = rng.normal(size=(2000, 64)) * 5.0
    groups = examples.reshape(2000, 32, 2)
    outputs = (groups - groups.mean(-1, keepdims=True)) / np.sqrt(groups.var(-1, keepdims=True))
    patterns = {tuple(np.round(pair, 9)) for pair in outputs.reshape(-1, 2)}
    assert patterns == {(1.0, -1.0), (-1.0, 1.0)}
    # every group's sign is free: the 32 of them show up in all combinations
    signs = outputs[..., 0] > 0
    assert len({tuple(row) for row in signs}) == 2000
    torch_out = F.group_norm(torch.from_numpy(examples[:, :, None]), 32, eps=0.0)
    assert np.allclose(torch_out.numpy()[:, :, 0], outputs.reshape(2000, 64))
    check_pair_information_answers(bits_per_example=32 * np.log2(len(patterns)))


def test_with_eps_the_gap_can_be_read_back_from_the_output():
    """With eps = 1e-5 the output grows strictly with the gap, so it is not sign
    only: that is why the question on bits sets eps to 0."""
    gaps = np.array([0.05, 0.5, 5.0, 50.0])
    outputs = np.array([_torch_pair_output(0.0, gap) for gap in gaps])
    assert np.all(np.diff(outputs) > 0)
    half = outputs * np.sqrt(1e-5 / (1 - outputs**2))  # pair_output solved for gap / 2
    assert np.allclose(2 * half, gaps, rtol=1e-6)


@pytest.mark.parametrize("answer", [pair_output(0.005), 0.62, np.float32(0.6202),
                                    torch.tensor(0.6202), "0.6202"])
def test_the_close_pair_answer_passes_in_any_numeric_type(answer):
    assert "passed" in passes(lambda a: check_pair_output_answer(pair_output_close=a), answer)


@pytest.mark.parametrize("gap", [sign_only_gap(), 0.0444, torch.tensor(0.04439),
                                 np.float32(0.045)])
def test_the_sign_only_gap_passes_in_any_numeric_type(gap):
    assert "passed" in passes(lambda a: check_sign_only_gap_answer(sign_only_gap=a), gap)


@pytest.mark.parametrize("bits", [32, 32.0, np.int64(32), torch.tensor(32), "32",
                                  np.float32(32), Fraction(64, 2)])
def test_the_bits_answer_passes_in_any_numeric_type(bits):
    assert "passed" in passes(lambda a: check_pair_information_answers(bits_per_example=a),
                              bits)


@pytest.mark.parametrize("answer, hint", [(1.0, "eps, added to the variance, counts"),
                                          (0.5270, "unbiased variance (dividing by n - 1"),
                                          (1 / np.sqrt(2), "leaves out eps"),
                                          (0.996, "adds eps to the standard deviation"),
                                          (-0.6202, "its output is positive"),
                                          (0.3, "how many standard deviations")])
def test_each_close_pair_slip_is_named(answer, hint):
    assert hint in fails(lambda a: check_pair_output_answer(pair_output_close=a), answer)


@pytest.mark.parametrize("gap, hint", [
    (sign_only_gap() / 2, "each value's distance from the mean"),
    (0.00198, "adds eps to the standard deviation"),
    (0.1, "reach 0.99"),
])
def test_each_sign_only_gap_slip_is_named(gap, hint):
    message = fails(lambda a: check_sign_only_gap_answer(sign_only_gap=a), gap)
    assert hint in message, message
    assert str(round(sign_only_gap(), 4)) not in message  # the answer stays unsaid


@pytest.mark.parametrize("bits, hint", [(1, "one group's share"),
                                        (64, "one is minus the other"),
                                        (2, "32 groups of 2"),
                                        (0, "which of each group's two values"),
                                        (16, "base-2 logarithm")])
def test_each_bits_slip_is_named(bits, hint):
    message = fails(lambda a: check_pair_information_answers(bits_per_example=a), bits)
    assert hint in message, message


def test_a_number_answer_that_carries_grad_fn_is_read():
    """torch.tensor(12., requires_grad=True).sqrt() prints with grad_fn=...: the
    probe detaches it, so the number alone is judged."""
    answer = torch.tensor(12.0, requires_grad=True).sqrt()
    assert "grad_fn" in str(answer)
    assert "passed" in passes(lambda a: check_pair_output_answer(pair_output_close=a),
                              torch.tensor(pair_output(0.005), requires_grad=True) * 1)
