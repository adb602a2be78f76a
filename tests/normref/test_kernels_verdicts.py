"""Unit 07's checks (the RMSNorm Triton kernels), pinned down to the verdict and
the sentence a student reads.

Each test fails on a small bug in normref/checks/kernels_judges.py or
normref/checks/kernels_probes.py (a hint given for the wrong mistake, a case
changed, a kernel that leaves Triton let through, a word of the feedback
changed): see `make mutation`. The judges are called on arrays made by hand;
the few kernel launches run tiny shapes in Triton's interpreter, which is
switched on here, before triton is imported (when there is no GPU).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import ast  # noqa: E402
import functools  # noqa: E402
import linecache  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402
import warnings  # noqa: E402
from fractions import Fraction  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from normref.checks import CheckFailed, kernels_judges, kernels_probes  # noqa: E402
from normref.checks.kernels_judges import (  # noqa: E402
    UNWRITTEN,
    _judge_backward_bytes,
    _judge_dx,
    _judge_llama_bytes,
    _judge_partial_dw,
    _judge_y,
    _judge_y_and_rstd,
)
from normref.checks.kernels_probes import KernelRefused  # noqa: E402
from normref.checks.tolerances import mismatch  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRETED, reason="a GPU: kernels are compiled")


class KnownDraws:
    """A stand-in for numpy's Generator: normal() is one standard deviation
    above the mean everywhere, so every case shows what it is built of."""

    def normal(self, loc=0.0, scale=1.0, size=None):
        return loc + scale * np.ones(size)


# ============================================================ the judges

def test_bfloat16_rounding_is_torchs():
    """Round to nearest, ties to even, as torch's cast does."""
    rng = np.random.default_rng(0)
    values = np.concatenate([
        rng.normal(0, 3, 2000), 10.0 ** rng.uniform(-30, 30, 500),
        1 + np.array([1, 2, 3, 5, 6, 7, 0.5, 1.5]) * 2.0 ** -8,  # ties and near-ties
        -(1 + np.array([1, 3, 2.5]) * 2.0 ** -8), [0.0, 1.0, -2.0, 65504.0]]).astype(np.float32)
    expected = torch.from_numpy(values).to(torch.bfloat16).float().numpy()
    got = kernels_judges._bfloat16_values(values)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)


def test_rounded_values_are_what_the_kernel_sees():
    values = np.array([1.0001, 300.3, -0.1, 1 / 3])
    for dtype, torch_dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16),
                               ("float32", torch.float32)):
        got = kernels_judges._rounded(values, dtype)
        assert got.dtype == np.float32, dtype
        np.testing.assert_array_equal(
            got, torch.tensor(values, dtype=torch.float32).to(torch_dtype).float().numpy())


def test_forward_case_holds_rounded_inputs():
    case = kernels_judges._forward_case([[1.0001, 2.0]], dtype="float16", pad=3)
    assert sorted(case) == ["dtype", "eps", "gamma", "pad", "x"]
    np.testing.assert_array_equal(case["x"], np.array([[1.0, 2.0]], np.float32))
    np.testing.assert_array_equal(case["gamma"], np.ones(2, np.float32))
    assert (float(case["eps"]), str(case["dtype"]), int(case["pad"])) == (1e-5, "float16", 3)
    case = kernels_judges._forward_case([[1.0, 2.0]], gamma=[1.0001, 3.0], eps=0.25,
                                        dtype="bfloat16")
    np.testing.assert_array_equal(case["gamma"], np.array([1.0, 3.0], np.float32))
    assert (float(case["eps"]), str(case["dtype"]), int(case["pad"])) == (0.25, "bfloat16", 0)
    assert str(kernels_judges._forward_case([[1.0]])["dtype"]) == "float32"


def test_backward_case_by_hand():
    """x ~ N(offset, 1.5), dy ~ N(0, 1), w ~ N(1, 0.5); rstd from x with eps 1e-5."""
    case = kernels_judges._backward_case(KnownDraws(), 2, 3, 2, pad=1, offset=5.0)
    np.testing.assert_array_equal(case["x"], np.full((2, 3), 6.5, np.float32))
    np.testing.assert_array_equal(case["dy"], np.ones((2, 3)))
    np.testing.assert_array_equal(case["gamma"], np.full(3, 1.5))
    np.testing.assert_allclose(case["rstd"], np.full(2, 1 / np.sqrt(6.5 ** 2 + 1e-5)),
                               rtol=1e-7)
    assert case["rstd"].dtype == np.float32
    assert (int(case["rows_per_program"]), str(case["dtype"]), int(case["pad"])) == (
        2, "float32", 1)
    case = kernels_judges._backward_case(np.random.default_rng(0), 2, 3, 1, dtype="float16")
    assert str(case["dtype"]) == "float16" and int(case["pad"]) == 0
    np.testing.assert_array_equal(case["x"], case["x"].astype(np.float16))
    np.testing.assert_array_equal(case["dy"], case["dy"].astype(np.float16))
    np.testing.assert_array_equal(case["gamma"], case["gamma"].astype(np.float16))
    x = case["x"].astype(np.float64)
    np.testing.assert_allclose(case["rstd"], 1 / np.sqrt((x ** 2).mean(-1) + 1e-5), rtol=1e-7)


def _summary(case):
    x = case["x"]
    return (x.shape, sorted(set(np.unique(x).tolist())),
            sorted(set(np.unique(case["gamma"]).tolist())), float(case["eps"]),
            str(case["dtype"]), int(case["pad"]))


def test_forward_cases_are_what_their_labels_say():
    draws = KnownDraws()
    rows = kernels_judges._rows_cases(draws)
    assert [label for label, _ in rows] == [
        "x = [2, 4, 6, 8] (one row, N = 4)",
        "4 rows of 64 features with a random weight",
        "3 rows of 32 features, the second all zeros (y = 0 there)",
        "2 rows of 16 features with eps = 0.1",
        "6 rows of 256 features, rows 259 elements apart in memory"]
    assert [_summary(c) for _, c in rows] == [
        ((1, 4), [2.0, 4.0, 6.0, 8.0], [1.0], 1e-5, "float32", 0),
        ((4, 64), [3.0], [1.5], 1e-5, "float32", 0),
        ((3, 32), [0.0, 3.0], [1.5], 1e-5, "float32", 0),
        ((2, 16), [pytest.approx(0.3)], [1.0], pytest.approx(0.1), "float32", 0),
        ((6, 256), [2.0], [1.5], 1e-5, "float32", 3)]
    assert not rows[2][1]["x"][1].any() and rows[2][1]["x"][[0, 2]].all()
    ragged = kernels_judges._ragged_cases(draws)
    assert [label for label, _ in ragged] == [
        "3 rows of 100 features (BLOCK_SIZE 128)", "one row of 37 features",
        "5 rows of 3 features", "2 rows of 1000 features (BLOCK_SIZE 1024)"]
    assert [_summary(c) for _, c in ragged] == [
        ((3, 100), [4.0], [1.5], 1e-5, "float32", 5),
        ((1, 37), [-1.5], [1.5], 1e-5, "float32", 0),
        ((5, 3), [2.5], [1.0], 1e-5, "float32", 1),
        ((2, 1000), [2.0], [1.5], 1e-5, "float32", 8)]
    rstd = kernels_judges._rstd_cases(draws)
    assert [label for label, _ in rstd] == [
        "4 rows of 64 features", "2 rows of 16, the first all zeros (rstd = 1/sqrt(eps) there)",
        "3 rows of 32 features with eps = 0.5",
        "3 rows of 128 features, rows 133 elements apart in memory"]
    assert [_summary(c) for _, c in rstd] == [
        ((4, 64), [5.0], [1.0], 1e-5, "float32", 0),
        ((2, 16), [0.0, 1.0], [1.0], 1e-5, "float32", 0),
        ((3, 32), [0.5], [1.0], 0.5, "float32", 2),
        ((3, 128), [2.0], [1.5], 1e-5, "float32", 5)]
    assert not rstd[1][1]["x"][0].any() and rstd[1][1]["x"][1].all()
    half = kernels_judges._half_cases(draws)
    assert [label for label, _ in half] == [
        "float16, 4 rows of 256 features", "bfloat16, 3 rows of 128 features",
        "float16, 2 rows of 256 features near 300 (their squares add up to about 23 000 000, "
        "far past float16's largest number, 65 504)",
        "float16, one row of 64 features, rows 80 elements apart in memory"]
    assert [_summary(c) for _, c in half] == [
        ((4, 256), [3.0], [1.5], 1e-5, "float16", 0),
        ((3, 128), [1.0], [1.5], 1e-5, "bfloat16", 4),
        ((2, 256), [302.0], [1.0], 1e-5, "float16", 0),
        ((1, 64), [1.0], [1.0], 1e-5, "float16", 16)]


def test_backward_cases_are_what_their_labels_say():
    def summary(case):
        return (case["x"].shape, int(case["rows_per_program"]), str(case["dtype"]),
                int(case["pad"]), float(case["x"].flat[0]))

    dx = kernels_judges._dx_cases(KnownDraws())
    assert [label for label, _ in dx] == [
        "5 rows of 100 features, 2 rows a program (the last program gets one)",
        "4 rows of 64 features, all 4 in one program",
        "3 rows of 37 features, one row a program",
        "4 rows of 48 features near 5, 3 rows a program",
        "float16, 4 rows of 96 features, 3 rows a program",
        "bfloat16, 2 rows of 128 features, 2 rows a program",
        "3 rows of 32 features near 0 (mean square about 0.0001), the rstd saved with "
        "eps = 0.1, so eps matters"]
    assert [summary(c) for _, c in dx] == [
        ((5, 100), 2, "float32", 3, 1.5), ((4, 64), 4, "float32", 0, 1.5),
        ((3, 37), 1, "float32", 1, 1.5), ((4, 48), 3, "float32", 0, 6.5),
        ((4, 96), 3, "float16", 0, 1.5), ((2, 128), 2, "bfloat16", 2, 1.5),
        ((3, 32), 2, "float32", 0, np.float32(0.01).item())]
    partial = kernels_judges._partial_cases(KnownDraws())
    assert [label for label, _ in partial] == [
        "7 rows of 48 features, 3 rows a program (3, 3 and 1)",
        "4 rows of 64 features, 2 rows a program",
        "6 rows of 20 features, all in one program",
        "5 rows of 100 features, one row a program",
        "float16, 256 rows of 32 features near 1 with dy near 1, all in one program "
        "(dW's sums reach about 256, where float16's numbers are 0.25 apart)"]
    assert [summary(c) for _, c in partial] == [
        ((7, 48), 3, "float32", 0, 1.5), ((4, 64), 2, "float32", 5, 1.5),
        ((6, 20), 6, "float32", 0, 1.5), ((5, 100), 1, "float32", 2, 1.5),
        ((256, 32), 256, "float16", 0, 1.099609375)]
    assert kernels_judges._no_inputs(None) == [("your answer", {})]


# ------------------------------------------------------------ the forward

def test_forward_reference_by_hand():
    """x = [2, 4, 6, 8]: mean of squares 30, rstd 1 / sqrt(30 + eps), y = x * rstd * w."""
    case = kernels_judges._forward_case([[2.0, 4.0, 6.0, 8.0], [0, 0, 0, 0]],
                                        gamma=[1.0, 2.0, 1.0, 0.5], eps=0.25)
    rstd, y = kernels_judges._forward_reference(case)
    np.testing.assert_allclose(rstd, [1 / np.sqrt(30.25), 2.0], rtol=1e-15)
    np.testing.assert_allclose(y, [[2 / 5.5, 8 / 5.5, 6 / 5.5, 4 / 5.5], [0, 0, 0, 0]],
                               rtol=1e-15)


def _fwd_case(x, **kwargs):
    return kernels_judges._forward_case(np.asarray(x, float), **kwargs)


def _fwd_out(y, rstd, padding=0):
    return {"y": np.asarray(y, np.float64), "rstd": np.asarray(rstd, np.float64),
            "padding_written": np.array(padding)}


def _right_fwd(case):
    rstd, y = kernels_judges._forward_reference(case)
    return _fwd_out(y, rstd)


def test_rstd_mistakes_by_hand():
    """x = [1, 2, 2], eps 0.5: mean of squares 3, N 3, BLOCK_SIZE 4."""
    mistakes = kernels_judges._rstd_mistakes(_fwd_case([[1.0, 2.0, 2.0]], eps=0.5))
    assert [text for text, _ in mistakes] == [
        "the root mean square was saved; rstd is its reciprocal, 1 / sqrt(mean(x**2) + eps)",
        "mean(x**2) was saved; rstd = 1 / sqrt(mean(x**2) + eps)",
        "eps goes inside the square root: 1 / sqrt(mean(x**2) + eps)",
        "eps is missing: rstd = 1 / sqrt(mean(x**2) + eps)",
        "the mean was subtracted: RMSNorm divides x itself by its root mean square, without "
        "centring it",
        "divide by N, the number of real features, not by BLOCK_SIZE (which also counts the "
        "masked lanes)"]
    variance = np.var([1.0, 2.0, 2.0])
    np.testing.assert_allclose([float(v[0]) for _, v in mistakes], [
        np.sqrt(3.5), 3.0, 1 / (np.sqrt(3) + 0.5), 1 / np.sqrt(3), 1 / np.sqrt(variance + 0.5),
        1 / np.sqrt(9 / 4 + 0.5)], rtol=1e-15)
    assert len(kernels_judges._rstd_mistakes(_fwd_case([[1.0, 2.0, 2.0, 0.0]]))) == 5


def test_forward_right_answers_pass():
    case = _fwd_case([[2.0, 4.0, 6.0, 8.0]])
    assert _judge_y(case, _right_fwd(case)) is None
    assert _judge_y_and_rstd(case, _right_fwd(case)) is None
    rstd, y = kernels_judges._forward_reference(case)
    assert _judge_y(case, _fwd_out(y * (1 + 5e-5), rstd * 1.1)) is None, "float32 y; no rstd"
    assert _judge_y_and_rstd(case, _fwd_out(y, rstd * (1 + 5e-5))) is None


def test_forward_y_right_but_padding_written():
    case = _fwd_case([[2.0, 4.0, 6.0, 8.0]])
    output = {**_right_fwd(case), "padding_written": np.array(3)}
    assert _judge_y(case, output) == (
        "y is right, but the kernel also wrote past the end of each row. Hint: the store "
        "wrote 3 numbers into the lanes past N, which belong to someone else: store with "
        "mask=cols < N")


def _y_problem(case, y):
    _, y_ref = kernels_judges._forward_reference(case)
    return mismatch(y, y_ref, dtype=str(case["dtype"]), what="y")


def test_forward_rows_read_without_the_stride_are_named():
    case = _fwd_case([[2.0, 4.0], [1.0, 3.0], [5.0, 5.0]], pad=2)
    rstd, y = kernels_judges._forward_reference(case)
    wrong = y.copy()
    wrong[1:] *= 2
    assert _judge_y(case, _fwd_out(wrong, rstd)) == _y_problem(case, wrong) + (
        ". Hint: the first row is right and later ones are not: row r starts at X + r * "
        "row_stride (here rows are padded in memory), not at X + r * N")
    unpadded = _fwd_case([[2.0, 4.0], [1.0, 3.0], [5.0, 5.0]])
    assert "row_stride" not in _judge_y(unpadded, _fwd_out(wrong, rstd))
    first_wrong = y.copy()
    first_wrong[0] *= 2
    assert "row_stride" not in _judge_y(case, _fwd_out(first_wrong, rstd))
    one_row = _fwd_case([[2.0, 4.0]], pad=2)
    assert "row_stride" not in _judge_y(one_row, _fwd_out(y[:1] * 2, rstd[:1]))


def test_forward_nothing_stored_is_named():
    case = _fwd_case([[2.0, 4.0, 6.0, 8.0]])
    rstd, y = kernels_judges._forward_reference(case)
    unwritten = np.full_like(y, UNWRITTEN)
    assert _judge_y(case, _fwd_out(unwritten, rstd)) == _y_problem(case, unwritten) + (
        ". Hint: nothing was stored in Y: y still holds what was there before")
    assert _judge_y_and_rstd(case, _fwd_out(y, [UNWRITTEN])) == mismatch(
        np.array([UNWRITTEN]), rstd, dtype="float32", what="the saved rstd") + (
        ". Hint: store the row's rstd for the backward pass: tl.store(Rstd + row, rstd)")


def test_forward_nan_from_the_lanes_past_n_is_named():
    case = _fwd_case([[2.0, 4.0, 6.0]])
    rstd, y = kernels_judges._forward_reference(case)
    nan = np.full_like(y, np.nan)
    hint = (". Hint: NaN came out of NaN going in: the lanes past N of this test's memory hold "
            "NaN (real padding holds anything), so some load read past the row. Load every row "
            "(and w) with mask=cols < N and other=0.0")
    assert _judge_y(case, _fwd_out(nan, [np.nan])) == _y_problem(case, nan) + hint
    assert _judge_y_and_rstd(case, _fwd_out(y, [np.nan])) == mismatch(
        np.array([np.nan]), rstd, dtype="float32", what="the saved rstd") + hint
    power_of_two = _fwd_case([[2.0, 4.0, 6.0, 8.0]])
    message = _judge_y(power_of_two, _fwd_out(np.full((1, 4), np.nan), [np.nan]))
    assert "NaN came out of NaN" not in message


def test_forward_float16_overflow_is_named():
    """Squares of 300 add past 65 504: float16 sums give inf, so rstd 0. (This hint
    never showed: rstd is about 1/300, and float16's atol of 5e-3 took 0 for it.)"""
    case = _fwd_case([[300.0] * 4], dtype="float16")
    rstd, y = kernels_judges._forward_reference(case)
    zero = np.zeros_like(y)
    assert _judge_y(case, _fwd_out(zero, [0.0])) == _y_problem(case, zero) + (
        ". Hint: the sum of squares overflowed float16 (largest number 65 504): convert x to "
        "float32 right after loading it, x = tl.load(...).to(tl.float32)")


def test_forward_float16_without_overflow_gets_the_precision_hint():
    case = _fwd_case([[100.0, 50.0, 60.0, 80.0]], dtype="float16")  # squares add to 25 000
    rstd, y = kernels_judges._forward_reference(case)
    off = y * 1.01
    assert _judge_y(case, _fwd_out(off, rstd * 1.01)) == _y_problem(case, off) + (
        ". Hint: rstd carries low-precision rounding: convert x to float32 right after loading "
        "it (.to(tl.float32)) and keep the sum and rstd in float32")
    case = _fwd_case([[300.0] * 4], dtype="float16")
    rstd, y = kernels_judges._forward_reference(case)
    message = _judge_y(case, _fwd_out(y * 1.02, rstd * (1 + 4e-3)))
    assert "overflowed" not in message and "low-precision rounding" in message
    bf16 = _fwd_case([[1.0, 2.0]], dtype="bfloat16")
    rstd, y = kernels_judges._forward_reference(bf16)
    assert _judge_y(bf16, _fwd_out(y * 1.05, rstd * 1.05)).endswith(
        "and keep the sum and rstd in float32")


def test_forward_right_rstd_wrong_y_is_the_last_step():
    case = _fwd_case([[2.0, 4.0, 6.0, 8.0]], gamma=[1.0, 2.0, 3.0, 4.0])
    rstd, y = kernels_judges._forward_reference(case)
    no_weight = case["x"].astype(float) * rstd[:, None]
    assert _judge_y(case, _fwd_out(no_weight, rstd)) == _y_problem(case, no_weight) + (
        ". Hint: rstd is right; multiply by the weight too: y = x * rstd * w")
    assert _judge_y(case, _fwd_out(y * 2, rstd * (1 + 5e-5))) == _y_problem(case, y * 2) + (
        ". Hint: the saved rstd is right, so the slip is in the last step: y = x * rstd * w")
    half = _fwd_case([[2.0, 4.0, 6.0, 8.0]], gamma=[1.0, 2.0, 3.0, 4.0], dtype="float16")
    rstd, y = kernels_judges._forward_reference(half)
    x_rstd = half["x"].astype(float) * rstd[:, None] * (1 + 2e-3)  # float16's tolerance
    assert _judge_y(half, _fwd_out(x_rstd, rstd)).endswith(
        "rstd is right; multiply by the weight too: y = x * rstd * w")


@pytest.mark.parametrize("index", range(6))
def test_forward_wrong_rstd_names_the_mistake(index):
    case = _fwd_case([[1.0, 2.0, 2.0]], eps=0.5)
    hint, saved = kernels_judges._rstd_mistakes(case)[index]
    y = case["x"].astype(float) * saved[:, None]
    assert _judge_y(case, _fwd_out(y, saved)) == _y_problem(case, y) + f". Hint: {hint}"


def test_forward_other_mistakes_get_no_hint():
    case = _fwd_case([[1.0, 2.0, 2.0]], eps=0.5)
    rstd, y = kernels_judges._forward_reference(case)
    assert _judge_y(case, _fwd_out(y * 3, rstd * 3)) == _y_problem(case, y * 3)
    assert _judge_y_and_rstd(case, _fwd_out(y, rstd * 3)) == mismatch(
        rstd * 3, rstd, dtype="float32", what="the saved rstd")


# ------------------------------------------------------------ the backward

def _bwd_case(x, dy, gamma, rows_per_program=1, dtype="float32", pad=0):
    x = np.asarray(x, np.float32)
    rstd = 1 / np.sqrt((x.astype(np.float64) ** 2).mean(-1) + 1e-5)
    return {"x": x, "dy": np.asarray(dy, np.float32), "gamma": np.asarray(gamma, np.float32),
            "rstd": rstd.astype(np.float32), "rows_per_program": np.array(rows_per_program),
            "dtype": np.array(dtype), "pad": np.array(pad)}


BWD = _bwd_case([[1.0, 2.0, 2.0], [3.0, -1.0, 0.5], [0.5, 0.5, 2.0]],
                [[1.0, -1.0, 0.5], [2.0, 0.0, 1.0], [-1.0, 1.0, 3.0]], [1.0, 2.0, 0.5],
                rows_per_program=2)


def _torch_grads(case):
    """dx and dw of y = x * rstd(x) * w by autograd, in float64 (rstd recomputed)."""
    x = torch.tensor(case["x"], dtype=torch.float64, requires_grad=True)
    w = torch.tensor(case["gamma"], dtype=torch.float64, requires_grad=True)
    y = x * (x.pow(2).mean(-1, keepdim=True) + 1e-5).rsqrt() * w
    y.backward(torch.tensor(case["dy"], dtype=torch.float64))
    return x.grad.numpy(), w.grad.numpy()


def test_backward_references_are_autograds():
    dx, dw = _torch_grads(BWD)
    # the references use the saved float32 rstd, autograd recomputes it in float64
    np.testing.assert_allclose(kernels_judges._dx_reference(BWD), dx, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(kernels_judges._dw_reference(BWD), dw, rtol=1e-5, atol=1e-7)
    x_hat, g, rstd = kernels_judges._backward_terms(BWD)
    assert rstd.shape == (3, 1)
    np.testing.assert_array_equal(g, BWD["dy"].astype(float) * BWD["gamma"])


def _dx_out(dx, padding=0):
    return {"dx": np.asarray(dx, np.float64), "padding_written": np.array(padding)}


def _dx_problem(case, dx):
    return mismatch(dx, kernels_judges._dx_reference(case), dtype=str(case["dtype"]), what="dx")


def test_dx_right_answers_pass():
    dx = kernels_judges._dx_reference(BWD)
    assert _judge_dx(BWD, _dx_out(dx)) is None
    assert _judge_dx(BWD, _dx_out(dx * (1 + 5e-5))) is None


def test_dx_right_but_padding_written():
    assert _judge_dx(BWD, _dx_out(kernels_judges._dx_reference(BWD), 2)) == (
        "dx is right, but the kernel also wrote past the end of each row. Hint: the store "
        "wrote 2 numbers into the lanes past N of dx, which belong to someone else: store "
        "with mask=cols < N")


def test_dx_rows_never_written_are_named():
    dx = kernels_judges._dx_reference(BWD)
    dx[1] = UNWRITTEN
    assert _judge_dx(BWD, _dx_out(dx)) == _dx_problem(BWD, dx) + (
        ". Hint: rows 1 of dx were never written: program p handles rows p * rows_per_program "
        "up to (not including) the smaller of (p + 1) * rows_per_program and M; loop over every "
        "one of its rows")
    dx[2] = UNWRITTEN
    assert "rows 1, 2 of dx were never written" in _judge_dx(BWD, _dx_out(dx))
    dx[:] = UNWRITTEN
    assert _judge_dx(BWD, _dx_out(dx)) == _dx_problem(BWD, dx) + (
        ". Hint: nothing was stored in DX: dx still holds what was there before")
    dx = kernels_judges._dx_reference(BWD)
    dx[1, 0] = UNWRITTEN  # one lane, not a row
    assert "never written" not in _judge_dx(BWD, _dx_out(dx))


def test_dx_stride_and_nan_hints():
    padded = {**BWD, "pad": np.array(1)}
    dx = kernels_judges._dx_reference(padded)
    dx[1:] *= 2
    assert _judge_dx(padded, _dx_out(dx)).endswith(
        "row r starts at X + r * row_stride (here rows are padded in memory), not at X + r * N")
    dx = np.full((3, 3), np.nan)
    assert _judge_dx(BWD, _dx_out(dx)).endswith("with mask=cols < N and other=0.0")


@pytest.mark.parametrize("index", range(6))
def test_dx_mistakes_are_named(index):
    hint, wrong = kernels_judges._dx_mistakes(BWD)[index]
    assert _judge_dx(BWD, _dx_out(wrong)) == _dx_problem(BWD, wrong) + f". Hint: {hint}"


def test_dx_mistakes_by_hand():
    x_hat, g, rstd = kernels_judges._backward_terms(BWD)
    dy = BWD["dy"].astype(float)
    mean_gx = (g * x_hat).mean(-1, keepdims=True)
    mistakes = kernels_judges._dx_mistakes(BWD)[:-2]  # the last two: rstd recomputed
    assert [text for text, _ in mistakes] == [
        "only the path through x itself is there: rstd depends on x too, and that dependence "
        "adds a second term (the one your assignment-04 derivation gets through rstd)",
        "the weight is missing from dx: the gradient that reaches the normalized row has "
        "passed through w",
        "dx carries a term that only layer norm has: RMSNorm subtracts no mean from x, so "
        "nothing in its dx comes from a mean of the incoming gradient",
        "the term that comes through rstd has the wrong sign (check it against your "
        "assignment-04 derivation)",
        "each row of dx is off by one factor, the same for all its lanes: look at the overall "
        "scale",
        "a mean over the row divides by N, the number of real features, not by BLOCK_SIZE"]
    expected = [rstd * g, rstd * (dy - x_hat * (dy * x_hat).mean(-1, keepdims=True)),
                rstd * (g - g.mean(-1, keepdims=True) - x_hat * mean_gx),
                rstd * (g + x_hat * mean_gx), g - x_hat * mean_gx,
                rstd * (g - x_hat * (g * x_hat).sum(-1, keepdims=True) / 4)]
    for (_, got), want in zip(mistakes, expected):
        np.testing.assert_allclose(got, want, rtol=1e-14)
    four = _bwd_case(np.ones((2, 4)), np.ones((2, 4)), np.ones(4))
    assert len(kernels_judges._dx_mistakes(four)) == 7


def test_dx_with_rstd_recomputed_without_eps_is_named():
    case = kernels_judges._dx_cases(np.random.default_rng(0))[-1][1]
    hint, wrong = kernels_judges._dx_mistakes(case)[-2]
    assert "recomputed from x without eps" in hint
    assert _judge_dx(case, _dx_out(wrong)) == _dx_problem(case, wrong) + f". Hint: {hint}"


def test_dx_other_mistakes_get_no_hint_or_the_precision_one():
    dx = kernels_judges._dx_reference(BWD) * 3
    assert _judge_dx(BWD, _dx_out(dx)) == _dx_problem(BWD, dx)
    half = {**BWD, "dtype": np.array("bfloat16")}
    dx = kernels_judges._dx_reference(half) * 1.1
    assert _judge_dx(half, _dx_out(dx)) == _dx_problem(half, dx) + (
        ". Hint: dx carries low-precision rounding: convert x, dy and w to float32 after "
        "loading them, and round only when you store dx")
    f16 = {**BWD, "dtype": np.array("float16")}
    assert _judge_dx(f16, _dx_out(kernels_judges._dx_reference(f16) * 1.1)).endswith(
        "round only when you store dx")


def _partial_out(rows, overrun=0):
    return {"partial_dw": np.asarray(rows, np.float64), "partial_overrun": np.array(overrun)}


def _right_partials(case):
    """Each program's sum of dy * x_hat over its rows."""
    x_hat, _, _ = kernels_judges._backward_terms(case)
    terms = case["dy"].astype(float) * x_hat
    step = int(case["rows_per_program"])
    return np.stack([terms[s:s + step].sum(0) for s in range(0, len(terms), step)])


def test_partial_dw_right_answers_pass():
    assert _judge_partial_dw(BWD, _partial_out(_right_partials(BWD))) is None


def test_partial_dw_rows_must_follow_the_prescribed_split():
    rows = _right_partials(BWD)
    serial = np.stack([rows.sum(0), np.zeros(3)])  # program 0 did every row
    message = _judge_partial_dw(BWD, _partial_out(serial))
    assert message.startswith("the rows of PartialDW add up to dW, but row 0 is not the sum "
                              "of program 0's own rows"), message
    assert "nothing ran in parallel" in message
    swapped = rows[::-1].copy()
    message = _judge_partial_dw(BWD, _partial_out(swapped))
    assert "program p adds only its own rows" in message, message


def test_partial_dw_half_precision_drift_is_named():
    half = kernels_judges._partial_cases(np.random.default_rng(0))[-1][1]
    rows = _right_partials(half)
    drifted = rows * (1 + 2e-3)
    message = _judge_partial_dw(half, _partial_out(drifted))
    assert "accumulator must still be float32" in message, message


def test_partial_dw_overrun_and_unwritten_rows_are_named():
    rows = _right_partials(BWD)
    assert _judge_partial_dw(BWD, _partial_out(rows, overrun=3)) == (
        "3 numbers were stored past the last row of PartialDW: program p writes one row of N "
        "numbers, at PartialDW + p * N + cols, with mask=cols < N (write it once, after the "
        "loop over its rows)")
    assert _judge_partial_dw(BWD, _partial_out(np.full((2, 3), UNWRITTEN))) == (
        "nothing was stored in PartialDW: each program stores its float32 sum at "
        "PartialDW + p * N + cols")
    partly = rows.copy()
    partly[1] = UNWRITTEN
    assert _judge_partial_dw(BWD, _partial_out(partly)) == (
        "the rows 1 of PartialDW were never written: every program p stores its sum (zeros if "
        "it had no rows) at PartialDW + p * N + cols")
    three = np.vstack([rows, np.full((2, 3), UNWRITTEN)])
    assert _judge_partial_dw(BWD, _partial_out(three)).startswith("the rows 2, 3 of PartialDW")
    lane = rows.copy()
    lane[0, 2] = UNWRITTEN
    assert _judge_partial_dw(BWD, _partial_out(lane)) == (
        "part of a row of PartialDW was never written: store all N lanes (mask=cols < N)")


def _dw_problem(case, dw):
    return mismatch(dw, kernels_judges._dw_reference(case), dtype="float32",
                    what="the rows of PartialDW added up")


def test_partial_mistakes_by_hand():
    """7 rows, 3 a program: programs start at rows 0, 3, 6 and end at 2, 5, 6."""
    rng = np.random.default_rng(1)
    case = _bwd_case(rng.normal(size=(7, 3)), rng.normal(size=(7, 3)), [1.0, 2.0, 0.5],
                     rows_per_program=3)
    x_hat, g, _ = kernels_judges._backward_terms(case)
    dy, x = case["dy"].astype(float), case["x"].astype(float)
    terms = dy * x_hat
    mistakes = kernels_judges._partial_mistakes(case)
    assert [text for text, _ in mistakes] == [
        "dW carries the weight once too often: w scales y, so it is not part of its own "
        "gradient",
        "each row of dW is off by its row's rstd: dW is made of the normalized rows, not of x "
        "itself",
        "that is the sum of dy over the rows (a bias's gradient): the weight multiplies the "
        "normalized row, which belongs in its gradient",
        "each program kept only its last row's share: add every row's share into one float32 "
        "accumulator (acc += ...), started with tl.zeros",
        "each program kept only its first row's share: add every row of the program into the "
        "accumulator",
        "the last row of each program is missing from the sum: program p adds every one of its "
        "rows, from p * rows_per_program up to (not including) the smaller of (p + 1) * "
        "rows_per_program and M"]
    expected = [(g * x_hat).sum(0), (dy * x).sum(0), dy.sum(0), terms[[2, 5, 6]].sum(0),
                terms[[0, 3, 6]].sum(0), terms[[0, 1, 3, 4]].sum(0)]
    for (_, got), want in zip(mistakes, expected):
        np.testing.assert_allclose(got, want, rtol=1e-14)


@pytest.mark.parametrize("index", range(6))
def test_partial_dw_mistakes_are_named(index):
    rng = np.random.default_rng(1)
    case = _bwd_case(rng.normal(size=(7, 3)), rng.normal(size=(7, 3)), [1.0, 2.0, 0.5],
                     rows_per_program=3)
    hint, dw = kernels_judges._partial_mistakes(case)[index]
    rows = np.stack([dw, np.zeros(3), np.zeros(3)])
    assert _judge_partial_dw(case, _partial_out(rows)) == _dw_problem(case, dw) + (
        f". Hint: {hint}")


def test_partial_dw_nan_hint_comes_first_and_others_get_none():
    case = _bwd_case(np.ones((2, 3)), np.ones((2, 3)), np.ones(3))  # x_hat = dy = 1: dW = dy
    rows = np.full((2, 3), np.nan)
    assert _judge_partial_dw(case, _partial_out(rows)) == _dw_problem(case, rows.sum(0)) + (
        ". Hint: NaN came out of NaN going in: the lanes past N of this test's memory hold NaN "
        "(real padding holds anything), so some load read past the row. Load every row (and "
        "w) with mask=cols < N and other=0.0")
    rows = _right_partials(BWD) * 3
    assert _judge_partial_dw(BWD, _partial_out(rows)) == _dw_problem(BWD, rows.sum(0))


def test_partial_dw_the_first_matching_mistake_is_named():
    """x_hat = 1 everywhere (rstd 1 up to eps) and w = 1: dy * x_hat, g * x_hat and
    dy * x coincide, and the first of them in the list is the one named."""
    case = _bwd_case(np.ones((2, 4)), np.ones((2, 4)), np.full(4, 2.0))
    dw = (case["dy"] * 2.0).sum(0)  # g * x_hat with w = 2
    message = _judge_partial_dw(case, _partial_out(np.stack([dw, np.zeros(4)])))
    assert message.endswith(". Hint: dW carries the weight once too often: w scales y, so it "
                            "is not part of its own gradient")


# ------------------------------------------------------------ the byte questions

def test_llama_bytes_by_hand():
    """Per element of x: to(float32) 2 + 4, pow 4 + 4, mean 4, x * rstd 4 + 4,
    to(bfloat16) 4 + 2, weight * it 2 + 2: 36 bytes; per row: mean's result 4,
    + eps 8, rsqrt 8, rstd read by the multiply 4: 24 bytes; the weight 2 a feature."""
    assert kernels_judges.llama_rms_norm_bytes(2, 3) == 36 * 6 + 24 * 2 + 2 * 3
    assert kernels_judges._true_llama_bytes() == 36 * 4096 * 2048 + 24 * 4096 + 2 * 2048


@pytest.mark.parametrize("answer, message", [
    (302092288, None), (301989888, None), (302_300_000, None), (302_500_000, "List the eight"),
    (24 * 4096 * 2048, ".to() conversions are kernels too"),
    (22 * 4096 * 2048, "are float32, 4 bytes a number"),
    (2 * 4096 * 2048 * 2, "fused RMSNorm"), (44 * 4096 * 2048, "in the dtype it holds"),
    (8 * 302092288, "in bits"), (9.0, "a ratio"), (9.003, "a ratio"), (3.5, "List the eight"),
    (0, "List the eight"),
])
def test_llama_bytes_answers(answer, message):
    got = _judge_llama_bytes({}, {"answer": np.array(str(answer))})
    if message is None:
        assert got is None
    else:
        assert got.startswith(f"not yet right: you answered {answer}") and message in got


@pytest.mark.parametrize("answer", ["None", "many", "[3.0e8]", "nan", "True"])
def test_llama_bytes_needs_one_finite_number(answer):
    assert _judge_llama_bytes({}, {"answer": np.array(answer)}) == (
        f"give one number, the bytes the eight kernels move in all (you gave {answer!r})")


TRUE_BACKWARD = 103317504


@pytest.mark.parametrize("answer, message", [
    (TRUE_BACKWARD, None), (TRUE_BACKWARD * 1.0009, None), (TRUE_BACKWARD * 0.9991, None),
    (TRUE_BACKWARD * 1.0011, "list"), (TRUE_BACKWARD * 0.9989, "list"),
    (TRUE_BACKWARD + 4032 * 4096 * 2, "per row"), (3 * 4096 * 4096 * 2, "x, dy and dx"),
    (TRUE_BACKWARD - 2 * 64 * 4096 * 4, "partial sums of dW are part"),
    (TRUE_BACKWARD - 64 * 4096 * 4, "float32"), (TRUE_BACKWARD - 63 * 4096 * 2, "each of"),
    (TRUE_BACKWARD + 3 * 4096 * 4096 * 2, "2 bytes"), (8 * TRUE_BACKWARD, "bits"),
    (0, "list"), (24576, "list"),
])
def test_backward_bytes_answers(answer, message):
    got = _judge_backward_bytes({}, {"answer": np.array(str(float(answer)))})
    if message is None:
        assert got is None
    elif message == "list":
        assert got.startswith("not yet right") and "List what the kernel reads" in got
    else:
        assert got.startswith("not yet right") and "Hint: " in got and message in got
    for not_one in ("[1.0, 2.0]", "nan", "None"):
        assert _judge_backward_bytes({}, {"answer": np.array(not_one)}) == (
            f"give one number, the bytes of the whole backward (you gave {not_one!r})")


@pytest.mark.parametrize("kind", [int, float, np.int64, np.float32, torch.tensor, str,
                                  lambda value: Fraction(2 * value, 2)])
def test_byte_answers_are_read_in_any_numeric_type(kind):
    kernels_probes.check_backward_bytes(kind(103317504))
    kernels_probes.check_llama_bytes(kind(302092288))


# ============================================================ the probes: what counts as a kernel

@triton.jit
def good_fwd(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * row_stride + cols, x * rstd * w, mask=mask)
    tl.store(Rstd + row, rstd)


@triton.jit
def unmasked_store_fwd(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(Y + row * row_stride + cols, x * rstd)
    tl.store(Rstd + row, rstd)


@triton.jit
def good_bwd(DX, DY, X, W, Rstd, PartialDW, row_stride, M, N, rows_per_program,
             BLOCK_SIZE: tl.constexpr):
    program = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw_sum = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    first = program * rows_per_program
    for row in range(first, tl.minimum(first + rows_per_program, M)):
        x = tl.load(X + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(Rstd + row)
        x_hat = x * rstd
        g = dy * w
        dx = rstd * (g - x_hat * tl.sum(g * x_hat, axis=0) / N)
        tl.store(DX + row * row_stride + cols, dx, mask=mask)
        dw_sum += dy * x_hat
    tl.store(PartialDW + program * N + cols, dw_sum, mask=mask)


@triton.jit
def by_row_bwd(DX, DY, X, W, Rstd, PartialDW, row_stride, M, N, rows_per_program,
               BLOCK_SIZE: tl.constexpr):
    """Stores a row of PartialDW per row of x: past the programs' rows."""
    program = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    first = program * rows_per_program
    for row in range(first, tl.minimum(first + rows_per_program, M)):
        dy = tl.load(DY + row * row_stride + cols, mask=mask, other=0.0)
        tl.store(DX + row * row_stride + cols, dy)
        tl.store(PartialDW + row * N + cols, dy, mask=mask)


def _kernel_from_source(source, name="k", namespace=None):
    """A kernel defined from text, its source kept where inspect finds it (as a
    notebook cell's is)."""
    filename = f"<cell-{abs(hash(source))}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"triton": triton, "tl": tl, **(namespace or {})}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


HEADER = "@triton.jit\ndef k(X, Y, W, Rstd, row_stride, N, eps, BLOCK_SIZE: tl.constexpr):\n"


def _refusal(kernel, **kwargs):
    with pytest.raises(KernelRefused) as caught:
        kernels_probes.verify_kernel_object(kernel, **kwargs)
    return str(caught.value)


def test_triton_root_is_tritons_folder():
    root = kernels_probes._triton_root()
    assert root.endswith(os.sep) and os.path.isdir(root)
    assert os.path.realpath(tl.core.__file__).startswith(root)
    assert os.path.basename(root[:-1]) == "triton"


def test_kernel_modules_are_tritons_own():
    is_kernel_module = kernels_probes._is_kernel_module
    assert is_kernel_module(triton) and is_kernel_module(tl) and is_kernel_module(tl.math)
    assert is_kernel_module(sys.modules["triton.language.core"])
    assert not is_kernel_module(sys.modules["triton.runtime"])
    assert not is_kernel_module(np)
    fake = types.ModuleType("triton.language")
    assert not is_kernel_module(fake), "a module of that name that is not the real one"

    class Sub(types.ModuleType):
        pass

    assert not is_kernel_module(Sub("triton"))


def _yours():
    return 1


def test_comes_from_triton_knows_tritons_language():
    comes = kernels_probes._comes_from_triton
    for value in (tl, tl.load, tl.sum, triton.cdiv, tl.float32, tl.constexpr, tl.tensor,
                  tl.core.dtype):
        assert comes(value), value
    for value in (np, np.sum, _yours, len, print, "text".upper, [].append, good_fwd, 3,
                  torch.float32):
        assert not comes(value), value
    moved = types.FunctionType(_yours.__code__, {}, "load")
    moved.__module__ = "triton.language.core"
    assert not comes(moved), "__module__ is a string anyone can set"
    assert comes(tl.core._unwrap_if_constexpr)
    copied = types.FunctionType(tl.core._unwrap_if_constexpr.__code__, {})
    copied.__module__ = "mine"
    assert not comes(copied), "Triton's code under another module's name"


def test_comes_from_triton_follows_tritons_own_jit_functions():
    jitted = [v for v in vars(tl.standard).values()
              if type(v) in kernels_probes._triton_types()[:2]]
    assert jitted, "triton.language.standard has @jit functions"
    assert all(kernels_probes._comes_from_triton(v) for v in jitted)
    assert not kernels_probes._comes_from_triton(good_fwd)


def test_class_from_triton_reads_every_method_along_the_mro():
    import argparse

    class_from = kernels_probes._class_from_triton
    assert class_from(tl.tensor) and class_from(tl.constexpr)
    assert not class_from(argparse.Namespace), "not Triton's by its module"

    def make(name, bases=(), **body):
        return type(name, bases, {"__module__": "triton.language.fake", **body})

    assert class_from(make("Plain"))
    assert class_from(make("FromStdlib", (argparse.Namespace,))), "stdlib methods are fine"
    assert not class_from(make("Method", f=lambda self: 1))
    assert not class_from(make("Static", f=staticmethod(_yours)))
    assert not class_from(make("Class", f=classmethod(lambda cls: 1)))
    assert not class_from(make("Getter", p=property(lambda self: 1)))
    setter = property(triton.cdiv.fn if hasattr(triton.cdiv, "fn")
                      else tl.core._unwrap_if_constexpr,
                      lambda self, v: None)
    assert not class_from(make("Setter", p=setter))
    deleter = property(None, None, lambda self: None)
    assert not class_from(make("Deleter", p=deleter))
    assert not class_from(make("Inherits", (make("Base", f=lambda self: 1),)))


def test_constants_a_kernel_may_read():
    is_constant = kernels_probes._is_constant
    for value in (None, True, 3, 2.5, "s", tl.constexpr(4), tl.constexpr(None)):
        assert is_constant(value), value
    for value in ([1], (1,), np.float64(1.0), np.int64(1), tl.constexpr([1]), _yours, tl):
        assert not is_constant(value), value


def test_dotted_names():
    def dotted(text):
        return kernels_probes._dotted(ast.parse(text, mode="eval").body)

    assert dotted("tl.math.sqrt") == ["tl", "math", "sqrt"]
    assert dotted("tl") == ["tl"]
    assert dotted("f().x") is None and dotted("1") is None


def test_kernel_source_is_read_from_the_def_line():
    full, body = kernels_probes._kernel_source(good_fwd, good_fwd.fn)
    assert full.startswith("@triton.jit\ndef good_fwd(") and body.startswith("def good_fwd(")
    assert full.endswith("tl.store(Rstd + row, rstd)\n") and full.endswith(body)
    indented = _kernel_from_source("if True:\n    @triton.jit\n    def k(X):\n"
                                   "        tl.store(X, 1)\n")
    full, body = kernels_probes._kernel_source(indented, indented.fn)
    assert full == "@triton.jit\ndef k(X):\n    tl.store(X, 1)\n"
    assert body == "def k(X):\n    tl.store(X, 1)\n"


def test_kernel_source_refusals():
    namespace = {"triton": triton, "tl": tl}
    exec(HEADER + "    tl.store(Y, tl.load(X))\n", namespace)
    with pytest.raises(KernelRefused) as caught:
        kernels_probes._kernel_source(namespace["k"], namespace["k"].fn)
    assert str(caught.value) == ("the kernel's source code cannot be found: define it with "
                                 "@triton.jit in a cell (or a file), not with exec or eval")
    two = _kernel_from_source(HEADER + '    """\n    def f(): not code\n    """\n'
                                       "    tl.store(Y, tl.load(X))\n")
    with pytest.raises(KernelRefused) as caught:
        kernels_probes._kernel_source(two, two.fn)
    assert str(caught.value) == (
        "the kernel's source must hold exactly one `def` line (no nested functions, no "
        "docstring line starting with 'def ')")


def _compiled(fn):
    from triton.runtime.jit import JITFunction

    return JITFunction(fn)


def test_kernel_source_of_a_compiled_kernel_must_be_its_functions():
    compiled = _compiled(good_fwd.fn)
    full, body = kernels_probes._kernel_source(compiled, compiled.fn)
    assert body.startswith("def good_fwd(")
    compiled._unsafe_update_src(compiled.src.replace("rstd * w", "rstd"))
    with pytest.raises(KernelRefused, match="^the kernel's compiled source is not the source "
                                            "of its function$"):
        kernels_probes._kernel_source(compiled, compiled.fn)


def _line(kernel, offset):
    return kernel.fn.__code__.co_firstlineno + offset


@pytest.mark.parametrize("body, words", [
    ("    async def f():\n        pass\n", "line 3: a kernel body defines no functions or "
                                           "classes of its own"),
    ("    f = lambda: 1\n", "line 3: a kernel body defines no functions or classes of its own"),
    ("    class C:\n        pass\n", "line 3: a kernel body defines no functions or classes "
                                     "of its own"),
    ("    raise NotImplementedError()\n", "line 3: the kernel still raises "
                                          "NotImplementedError: its body is not written yet"),
    ("    raise NotImplementedError\n", "line 3: the kernel still raises "
                                        "NotImplementedError: its body is not written yet"),
    ("    raise ValueError('x')\n", "line 3: a kernel body cannot raise Python exceptions "
                                    "(tl.device_assert checks a condition)"),
    ("    import os\n", "line 3: `import os` has no place in a kernel body"),
    ("    from os import path\n", "line 3: `from os import path` has no place in a kernel "
                                  "body"),
    ("    global G\n", "line 3: `global G` has no place in a kernel body"),
    ("    tl.store(Y, tl.load(X))\n    x = X._data\n",
     "line 4: the attribute ._data leads out of Triton (the interpreter keeps numpy arrays "
     "and Python internals behind it); use tl operations only"),
    ("    x = X.handle\n", "line 3: the attribute .handle leads out of Triton"),
    ("    x = __builtins__\n", "line 3: `__builtins__` is Python's internals, not Triton"),
    ("    x = open\n", "line 3: `open` is not an argument, a local variable, tl or triton, nor "
                       "one of the builtins a kernel may use (abs, bool, enumerate, float, "
                       "int, isinstance, len, max, min, print, range, tuple, zip): it is a "
                       "Python builtin that leads out of Triton"),
    ("    x = nowhere\n", "line 3: `nowhere` is not an argument, a local variable, tl or "
                          "triton, nor one of the builtins a kernel may use (abs, bool, "
                          "enumerate, float, int, isinstance, len, max, min, print, range, "
                          "tuple, zip)\n"),
    ("    x = np.sum(X)\n", "line 3: the kernel uses `np` (the module numpy), which is not "
                            "Triton. Under the interpreter a kernel body is plain Python and "
                            "could call torch or numpy, so the grader accepts only tl.* (and "
                            "triton.*) operations, the kernel's arguments and local "
                            "variables, @triton.jit helpers, constants and the builtins abs, "
                            "bool, enumerate, float, int, isinstance, len, max, min, print, "
                            "range, tuple, zip"),
    ("    x = HELPER_LIST\n", "line 3: the kernel uses `HELPER_LIST` (a list), which is not "
                              "Triton."),
    ("    x = tl.no_such_thing(X)\n", "line 3: tl.no_such_thing does not exist in Triton"),
    ("    x = tl.core.builtins.abs(X)\n", "line 3: tl.core.builtins is not Triton's own (a "
                                          "module or function from outside Triton, or "
                                          "something put in its place). Under the "
                                          "interpreter"),
    ("    m = tl.math\n", "line 3: tl.math is a module: use its operations "
                          "(tl.math.something(...)), do not pass it around"),
    ("    m = tl\n", "line 3: tl is a module: use its operations (tl.something(...)), do not "
                     "pass it around"),
])
def test_kernel_bodies_that_leave_triton_are_refused(body, words):
    kernel = _kernel_from_source(HEADER + body, namespace={"np": np, "HELPER_LIST": [1]})
    message = _refusal(kernel)
    prefix = "in k, "
    assert message.startswith(prefix)
    if words.endswith("\n"):
        assert message == prefix + words[:-1]
    else:
        assert message[len(prefix):].startswith(words) or words in message, message


def test_refusals_name_the_line_in_the_cell():
    kernel = _kernel_from_source("\n\n" + HEADER + "    tl.store(Y, tl.load(X))\n"
                                 "    x = X.handle\n")
    assert _refusal(kernel).startswith("in k, line 6: the attribute .handle")


def test_what_is_not_a_single_jit_function_is_refused():
    checked = set()
    with pytest.raises(KernelRefused, match="^in k: the source should be a single function "
                                            "definition$"):
        kernels_probes._check_tree(ast.parse("x = 1\n"), good_fwd.fn, "in k", checked)
    with pytest.raises(KernelRefused, match="^in k: the source should be a single function "
                                            "definition$"):
        kernels_probes._check_tree(ast.parse("def a():\n    pass\ndef b():\n    pass\n"),
                                   good_fwd.fn, "in k", checked)
    with pytest.raises(KernelRefused, match="^in k: the function is not decorated with "
                                            "@triton.jit$"):
        kernels_probes._check_tree(ast.parse("def a():\n    pass\n"), good_fwd.fn, "in k",
                                   checked)
    fn = _kernel_from_source(HEADER + "    tl.store(Y, 1)\n", namespace={"jit": triton.jit}).fn
    for decorator in ("@triton.jit", "@triton.jit(debug=True)", "@jit"):
        tree = ast.parse(f"{decorator}\ndef a(X):\n    tl.store(X, 1)\n")
        assert kernels_probes._check_tree(tree, fn, "in k", checked) == 1


def test_triton_calls_are_counted_in_the_body_and_its_helpers():
    """good_fwd calls program_id, arange, load (twice), sqrt, sum and store (twice):
    8; the decorator, annotations and tl.float32 are not calls in the body."""
    assert kernels_probes._check_kernel_function(good_fwd, set()) == 8
    assert kernels_probes._check_kernel_function(good_fwd, {id(good_fwd)}) == 0
    helper = _kernel_from_source("@triton.jit\ndef helper(x):\n    return tl.sum(x, axis=0)\n",
                                 name="helper")
    kernel = _kernel_from_source(HEADER + "    tl.store(Y, helper(tl.load(X)) + "
                                          "helper(tl.load(X)))\n", namespace={"helper": helper})
    assert kernels_probes._check_kernel_function(kernel, set()) == 4, "helper counted once"
    args = _kernel_from_source("@triton.jit\ndef k(*xs, scale=2.0, **kw):\n"
                               "    tl.store(xs, scale)\n    del kw\n")
    assert kernels_probes._check_kernel_function(args, set()) == 1
    bad_helper = _kernel_from_source("@triton.jit\ndef helper(x):\n    return np.sum(x)\n",
                                     name="helper", namespace={"np": np})
    kernel = _kernel_from_source(HEADER + "    tl.store(Y, helper(X))\n",
                                 namespace={"helper": bad_helper})
    assert _refusal(kernel).startswith("in helper, line 3: the kernel uses `np`")


def test_a_kernel_without_triton_calls_is_refused():
    kernel = _kernel_from_source(HEADER + "    x = X\n")
    assert _refusal(kernel) == (
        "the kernel's body calls no tl. operation: it must load, compute and store with Triton "
        "(tl.load, tl.sum, tl.store, ...)")


def test_plain_jit_options():
    plain = kernels_probes._plain_jit_options
    assert plain({}) and plain({"debug": True, "do_not_specialize": [0, "N"]})
    assert plain({"launch_metadata": None, "repr": None, "noinline": False})
    assert plain({"do_not_specialize": ("N",)})
    assert not plain({"repr": lambda *a: "x"}) and not plain({"launch_metadata": print})
    assert not plain({"do_not_specialize": [_yours]}) and not plain({"debug": _yours})
    assert not plain([("debug", True)]) and not plain(None)

    class Dict(dict):
        pass

    assert not plain(Dict())


@needs_interpreter
def test_changed_kernels_are_refused():
    closure_x = 1

    def make():
        @triton.jit
        def k(X):
            tl.store(X, closure_x)

        return k

    assert _refusal(make()) == (
        "k uses variables of an enclosing function (closure_x); define the kernel at the top "
        "level of a cell")
    default = _kernel_from_source("@triton.jit\ndef k(X, S=SCALE):\n    tl.store(X, S)\n",
                                  namespace={"SCALE": [1]})
    assert _refusal(default) == "k has a default argument that is not a constant"
    kw_default = _kernel_from_source("@triton.jit\ndef k(X, *, S=SCALE):\n    tl.store(X, S)\n",
                                     namespace={"SCALE": [1]})
    assert _refusal(kw_default) == "k has a default argument that is not a constant"
    fine = _kernel_from_source("@triton.jit\ndef k(X, S=2.0, *, T=None):\n    tl.store(X, S)\n")
    assert kernels_probes.verify_kernel_object(fine) == "cpu"

    extra = triton.jit(good_fwd.fn)
    extra.cache_hook = print
    extra.another = 1
    assert _refusal(extra) == "good_fwd has been changed after @triton.jit made it (another, " \
                              "cache_hook)"
    rewriter = triton.jit(good_fwd.fn)
    rewriter.rewriter = object()
    assert _refusal(rewriter) == "good_fwd has been changed after @triton.jit made it"
    other_fn = triton.jit(good_fwd.fn)
    other_fn.rewriter = triton.jit(_yours).rewriter
    assert _refusal(other_fn) == "good_fwd has been changed after @triton.jit made it"
    options = triton.jit(good_fwd.fn)
    options.kwargs = {"repr": lambda *args: "x"}
    assert _refusal(options) == "good_fwd has been changed after @triton.jit made it"
    hooked = triton.jit(good_fwd.fn)
    hooked.add_pre_run_hook(lambda *args, **kwargs: None)
    assert _refusal(hooked) == ("good_fwd has pre-run hooks: code that runs outside the kernel "
                                "at each launch")


@needs_interpreter
def test_wrapped_non_functions_are_refused():
    wrapped = triton.jit(good_fwd.fn)
    wrapped.fn = print
    assert _refusal(wrapped) == ("print wraps a builtin_function_or_method, not a Python "
                                 "function with Triton source")


@needs_interpreter
def test_the_interpreters_cached_rewrite_is_dropped():
    from triton.runtime.interpreter import InterpretedFunction

    kernel = triton.jit(good_fwd.fn)
    InterpretedFunction.rewritten_fn[kernel.fn] = lambda *args, **kwargs: None
    assert kernels_probes.verify_kernel_object(kernel) == "cpu"
    assert kernel.fn not in InterpretedFunction.rewritten_fn


def test_a_source_that_does_not_parse_is_refused(monkeypatch):
    kernel = _kernel_from_source(HEADER + "    tl.store(Y, tl.load(X))\n")
    monkeypatch.setattr(kernels_probes, "_kernel_source",
                        lambda kernel, fn: ("def k(:\n", "def k(:\n"))
    assert _refusal(kernel).startswith("the source of k does not parse: ")


def test_compiled_kernels_nothing_may_shadow_a_method(monkeypatch):
    compiled = _compiled(good_fwd.fn)
    compiled.run = lambda *args, **kwargs: None
    compiled.warmup = print
    assert _refusal(compiled) == ("good_fwd has been changed after @triton.jit made it "
                                  "(run, warmup)")
    plain = _compiled(good_fwd.fn)
    plain.anything = 1
    with pytest.raises(RuntimeError) as caught:
        kernels_probes.verify_kernel_object(plain)
    assert str(caught.value) == (
        "your kernel was compiled for a GPU and there is none: set "
        "os.environ['TRITON_INTERPRET'] = '1' before the kernels are defined (@triton.jit "
        "reads it; restart the kernel and run the cells from the top)")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert kernels_probes.verify_kernel_object(_compiled(good_fwd.fn)) == "cuda"


def test_compiled_kernels_launch_hooks_are_refused(monkeypatch):
    from triton import knobs

    with_metadata = _compiled(good_fwd.fn)
    with_metadata.launch_metadata = lambda *args: {}
    assert _refusal(with_metadata) == ("the kernel has a launch_metadata hook: code that runs "
                                       "outside the kernel at each launch")
    for name in ("launch_enter_hook", "launch_exit_hook"):
        chain = getattr(knobs.runtime, name)
        chain.add(print)
        try:
            assert _refusal(_compiled(good_fwd.fn)) == (
                f"triton.knobs.runtime.{name} is set: code that runs outside the kernel at "
                "each launch")
        finally:
            chain.calls.clear()
        monkeypatch.setattr(knobs.runtime, name, [])
        assert _refusal(_compiled(good_fwd.fn)).startswith(f"triton.knobs.runtime.{name} is set")
        monkeypatch.undo()
    for name in ("jit_cache_hook", "jit_post_compile_hook", "add_stages_inspection_hook"):
        monkeypatch.setattr(knobs.runtime, name, print)
        assert _refusal(_compiled(good_fwd.fn)) == (
            f"triton.knobs.runtime.{name} is set: code that runs outside the kernel when it is "
            "compiled")
        monkeypatch.undo()


def test_launch_machinery_is_tritons_own(monkeypatch):
    from triton.runtime import interpreter, jit

    assert kernels_probes._launch_machinery_problem() is None
    for cls, attr in [(jit.KernelInterface, "__getitem__"), (jit.JITFunction, "run"),
                      (interpreter.InterpretedFunction, "run"),
                      (interpreter.InterpretedFunction, "rewrite"),
                      (interpreter.FunctionRewriter, "rewrite_ast"),
                      (interpreter.FunctionRewriter, "_compile_and_exec"),
                      (interpreter.GridExecutor, "__call__")]:
        monkeypatch.setattr(cls, attr, lambda *args, **kwargs: None)
        assert kernels_probes._launch_machinery_problem() == f"{cls.__name__}.{attr}"
        assert _refusal(good_fwd) == (f"Triton's own {cls.__name__}.{attr} has been replaced: "
                                      "the grader only runs kernels through Triton itself")
        monkeypatch.setattr(cls, attr, print)  # no code at all
        assert kernels_probes._launch_machinery_problem() == f"{cls.__name__}.{attr}"
        monkeypatch.undo()
    from collections import defaultdict

    monkeypatch.setattr(interpreter.InterpretedFunction, "rewritten_fn", defaultdict())
    assert kernels_probes._launch_machinery_problem() == "InterpretedFunction.rewritten_fn"


def test_only_tritons_kernel_types_are_accepted():
    class Spoof:
        __class__ = type(good_fwd)

    assert _refusal(Spoof()) == (
        "pass the @triton.jit kernel itself (rms_norm_fwd_kernel(X, Y, W, Rstd, row_stride, "
        "N, eps, BLOCK_SIZE)), not Spoof")
    assert _refusal(good_fwd.fn, signature="S(X)") == (
        "pass the @triton.jit kernel itself (S(X)), not function")
    if INTERPRETED:
        assert kernels_probes.verify_kernel_object(good_fwd) == "cpu"


# ============================================================ the probes: launching

def test_padded_buffer_holds_rows_width_apart_in_nan():
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    buffer = kernels_probes._padded(values, 3, 8, torch.float16, "cpu")
    assert buffer.dtype == torch.float16 and buffer.shape == (8,)
    got = buffer.float().tolist()
    assert got[:2] == [1.0, 2.0] and got[3:5] == [3.0, 4.0]
    assert all(np.isnan(got[i]) for i in (2, 5, 6, 7))
    one = kernels_probes._padded(torch.tensor([5.0, 6.0, 7.0]), 4, 4, torch.float32, "cpu")
    assert one.tolist()[:3] == [5.0, 6.0, 7.0] and np.isnan(one.tolist()[3])


def test_tensor_layout_and_rows():
    case = kernels_judges._forward_case(np.arange(6.0).reshape(2, 3), dtype="bfloat16", pad=2)
    t = kernels_probes._tensor(case, "x", "cpu")
    assert t.dtype == torch.float32 and t.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert kernels_probes._layout(case, "cpu") == (torch.bfloat16, 2, 3, 4, 6, 16)
    for n, block in ((1, 1), (2, 2), (4, 4), (5, 8), (100, 128)):
        layout = kernels_probes._layout(kernels_judges._forward_case(np.ones((3, n))), "cpu")
        assert layout == (torch.float32, 3, n, block, block, 3 * block + block)
    buffer = torch.full((2 * 6 + 4,), UNWRITTEN)
    buffer[:3], buffer[6:9] = torch.tensor([1.0, 2, 3]), torch.tensor([4.0, 5, 6])
    buffer[3], buffer[10] = 7.0, 8.0  # lane 3 of row 0 (a lane of BLOCK_SIZE), a pad of row 1
    values, written = kernels_probes._rows(buffer, 2, 3, 4, 6)
    assert values.tolist() == [[1, 2, 3], [4, 5, 6]] and int(written) == 1
    half_values, _ = kernels_probes._rows(buffer.half(), 2, 3, 4, 6)
    assert half_values.dtype == torch.float32


@needs_interpreter
def test_launch_forward_reports_y_rstd_and_padding():
    case = kernels_judges._forward_case(np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]),
                                        gamma=[1.0, 2.0, 0.5], eps=0.5, pad=1)
    result = kernels_probes._launch_forward(good_fwd, case)
    rstd, y = kernels_judges._forward_reference(case)
    np.testing.assert_allclose(result["y"].numpy(), y, rtol=1e-6)
    np.testing.assert_allclose(result["rstd"].numpy(), rstd, rtol=1e-6)
    assert int(result["padding_written"]) == 0
    assert _judge_y_and_rstd(case, {k: np.asarray(v) for k, v in result.items()}) is None
    result = kernels_probes._launch_forward(unmasked_store_fwd, case)
    assert int(result["padding_written"]) == 2, "lane 3 of each row"


@needs_interpreter
def test_launch_backward_reports_dx_partials_and_overrun():
    case = kernels_judges._backward_case(np.random.default_rng(0), 3, 3, 2, pad=1)
    result = kernels_probes._launch_backward(good_bwd, case)
    assert result["partial_dw"].shape == (2, 3)
    output = {k: np.asarray(v) for k, v in result.items()}
    assert _judge_dx(case, output) is None and _judge_partial_dw(case, output) is None
    assert int(result["padding_written"]) == 0 and int(result["partial_overrun"]) == 0
    result = kernels_probes._launch_backward(by_row_bwd, case)
    assert int(result["partial_overrun"]) == 3, "row 2's partial sum lands past 2 programs"
    assert int(result["padding_written"]) == 3, "lane 3 of each row of dx"


def test_check_functions_run_their_checks_with_their_launchers():
    """A plain function is refused, naming the check, the case and the kernel's
    signature (forward or backward): no kernel is launched."""
    forward = kernels_probes.FORWARD_SIGNATURE
    backward = kernels_probes.BACKWARD_SIGNATURE
    for check, name, label, signature in [
            (kernels_probes.check_rms_forward_rows, "rms_forward_rows",
             "x = [2, 4, 6, 8] (one row, N = 4)", forward),
            (kernels_probes.check_rms_forward_ragged_rows, "rms_forward_ragged",
             "3 rows of 100 features (BLOCK_SIZE 128)", forward),
            (kernels_probes.check_rms_forward_rstd, "rms_forward_rstd", "4 rows of 64 features",
             forward),
            (kernels_probes.check_rms_forward_half_precision, "rms_forward_half",
             "float16, 4 rows of 256 features", forward),
            (kernels_probes.check_rms_backward_dx, "rms_backward_dx",
             "5 rows of 100 features, 2 rows a program (the last program gets one)", backward),
            (kernels_probes.check_rms_backward_partial_dw, "rms_backward_partial_dw",
             "7 rows of 48 features, 3 rows a program (3, 3 and 1)", backward)]:
        with pytest.raises(CheckFailed) as caught:
            check(_yours)
        assert str(caught.value) == (
            f"{name}, {label}: your code raised KernelRefused: pass the @triton.jit kernel "
            f"itself ({signature}), not function")


def test_byte_question_checks():
    kernels_probes.check_llama_bytes(302092288)
    with pytest.raises(CheckFailed, match="^rms_llama_bytes, your answer: not yet right"):
        kernels_probes.check_llama_bytes(6)
    kernels_probes.check_backward_bytes(103317504)
    with pytest.raises(CheckFailed, match="^rms_backward_bytes, your answer: not yet "
                                          "right: .* Hint: w is loaded once per program"):
        kernels_probes.check_backward_bytes(103317504 + 4032 * 4096 * 2)
    assert kernels_probes._answer_as_text(np.int64(24576), {})["answer"] == "24576"


# ============================================================ the probes: the launchers' buffers
# The launchers are driven by a stand-in kernel (the object check replaced for
# them), which records what it is given and stores as a kernel would.

class Launched(Exception):
    """Raised by a stand-in kernel to end a launch on a device that holds no data."""


class StandInKernel:
    """kernel[grid](*args, **kwargs) records the launch, then runs `body` on the
    arguments (which may store into them, or raise Launched)."""

    def __init__(self, body):
        self.body = body
        self.launches = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((grid, args, kwargs))
            self.body(*args, **kwargs)

        return launch


def _stop(*args, **kwargs):
    raise Launched


def _launch_on(monkeypatch, device, launcher, case, body=_stop):
    """Run `launcher` with a stand-in kernel accepted as running on `device`;
    returns (what the launcher returned or None, the tensors the kernel got)."""
    monkeypatch.setattr(kernels_probes, "verify_kernel_object",
                        lambda kernel, signature=None: device)
    kernel = StandInKernel(body)
    try:
        result = launcher(kernel, case)
    except Launched:
        result = None
    (_, args, _), = kernel.launches
    return result, [a for a in args if isinstance(a, torch.Tensor)]


def _half_backward_case():
    return kernels_judges._backward_case(np.random.default_rng(0), 3, 3, 2, dtype="float16",
                                         pad=1)


@pytest.mark.parametrize("launcher, case, count", [
    (kernels_probes._launch_forward, kernels_judges._forward_case(np.ones((2, 3))), 4),
    (kernels_probes._launch_backward, _half_backward_case(), 6)])
def test_every_buffer_is_on_the_kernels_device(monkeypatch, launcher, case, count):
    """A compiled kernel reads and writes GPU memory only: every tensor the
    launcher passes (inputs, outputs, Rstd, PartialDW) is on the device that
    verify_kernel_object named ("meta" here: a device with no data, as no GPU)."""
    _, tensors = _launch_on(monkeypatch, "meta", launcher, case)
    assert len(tensors) == count
    assert [t.device.type for t in tensors] == ["meta"] * count


def test_forward_buffers_have_the_cases_dtype_and_rstd_float32(monkeypatch):
    """X, Y and W hold the case's dtype (float16 here); Rstd is float32, even in
    a notebook that made float64 torch's default dtype."""
    case = kernels_judges._forward_case(np.ones((2, 3)), dtype="float16")
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _, (x, y, w, rstd) = _launch_on(monkeypatch, "cpu", kernels_probes._launch_forward,
                                        case)
    finally:
        torch.set_default_dtype(default)
    assert (x.dtype, y.dtype, w.dtype, rstd.dtype) == (torch.float16,) * 3 + (torch.float32,)


def test_backward_buffers_have_the_cases_dtype_and_float32_sums(monkeypatch):
    """DX, DY, X and W hold the case's dtype; Rstd and PartialDW are float32,
    even under a float64 default dtype."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _, tensors = _launch_on(monkeypatch, "cpu", kernels_probes._launch_backward,
                                _half_backward_case())
    finally:
        torch.set_default_dtype(default)
    assert [t.dtype for t in tensors] == [torch.float16] * 4 + [torch.float32] * 2


def _store_past_block(lanes_past_n, row_stride, n, block):
    """Stores 1.0 into `lanes_past_n` lanes past N of row 0 and into every
    lane past BLOCK_SIZE (the stride's padding) of every row."""
    def store(out, row_stride_given):
        assert row_stride_given == row_stride
        rows = out[: out.numel() - block].view(-1, row_stride)
        rows[0, n:n + lanes_past_n] = 1.0
        rows[:, block:] = 1.0

    return store


def test_forward_padding_written_counts_the_lanes_of_block_size_past_n(monkeypatch):
    """padding_written counts the stores into lanes N..BLOCK_SIZE (what a store
    without mask=cols < N writes), not the stride's padding past BLOCK_SIZE."""
    case = kernels_judges._forward_case(np.ones((2, 3)), pad=2)  # N 3, BLOCK 4, stride 6
    store = _store_past_block(1, 6, 3, 4)
    result, _ = _launch_on(monkeypatch, "cpu", kernels_probes._launch_forward, case,
                           body=lambda x, y, w, rstd, stride, *a, **k: store(y, stride))
    assert int(result["padding_written"]) == 1


def test_backward_padding_written_counts_the_lanes_of_block_size_past_n(monkeypatch):
    case = kernels_judges._backward_case(np.random.default_rng(0), 3, 3, 2, pad=1)
    store = _store_past_block(1, 5, 3, 4)
    result, _ = _launch_on(monkeypatch, "cpu", kernels_probes._launch_backward, case,
                           body=lambda dx, dy, x, w, rstd, partial, stride, *a, **k:
                           store(dx, stride))
    assert int(result["padding_written"]) == 1


def test_partial_dw_has_room_for_stores_one_row_down(monkeypatch):
    """A kernel that stores a row of PartialDW per row of x, one row down
    (rows 1..M), stays inside the buffer, and every store past the programs'
    rows is counted: M = 3 rows, 2 programs, so rows 2 and 3 (6 numbers)."""
    case = kernels_judges._backward_case(np.random.default_rng(0), 3, 3, 2)

    def one_row_down(dx, dy, x, w, rstd, partial, stride, m, n, rows_per_program,
                     BLOCK_SIZE):
        for row in range(m):
            partial[(row + 1) * n:(row + 2) * n] = 1.0

    result, _ = _launch_on(monkeypatch, "cpu", kernels_probes._launch_backward, case,
                           body=one_row_down)
    assert int(result["partial_overrun"]) == 6
    assert result["partial_dw"][1].tolist() == [1.0, 1.0, 1.0]
    assert result["partial_dw"][0].tolist() == [UNWRITTEN] * 3


# ============================================================ the probes: more refusals

def _store_x(X):
    return None


@needs_interpreter
def test_a_kernel_wrapping_a_nameless_object_is_called_the_kernel():
    wrapped = triton.jit(_store_x)
    wrapped.fn = functools.partial(print)
    assert _refusal(wrapped) == ("the kernel wraps a partial, not a Python function with "
                                 "Triton source")


@needs_interpreter
def test_every_enclosing_variable_is_named():
    kernel = _kernel_from_source(
        "def make(a, b):\n"
        "    @triton.jit\n"
        "    def k(X):\n"
        "        tl.store(X, a + b)\n"
        "    return k\n"
        "k = make(1, 2)\n")
    assert _refusal(kernel) == ("k uses variables of an enclosing function (a, b); define the "
                                "kernel at the top level of a cell")


def test_a_compiled_kernels_source_must_be_its_functions(monkeypatch):
    """The check runs on the compiled kernel itself, not only on its function."""
    from triton.runtime.jit import JITFunction

    source = "@triton.jit\ndef k(X, Y):\n    tl.store(Y, tl.load(X))\n"
    compiled = JITFunction(_kernel_from_source(source).fn)
    compiled._unsafe_update_src(compiled.src.replace("tl.load(X)", "tl.load(X) * 2"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _refusal(compiled) == "the kernel's compiled source is not the source of its function"


@needs_interpreter
def test_the_body_is_still_checked_after_a_helper_or_a_constant():
    helper = _kernel_from_source("@triton.jit\ndef h(X):\n    tl.store(X, 1.0)\n", name="h")
    kernel = _kernel_from_source(
        "@triton.jit\ndef k(X, Y):\n    h(X)\n    y = np.zeros(1)\n    tl.store(Y, y)\n",
        namespace={"h": helper, "np": np})
    assert "the kernel uses `np` (the module numpy), which is not Triton" in _refusal(kernel)
    after_a_constant = _kernel_from_source(
        "@triton.jit\ndef k(X, Y):\n    y = SCALE\n    tl.store(Y, np.zeros(1) * y)\n",
        namespace={"SCALE": 2.0, "np": np})
    assert _refusal(after_a_constant).startswith(
        "in k, line 4: the kernel uses `np` (the module numpy), which is not Triton. ")


@needs_interpreter
def test_tritons_own_jit_functions_count_as_one_call():
    """tl's own @jit functions (sigmoid, imported by name) are Triton: called
    once, they count once, and their bodies are not checked as a student's."""
    from triton.language.standard import sigmoid

    kernel = _kernel_from_source(
        "@triton.jit\ndef k(X, Y):\n    y = sigmoid(X)\n    tl.store(Y, y)\n",
        namespace={"sigmoid": sigmoid})
    assert kernels_probes._check_kernel_function(kernel, set()) == 2


@needs_interpreter
def test_tritons_rewriter_is_tritons_but_a_changed_class_is_not(monkeypatch):
    """An instance of Triton's own class is Triton's, whatever function it holds;
    once its class gains a method from outside Triton, it is not, and a kernel
    naming it is refused (not checked as if it were a kernel)."""
    from triton.runtime.interpreter import FunctionRewriter

    rewriter = FunctionRewriter(_store_x)
    assert kernels_probes._comes_from_triton(rewriter)
    kernel = _kernel_from_source(
        "@triton.jit\ndef k(X, Y):\n    r = rw\n    tl.store(Y, tl.load(X))\n",
        namespace={"rw": rewriter})
    monkeypatch.setattr(FunctionRewriter, "extra", _store_x, raising=False)
    assert _refusal(kernel).startswith(
        "in k, line 3: the kernel uses `rw` (a FunctionRewriter), which is not Triton. ")


def test_a_class_without_a_module_is_not_tritons():
    class NoModule(type):
        @property
        def __module__(cls):
            raise AttributeError("__module__")

    class Hidden(metaclass=NoModule):
        pass

    assert not kernels_probes._class_from_triton(Hidden)
    assert not kernels_probes._comes_from_triton(Hidden())


def test_launch_metadata_must_be_none():
    """launch_metadata and repr are hooks: anything but None is refused, even a
    constant."""
    plain = kernels_probes._plain_jit_options
    assert not plain({"launch_metadata": "x"}) and not plain({"launch_metadata": [1]})
    assert not plain({"repr": "x"})


# ------------------------------------------------------------ judges: more mutation kills

def test_every_cases_weight_has_one_value_per_feature():
    """The kernel loads N weights: every case's gamma is as long as its rows."""
    for name, check in kernels_judges.CHECKS.items():
        for label, case in check.cases(np.random.default_rng(0)):
            if "gamma" in case:
                assert case["gamma"].shape == case["x"].shape[-1:], (name, label)


def test_forward_stride_hint_holds_rows_to_the_inputs_tolerance():
    """A first row right to float32's tolerance (not float64's) still counts as right,
    and two rows are enough for the stride hint."""
    stride = ". Hint: the first row is right and later ones are not: row r starts at "
    rng = np.random.default_rng(0)
    for rows, n, pad in ((6, 256, 3), (2, 1000, 8)):
        case = _fwd_case(rng.normal(1.0, 1.0, (rows, n)), pad=pad)
        rstd, y = kernels_judges._forward_reference(case)
        wrong = y * 2
        wrong[0] = y[0] * (1 + 1e-5)
        assert _judge_y(case, _fwd_out(wrong, rstd)) == _y_problem(case, wrong) + stride + (
            "X + r * row_stride (here rows are padded in memory), not at X + r * N")


def test_forward_stride_hint_needs_later_rows_wrong():
    """y right to float32's tolerance in every row, rstd wrong: the rstd mistake is named,
    not the stride."""
    case = _fwd_case(np.random.default_rng(1).normal(0.0, 0.5, (3, 32)), eps=0.5, pad=2)
    rstd, y = kernels_judges._forward_reference(case)
    hint, saved = kernels_judges._rstd_mistakes(case)[0]
    problem = mismatch(saved, rstd, dtype="float32", what="the saved rstd")
    assert _judge_y_and_rstd(case, _fwd_out(y * (1 + 1e-5), saved)) == (
        problem + ". Hint: the root mean square was saved; rstd is its reciprocal, "
        "1 / sqrt(mean(x**2) + eps)")
    assert hint.startswith("the root mean square was saved")


def test_forward_rstd_mistakes_are_matched_at_float32s_tolerance():
    """The saved rstd is float32: a mistake within float32's tolerance is still named."""
    case = _fwd_case([[1.0, 2.0, 2.0]], eps=0.5)
    hint, saved = kernels_judges._rstd_mistakes(case)[1]
    saved = saved * (1 + 1e-5)
    y = case["x"].astype(float) * saved[:, None]
    assert _judge_y(case, _fwd_out(y, saved)) == _y_problem(case, y) + f". Hint: {hint}"


def test_forward_nan_in_y_alone_gets_the_nan_hint():
    """NaN in y with a right rstd is still NaN read from past the row."""
    case = _fwd_case(np.random.default_rng(2).normal(2.0, 2.0, (3, 100)))
    rstd, y = kernels_judges._forward_reference(case)
    y[0, 5] = np.nan
    assert _judge_y(case, _fwd_out(y, rstd)).endswith(
        ". Hint: NaN came out of NaN going in: the lanes past N of this test's memory hold "
        "NaN (real padding holds anything), so some load read past the row. Load "
        "every row (and w) with mask=cols < N and other=0.0")


def test_forward_float16_overflow_is_judged_row_by_row():
    """The overflow hint is for a row whose own squares add past 65 504: not for rows
    that add past it only together, nor for a row at exactly 65 504; and it is for one
    long row of small numbers."""
    overflow = "the sum of squares overflowed float16"
    together = _fwd_case(np.full((4, 256), 8.0), dtype="float16")  # 16 384 a row
    exact = _fwd_case([[254.0, 30.0, 9.0, 2.0, 1.0, 1.0, 1.0]], dtype="float16")  # 65 504
    assert (exact["x"].astype(float) ** 2).sum() == 65504.0
    for case in (together, exact):
        rstd, y = kernels_judges._forward_reference(case)
        message = _judge_y(case, _fwd_out(y * 1.5, rstd * 1.5))
        assert overflow not in message and "low-precision rounding" in message
    long_row = _fwd_case(np.full((1, 256), 20.0), dtype="float16")  # 102 400, columns 400
    rstd, y = kernels_judges._forward_reference(long_row)
    assert overflow in _judge_y(long_row, _fwd_out(np.zeros_like(y), [0.0]))


def test_forward_float16_overflow_test_has_no_absolute_tolerance():
    """rstd just past float16's rtol (by 5e-9, under numpy's default atol) is off."""
    case = _fwd_case([[300.0] * 4], dtype="float16")
    rstd, y = kernels_judges._forward_reference(case)
    message = _judge_y(case, _fwd_out(y * 1.02, rstd * (1 + 5e-3) + 5e-9))
    assert "the sum of squares overflowed float16" in message


def test_forward_diagnosis_of_an_all_zero_row_raises_no_warning():
    """1 / sqrt(mean(x**2)) of a zero row is inf: the diagnosis computes it silently."""
    case = _fwd_case([[0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0]])
    rstd, y = kernels_judges._forward_reference(case)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        message = _judge_y_and_rstd(case, _fwd_out(y, rstd * 3))
    assert message.startswith("the saved rstd is ")


def test_dx_hints_hold_dx_to_the_inputs_tolerance():
    """float16 dx with a mistake, rounded to float16, still gets the mistake's hint; a
    first row right to float32's tolerance (not float64's) gets the stride hint."""
    rng = np.random.default_rng(3)
    half = kernels_judges._backward_case(rng, 4, 96, 3, dtype="float16")
    hint, wrong = kernels_judges._dx_mistakes(half)[0]
    wrong = wrong.astype(np.float16).astype(np.float64)
    assert _judge_dx(half, _dx_out(wrong)) == _dx_problem(half, wrong) + f". Hint: {hint}"
    padded = kernels_judges._backward_case(rng, 5, 100, 2, pad=3)
    expected = kernels_judges._dx_reference(padded)
    dx = expected * 2
    dx[0] = expected[0] * (1 + 1e-5)
    assert _judge_dx(padded, _dx_out(dx)).endswith(
        "X + r * row_stride (here rows are padded in memory), not at X + r * N")


def test_dx_block_size_mistake_counts_features_not_rows():
    """5 rows of 100 features: the mean over BLOCK_SIZE 128 instead of N is named."""
    case = kernels_judges._backward_case(np.random.default_rng(4), 5, 100, 2)
    hint, wrong = kernels_judges._dx_mistakes(case)[5]
    assert hint == ("a mean over the row divides by N, the number of real features, not by "
                    "BLOCK_SIZE")
    x_hat, g, rstd = kernels_judges._backward_terms(case)
    assert np.allclose(wrong, rstd * (g - x_hat * (g * x_hat).sum(-1, keepdims=True) / 128))
    assert _judge_dx(case, _dx_out(wrong)) == _dx_problem(case, wrong) + f". Hint: {hint}"


# ============================================================ the autograd.Function

def _function_torch(case):
    """y, dx, dW of eager RMSNorm under float64 autograd, for a function case."""
    x = torch.tensor(case["x"], dtype=torch.float64, requires_grad=True)
    w = torch.tensor(case["gamma"], dtype=torch.float64, requires_grad=True)
    y = x * (x.pow(2).mean(-1, keepdim=True) + float(case["eps"])).rsqrt() * w
    y.backward(torch.tensor(case["dy"], dtype=torch.float64))
    return y.detach().numpy(), x.grad.numpy(), w.grad.numpy()


def _function_out(y, dx, dw, forward_calls=1, backward_calls=1, dx_missing=0, dw_missing=0):
    return {"y": y, "dx": dx, "dw": dw, "forward_calls": np.array(forward_calls),
            "backward_calls": np.array(backward_calls),
            "dx_missing": np.array(dx_missing), "dw_missing": np.array(dw_missing)}


FUNCTION_CASES = kernels_judges._function_cases(np.random.default_rng(3))


def test_function_cases_are_what_their_labels_say():
    shapes = [tuple(case["shape"]) for _, case in FUNCTION_CASES]
    assert shapes == [(2, 3, 40), (4, 48), (3, 2, 64), (1, 100)]
    widths = [(int(case["x_width"]), int(case["dy_width"])) for _, case in FUNCTION_CASES]
    assert widths == [(40, 40), (64, 64), (64, 64), (100, 128)]
    assert [str(case["dtype"]) for _, case in FUNCTION_CASES] == [
        "float32", "float32", "float16", "float32"]
    assert float(FUNCTION_CASES[3][1]["eps"]) == 0.1


@pytest.mark.parametrize("index", range(4))
def test_function_reference_is_float64_autograd(index):
    case = FUNCTION_CASES[index][1]
    for ours, torchs in zip(kernels_judges._function_reference(case), _function_torch(case)):
        np.testing.assert_allclose(ours, torchs, rtol=1e-10, atol=1e-12)


def test_function_right_answer_passes_and_a_wrong_dx_fails():
    case = FUNCTION_CASES[0][1]
    y, dx, dw = _function_torch(case)
    assert kernels_judges._judge_function(case, _function_out(y, dx, dw)) is None
    problem = kernels_judges._judge_function(case, _function_out(y, dx * 1.1, dw))
    assert problem.startswith("x.grad") and "what backward hands launch_rms_backward" in problem
    problem = kernels_judges._judge_function(case, _function_out(y * 1.1, dx, dw))
    assert problem.startswith("y") and "how forward turns x into rows of N" in problem
    assert kernels_judges._judge_function(case, _function_out(y, dx, dw * 1.1)).startswith(
        "weight.grad")


def test_function_without_the_launchers_is_named():
    case = FUNCTION_CASES[0][1]
    y, dx, dw = _function_torch(case)
    problem = kernels_judges._judge_function(case, _function_out(y, dx, dw, forward_calls=0))
    assert problem.startswith("the launchers were not called (launch_rms_forward: 0 calls, "
                              "launch_rms_backward: 1)")
    assert kernels_judges._judge_function(
        case, _function_out(y, dx, dw, backward_calls=0)) is not None


def test_function_missing_gradients_are_named():
    case = FUNCTION_CASES[1][1]
    y, dx, dw = _function_torch(case)
    problem = kernels_judges._judge_function(case, _function_out(y, dx, dw, dw_missing=1))
    assert problem == ("weight.grad stayed None: backward returns one gradient per input of "
                       "forward, in order: dx (shaped like x), dW, and None for eps")
    problem = kernels_judges._judge_function(case, _function_out(y, dx, dw, dx_missing=1,
                                                                 dw_missing=1))
    assert problem.startswith("x.grad and weight.grad stayed None")


def test_function_probe_refuses_what_is_not_a_function_class():
    with pytest.raises(TypeError, match="subclass of torch.autograd.Function"):
        kernels_probes._call_function(lambda x, w, eps: x, FUNCTION_CASES[0][1])


def test_function_that_recomputes_rstd_is_named():
    """Save rstd, do not recompute it: an rstd that is not the forward launcher's, or a
    second forward launch, loses the Function's points with the reason."""
    case = FUNCTION_CASES[0][1]
    y, dx, dw = _function_torch(case)
    right = _function_out(y, dx, dw)
    assert kernels_judges._judge_function(case, {**right, "rstd_not_saved": np.array(0)}) is None
    for wrong in ({**right, "rstd_not_saved": np.array(1)},
                  {**right, "forward_calls": np.array(2)}):
        problem = kernels_judges._judge_function(case, wrong)
        assert problem.startswith("backward recomputes rstd") and "save_for_backward" in problem


def _rms_function(recompute_rstd):
    """An RMSNormFunction that saves rstd, or recomputes it in backward. It calls the
    launchers by their names in this module, where the probe puts its stand-ins."""

    class RMSNormFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, eps=1e-5):
            rows = x.reshape(-1, x.shape[-1]).contiguous()
            y, rstd = launch_rms_forward(rows, weight, eps)  # noqa: F821
            ctx.save_for_backward(rows, weight, rstd)
            ctx.eps = eps
            return y.reshape(x.shape)

        @staticmethod
        def backward(ctx, dy):
            rows, weight, rstd = ctx.saved_tensors
            if recompute_rstd:
                rstd = rows.float().pow(2).mean(-1).add(ctx.eps).rsqrt()
            dx, dw = launch_rms_backward(  # noqa: F821
                dy.reshape(rows.shape).contiguous(), rows, weight, rstd)
            return dx.reshape(dy.shape), dw, None

    return RMSNormFunction


@pytest.mark.parametrize("recompute", [False, True])
def test_function_probe_sees_a_recomputed_rstd(recompute):
    """The probe's stand-ins tell the forward's rstd from one backward made itself."""
    output = kernels_probes._call_function(_rms_function(recompute), FUNCTION_CASES[0][1])
    assert int(output["rstd_not_saved"]) == int(recompute)
    assert int(output["forward_calls"]) == 1
    assert "launch_rms_forward" not in globals()  # the stand-ins are gone again


@pytest.mark.parametrize("answer, words", [
    ("0.719", None), ("0.7190538", None), ("0.72", None), ("71.9", "not a percentage"),
    ("0.308", "the lesson's count"), ("0.513", "cross memory twice"),
    ("0.924", "count it once"), ("0.3353", "one program per row"),
    ("0.6697", "10**9 bytes"), ("0.5", "Add up the bytes"), ("None", "give one number"),
])
def test_fraction_of_peak_answers(answer, words):
    """Liger-Kernel 0.2.1's backward at M = 2048, N = 16384: x, dy, dx in bfloat16
    (6 bytes a number), the (M, N) float32 rows of dW written and read back (8), the
    M rstd and w and dW (N float32 each); in 0.3205 ms that is 1.466e12 B/s, 0.719 of
    2.039e12."""
    m, n = 2048, 16384
    moved = 14 * m * n + 4 * m + 8 * n
    assert kernels_judges.liger_021_backward_bytes(m, n) == moved
    assert abs(kernels_judges._true_fraction_of_peak()
               - moved / 0.3205e-3 / 2.039e12) < 1e-12
    got = kernels_judges._judge_fraction_of_peak({}, {"answer": np.array(answer)})
    assert (got is None) if words is None else (words in got), got


@pytest.mark.parametrize("answer, words", [
    ("0.857", None), ("0.8574", None), ("0.85734", None),  # 36 bytes a number, rows left out
    ("0.905", None), ("0.9051", None),  # 38: the benchmark script's float32 weight
    ("0.88", "Count the eight kernels"),  # between the two counts, off both by over 2%
    ("0.9856", "Liger-Kernel's benchmark measured"), ("0.5925", "datasheet's peak"),
    ("0.2127", "this question's shape"), ("0.000857", "not seconds"),
    ("857.4", "not microseconds"), ("0.5", "Count the eight kernels"),
])
def test_eager_time_prediction_answers(answer, words):
    """The eight kernels move 36 bytes per number of x (plus per-row and per-feature
    terms), the fused kernel 4: 9.0 times the fused time."""
    truth = kernels_judges._true_eager_ms()
    m, n = 2048, 16384
    assert kernels_judges.llama_rms_norm_bytes(m, n) == 36 * m * n + 24 * m + 2 * n
    assert kernels_judges.llama_rms_norm_bytes(m, n, 4) == 38 * m * n + 24 * m + 4 * n
    assert abs(truth - 0.09526 * (36 * m * n + 24 * m + 2 * n) / (4 * m * n)) < 1e-12
    got = kernels_judges._judge_eager_prediction({}, {"answer": np.array(answer)})
    assert (got is None) if words is None else (words in got), got


def test_dx_judge_names_a_program_that_ran_past_the_last_row():
    """dx right, but rows stored past row M - 1 (the spare NaN rows): the clamp hint."""
    dx = kernels_judges._dx_reference(BWD)
    output = {**_dx_out(dx), "rows_past_m_written": np.array(7)}
    problem = _judge_dx(BWD, output)
    assert problem.startswith("dx is right, but the kernel also stored 7 numbers past the "
                              "last row of x")
    assert problem.endswith("tl.minimum(first + rows_per_program, M)")
