"""Unit 01's checks (normref/checks/recipe_probes.py and recipe_judges.py): the
cases a student is judged on, the verdicts and the hints of their messages.

Each test fails on a small bug in one of those two modules (`make mutation`).
Right answers come from torch or from float64 formulas written here; wrong
answers are the mistakes students make (the d - 1 variance, eps outside the
root, eps ignored, the wrong axis, the shortcut variance, ...).
"""

import contextlib
import io
import math
import re
import socket
import statistics
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from check_calls import fails, passes

from normref.checks import (
    CheckFailed,
    _wire,
    check_breaking_offset,
    check_chunked_var,
    check_chunked_var_merges,
    check_layer_norm_batches,
    check_layer_norm_token,
    check_s_for_half_output,
    check_token_mean,
    check_token_var,
    recipe_judges,
    recipe_probes,
)
from normref.checks.recipe_judges import (
    FLOAT32_CAST_HINT,
    _batch_cases,
    _close_enough_in_float32,
    _far_from_zero,
    _judge_breaking_offset,
    _judge_layer_norm,
    _judge_mean,
    _judge_s_for_half_output,
    _judge_safe_spread,
    _judge_spacing_estimate,
    _judge_spread_gap_reason,
    _judge_var,
    _likely_layer_norm_mistake,
    _mean_cases,
    _offset_tokens,
    _token_cases,
    _var_cases,
)


def _rng():
    return np.random.default_rng(0)


def _cases(make):
    return dict(make(_rng()))




# ---------------------------------------------------------------- right answers, by torch


def torch_mean(x):
    return torch.from_numpy(np.asarray(x)).double().mean(-1).numpy()


def torch_var(x):
    """The biased variance, computed by hand on torch tensors (no library variance)."""
    t = torch.from_numpy(np.asarray(x)).double()
    return ((t - t.mean(-1, keepdim=True)) ** 2).mean(-1).numpy()


def torch_layer_norm(x, gamma, beta, eps=1e-5):
    d = x.shape[-1]
    return F.layer_norm(torch.from_numpy(x).double(), (d,), torch.from_numpy(gamma).double(),
                        torch.from_numpy(beta).double(), eps=eps).numpy()


def ln(x, gamma, beta, eps, *, var=None, eps_outside=False, axis=-1):
    """A numpy layer norm with the switches of typical mistakes."""
    x = np.asarray(x, dtype=np.float64)
    mu = x.mean(axis, keepdims=True)
    v = x.var(axis, keepdims=True) if var is None else var(x)
    spread = np.sqrt(v) + eps if eps_outside else np.sqrt(v + eps)
    return gamma * (x - mu) / spread + beta


def test_right_answers_pass_every_check():
    """A check whose name is misspelt, or whose probe calls the student's code
    wrongly, fails right answers."""
    assert "token_mean: all 7 cases passed" in passes(check_token_mean, torch_mean)
    assert "token_var: all 7 cases passed" in passes(check_token_var, torch_var)
    assert "layer_norm_token: all 10 cases passed" in passes(check_layer_norm_token,
                                                             torch_layer_norm)
    assert "layer_norm_batches: all 6 cases passed" in passes(check_layer_norm_batches,
                                                               torch_layer_norm)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        check_breaking_offset(1e8)
        check_s_for_half_output(4 * np.sqrt(1e-5) / 3)
    assert "recipe_breaking_offset: all 1 cases passed" in out.getvalue()
    assert "recipe_s_for_half_output: all 1 cases passed" in out.getvalue()


def test_the_probe_gives_the_student_copies_and_eps_as_a_float():
    """A probe that hands over the case's own arrays lets a student's in-place
    edit change what the judge compares with; eps must arrive as a Python float."""
    seen = []

    def in_place(x, gamma, beta, eps=1e-5):
        seen.append(type(eps))
        y = torch_layer_norm(x, gamma, beta, eps)
        x[...] = 0.0
        gamma[...] = 0.0
        beta[...] = 0.0
        return y

    passes(check_layer_norm_token, in_place)
    assert set(seen) == {float}

    def mean_in_place(x):
        y = torch_mean(x)
        x[...] = 0.0
        return y

    passes(check_token_mean, mean_in_place)


# ---------------------------------------------------------------- the cases, as labelled


def _shape_in_label(label):
    found = re.search(r"\((\d+(?:, \d+)*)\)", label)
    return tuple(int(n) for n in found.group(1).split(", ")) if found else None


@pytest.mark.parametrize("make", [_mean_cases, _var_cases, _token_cases, _batch_cases])
def test_every_label_names_its_shape(make):
    """The student reads the label: a case whose data is not the shape it names
    (a batch of 5 tokens made as 6) misleads them."""
    for label, case in make(_rng()):
        x = case["x"]
        shape = _shape_in_label(label)
        if shape is not None:
            assert x.shape == shape, label
        tokens = re.search(r"(?:of|batch of) (\d+) tokens", label)
        if tokens:
            assert x.shape[0] == int(tokens.group(1)), label
        d = re.search(r"d = (\d+)|(\d+) features", label)
        if d:
            assert x.shape[-1] == int(d.group(1) or d.group(2)), label
        if "float32" in label:
            assert x.dtype == np.float32, label
        else:
            assert x.dtype == np.float64, label


def test_the_worked_examples_and_constants_are_the_labelled_values():
    """Hand-written values of the labels: x = [2, 4, 6, 8], a constant token of 5s."""
    mean_cases, var_cases = _cases(_mean_cases), _cases(_var_cases)
    token_cases = _cases(_token_cases)
    for cases in (mean_cases, var_cases):
        np.testing.assert_array_equal(cases["x = [2, 4, 6, 8]"]["x"], [2.0, 4.0, 6.0, 8.0])
        np.testing.assert_array_equal(cases["a constant token [5, 5, 5, 5]"]["x"], [5.0] * 4)
    plain = token_cases["x = [2, 4, 6, 8]"]
    np.testing.assert_array_equal(plain["x"], [2.0, 4.0, 6.0, 8.0])
    np.testing.assert_array_equal(plain["gamma"], np.ones(4))
    np.testing.assert_array_equal(plain["beta"], np.zeros(4))
    assert float(plain["eps"]) == 1e-5
    z = token_cases["z = [2, 6, 4, 12] with gamma = 2, beta = 1"]
    np.testing.assert_array_equal(z["x"], [2.0, 6.0, 4.0, 12.0])
    np.testing.assert_array_equal(z["gamma"], [2.0] * 4)
    np.testing.assert_array_equal(z["beta"], [1.0] * 4)
    np.testing.assert_array_equal(token_cases["x = [0, 3]"]["x"], [0.0, 3.0])
    constant = token_cases["a constant token [5, 5, 5, 5] with beta = 0.5"]
    np.testing.assert_array_equal(constant["x"], [5.0] * 4)
    np.testing.assert_array_equal(constant["beta"], [0.5] * 4)
    np.testing.assert_array_equal(constant["gamma"], np.ones(4))
    np.testing.assert_allclose(token_cases["a tiny spread, 0.001 * [2, 4, 6, 8]"]["x"],
                               [0.002, 0.004, 0.006, 0.008])
    with_eps = token_cases["x = [2, 4, 6, 8] with eps = 1"]
    np.testing.assert_array_equal(with_eps["x"], [2.0, 4.0, 6.0, 8.0])
    assert float(with_eps["eps"]) == 1.0
    batch = _cases(_batch_cases)
    np.testing.assert_array_equal(batch["a batch of 2 tokens, d = 2"]["x"],
                                  [[0.0, 3.0], [10.0, -10.0]])
    held = batch["a 4-D batch (2, 2, 3, 8) holding one constant token"]
    np.testing.assert_array_equal(held["x"][1, 0, 2], np.full(8, 7.0))
    assert np.all(held["x"].std(-1).ravel()[np.arange(12) != 8] > 0)
    np.testing.assert_array_equal(held["beta"], np.full(8, 0.25))


def test_gamma_beta_and_eps_have_the_tokens_dtype_and_the_default_eps():
    """float32 tokens come with float32 gamma and beta (a float64 gamma would
    promote a float32 answer); eps is 1e-5 unless the label says otherwise."""
    for make in (_token_cases, _batch_cases):
        for label, case in make(_rng()):
            d = case["x"].shape[-1]
            assert case["gamma"].dtype == case["x"].dtype == case["beta"].dtype, label
            assert case["gamma"].shape == case["beta"].shape == (d,), label
            if "eps" not in label:
                assert float(case["eps"]) == 1e-5, label
            if "gamma" not in label:
                np.testing.assert_array_equal(case["gamma"], np.ones(d))
            if "beta" not in label and "constant token" not in label:
                np.testing.assert_array_equal(case["beta"], np.zeros(d))
            if "random gamma and beta" in label:
                assert np.all(case["gamma"] != 1) and np.all(case["beta"] != 0), label


def test_the_far_cases_sit_where_the_labels_say():
    """The offset cases are what makes the shortcut fail: tokens around 10 000,
    1e8 and 1e6 with a spread of about 1."""
    var_cases = _cases(_var_cases)
    for label, offset in (("float32 tokens around 10 000 with spread 1, (4, 64)", 1e4),
                          ("float64 tokens around 1e8 with spread 1, (3, 32)", 1e8)):
        x = var_cases[label]["x"].astype(np.float64)
        np.testing.assert_allclose(x.mean(-1), offset, rtol=0, atol=0.5)
        assert np.all((0.5 < x.std(-1)) & (x.std(-1) < 2)), label
    x = _cases(_batch_cases)["tokens around 1e6 with spread 1, (5, 32)"]["x"]
    np.testing.assert_allclose(x.mean(-1), 1e6, rtol=0, atol=0.6)
    assert np.all((0.5 < x.std(-1)) & (x.std(-1) < 2))


def _about(x, mean, std):
    """Sample mean within 0.5 and spread within 15 % of what the case was made with."""
    return abs(x.mean() - mean) < 0.5 and abs(x.std() / std - 1) < 0.15


def test_the_random_cases_are_spread_as_made():
    """The random batches are not all standard normal: some sit at a mean of 1,
    2 or 3 with a spread of 2, 3 or 4 (code that only works near 0 with unit
    spread must meet them); the others are standard normal."""
    mean_cases, var_cases = _cases(_mean_cases), _cases(_var_cases)
    token_cases, batch = _cases(_token_cases), _cases(_batch_cases)
    assert _about(mean_cases["a 3-D batch (2, 3, 16)"]["x"], 2.0, 3.0)
    assert _about(var_cases["a 4-D batch (2, 2, 3, 8)"]["x"], 2.0, 3.0)
    assert _about(token_cases["a float32 token of 64 features"]["x"], 3.0, 2.0)
    assert _about(batch["a 3-D batch (2, 3, 16) with random gamma and beta"]["x"], 1.0, 4.0)
    standard = [mean_cases["a batch of 5 tokens, d = 8"], mean_cases["a 4-D batch (2, 2, 3, 8)"],
                mean_cases["a float32 batch (4, 64)"], var_cases["a batch of 5 tokens, d = 8"],
                batch["a batch of 4 tokens, d = 8"], batch["a float32 batch (6, 32)"]]
    for case in standard:
        assert abs(case["x"].mean()) < 0.5 and abs(case["x"].std() - 1) < 0.25
    x = token_cases["a token of 16 features with random gamma and beta"]
    assert abs(x["x"].mean()) < 1.0 and 0.5 < x["x"].std() < 1.6


# ---------------------------------------------------------------- token_mean


def test_mean_wrong_axis_on_a_batch_is_told_to_average_the_last_axis():
    """The first-axis mean of a batch: the shape differs and the hint names the axis."""
    message = fails(check_token_mean, lambda x: np.mean(x, axis=0))
    assert "a batch of 5 tokens, d = 8" in message
    assert "has shape (8,); expected shape (5,)" in message
    assert message.endswith(": average over the last axis (the features of each token)")


def test_mean_hint_only_for_a_batch_with_the_wrong_shape():
    """Right shape but wrong values (an off-by-one mean), or a single token
    given the wrong shape, get the plain difference, no axis hint."""
    cases = _cases(_mean_cases)
    batch = cases["a batch of 5 tokens, d = 8"]
    wrong = _judge_mean(batch, {"y": batch["x"].sum(-1) / 7})
    assert "expected" in wrong and "last axis" not in wrong
    token = cases["x = [2, 4, 6, 8]"]
    wrong = _judge_mean(token, {"y": np.array([5.0])})
    assert "has shape (1,)" in wrong and "last axis" not in wrong
    assert _judge_mean(token, {"y": np.array(5.0)}) is None


def test_a_float32_mean_is_held_to_float32_accuracy():
    """A float32 token_mean is judged with float32's tolerance, not float64's."""
    x = _cases(_mean_cases)["a float32 batch (4, 64)"]
    y = x["x"].mean(-1, dtype=np.float32) * np.float32(1 + 3e-6)
    assert _judge_mean(x, {"y": y}) is None


# ---------------------------------------------------------------- token_var


def test_the_unbiased_variance_is_told_to_divide_by_d():
    message = fails(check_token_var, lambda x: torch_var(x) * x.shape[-1] / (x.shape[-1] - 1))
    assert message.startswith("token_var, x = [2, 4, 6, 8]: your result is [6.6667]")
    assert message.endswith(". The variance divides by d, not d - 1 (np.var's default, ddof=0)")


def test_the_standard_deviation_is_named():
    message = fails(check_token_var, lambda x: np.sqrt(torch_var(x)))
    assert message.endswith(". That is the standard deviation; the variance is its square")


def test_the_variance_over_the_wrong_axis_is_named():
    message = fails(check_token_var, lambda x: torch_var(np.swapaxes(x, 0, -1)))
    assert "a batch of 5 tokens, d = 8" in message
    assert message.endswith(". Take the variance over the last axis (each token's features)")


def test_a_variance_that_is_simply_wrong_gets_no_hint():
    """Half the variance near zero: neither d - 1, the std, the axis nor the shortcut."""
    message = fails(check_token_var, lambda x: torch_var(x) / 2)
    assert message == ("token_var, x = [2, 4, 6, 8]: your result is [2.5]; expected [5.] "
                       "(largest difference 2.5, tolerance rtol=1e-06, atol=1e-08)")


def _shortcut(x):
    return (x * x).mean(-1) - x.mean(-1) ** 2


@pytest.mark.parametrize("label", ["float32 tokens around 10 000 with spread 1, (4, 64)",
                                   "float64 tokens around 1e8 with spread 1, (3, 32)"])
@pytest.mark.parametrize("in_float64", [False, True])
def test_the_shortcut_is_named_in_its_own_dtype_and_in_float64(label, in_float64):
    """The shortcut in the token's dtype, or in float64, is recognized; at 1e4
    the float64 shortcut is right, so it passes there."""
    case = _cases(_var_cases)[label]
    x = case["x"].astype(np.float64) if in_float64 else case["x"]
    with np.errstate(all="ignore"):
        y = _shortcut(x)
    verdict = _judge_var(case, {"y": y, "library_variance": np.array(False)})
    if in_float64 and "10 000" in label:
        assert verdict is None
    else:
        assert verdict.endswith("which cancels when the mean is large next to the spread: "
                                "square deviations from a centre inside the data instead")


def test_far_from_zero_any_wrong_variance_is_pointed_at_the_shortcut():
    """A variance wrong in some other way at a large offset still gets the shortcut hint."""
    case = _cases(_var_cases)["float64 tokens around 1e8 with spread 1, (3, 32)"]
    verdict = _judge_var(case, {"y": torch_var(case["x"]) * 1.5,
                                "library_variance": np.array(False)})
    assert "This looks like the shortcut" in verdict
    near = _cases(_var_cases)["a batch of 5 tokens, d = 8"]
    verdict = _judge_var(near, {"y": torch_var(near["x"]) * 1.5,
                                "library_variance": np.array(False)})
    assert "shortcut" not in verdict and "expected" in verdict


def test_the_variance_judge_reads_the_values_alone():
    """Judged on its values when no library-variance flag came with them; a
    flag set refuses even right values."""
    case = _cases(_var_cases)["a batch of 5 tokens, d = 8"]
    right = torch_var(case["x"])
    assert _judge_var(case, {"y": right}) is None
    assert _judge_var(case, {"y": right, "library_variance": np.array(False)}) is None
    refused = _judge_var(case, {"y": right, "library_variance": np.array(True)})
    assert refused.startswith("your token_var called a library variance (np.var, np.std")
    assert refused.endswith(": compute it yourself")


def welford_float32(x):
    x = np.asarray(x)
    mean = np.zeros(x.shape[:-1], x.dtype)
    m2 = np.zeros(x.shape[:-1], x.dtype)
    for k in range(x.shape[-1]):
        delta = x[..., k] - mean
        mean = mean + delta / x.dtype.type(k + 1)
        m2 = m2 + delta * (x[..., k] - mean)
    return m2 / x.dtype.type(x.shape[-1])


def test_a_stable_float32_method_is_accepted_far_from_zero():
    """Welford's method in float32 at 10 000 misses by parts in a thousand: accepted
    there (rtol 1e-2), and only there."""
    case = _cases(_var_cases)["float32 tokens around 10 000 with spread 1, (4, 64)"]
    truth = np.array([statistics.pvariance(row.tolist()) for row in case["x"]])
    y = welford_float32(case["x"])
    assert _judge_var(case, {"y": y, "library_variance": np.array(False)}) is None
    assert _close_enough_in_float32(case["x"], truth * (1 + 9e-3), truth)
    assert not _close_enough_in_float32(case["x"], truth * (1 + 2e-2), truth)
    assert not _close_enough_in_float32(case["x"], truth + 0.5, truth)
    assert not _close_enough_in_float32(case["x"], truth[:3], truth)
    assert not _close_enough_in_float32(case["x"], np.array(["1"] * 4), truth)
    far64 = case["x"].astype(np.float64)
    assert not _close_enough_in_float32(far64, truth * (1 + 9e-4), truth)
    near = _cases(_var_cases)["a batch of 5 tokens, d = 8"]["x"].astype(np.float32)
    near_truth = torch_var(near)
    assert not _close_enough_in_float32(near, near_truth * (1 + 9e-4), near_truth)


def test_welford_in_float32_earns_the_point_whatever_the_students_cases():
    """Each student's cases are drawn from their own seed: a correct float32 Welford
    missed one student's draw by 1.02e-3 and lost 3 points that another student's
    identical code kept. Dividing by d - 1 is still refused on every draw."""
    for seed in range(300):
        x = _offset_tokens(np.random.default_rng(seed), 1e4, (4, 64), np.float32)
        case = {"x": x}
        assert _judge_var(case, {"y": welford_float32(x),
                                 "library_variance": np.array(False)}) is None, seed
        unbiased = welford_float32(x) * np.float32(64 / 63)
        assert _judge_var(case, {"y": unbiased, "library_variance": np.array(False)}), seed


def test_a_float32_variance_far_from_zero_that_is_text_is_refused_not_crashed():
    case = _cases(_var_cases)["float32 tokens around 10 000 with spread 1, (4, 64)"]
    verdict = _judge_var(case, {"y": np.array(["1.0"] * 4), "library_variance": np.array(False)})
    assert "not numbers" in verdict


def test_far_from_zero_is_the_mean_against_1000_spreads_per_token():
    """Far means |mean| > 1000 * std for every token, each token on its own."""
    assert _far_from_zero(np.array([10000.0 - 1, 10000.0 + 1]))
    assert _far_from_zero(np.array([-10000.0 - 1, -10000.0 + 1]))
    assert _far_from_zero(np.array([1000.5 - 1, 1000.5 + 1]))
    assert not _far_from_zero(np.array([999.5 - 1, 999.5 + 1]))
    assert _far_from_zero(np.array([1500.0 - 1, 1500.0 + 1]))
    assert _far_from_zero(np.full(4, 5.0))  # no spread at all
    assert not _far_from_zero(np.zeros(4))
    rows = np.array([[1e4 - 1, 1e4 + 1], [2e4 - 1, 2e4 + 1], [3e4 - 1, 3e4 + 1]])
    assert _far_from_zero(rows)
    assert _far_from_zero(rows.astype(np.float32))
    assert not _far_from_zero(np.array([[1e4 - 1, 1e4 + 1], [0.0, 1.0]]))


# ---------------------------------------------------------------- library variance


@contextlib.contextmanager
def _profiler_before():
    calls = []

    def previous(frame, event, arg):
        calls.append(event)

    sys.setprofile(previous)
    try:
        yield previous
    finally:
        sys.setprofile(None)


def test_the_profiler_in_place_before_the_check_is_put_back():
    """A tool's own profiler (coverage, a debugger) is restored after the check."""
    with _profiler_before() as previous:
        passes(check_token_var, torch_var)
        assert sys.getprofile() is previous


def test_an_own_helper_named_like_a_library_variance_is_not_one():
    """A helper of the student's called variance (or in a folder named statistics)
    is their own code, not the statistics module's."""
    code = compile("def variance(row):\n"
                   "    m = sum(row) / len(row)\n"
                   "    return sum((v - m) ** 2 for v in row) / len(row)\n",
                   "/home/jovyan/statistics/helpers.py", "exec")
    scope = {}
    exec(code, scope)

    def token_var(x):
        rows = np.reshape(x, (-1, x.shape[-1])).astype(np.float64)
        return np.array([scope["variance"](row.tolist()) for row in rows]).reshape(
            x.shape[:-1])

    assert "all 7 cases passed" in passes(check_token_var, token_var)


def test_code_made_by_exec_is_watched_without_failing():
    """A function compiled from a string has no path in its file name ("<string>")."""
    scope = {}
    exec("def token_var(x):\n"
         "    c = x - x.mean(-1, keepdims=True)\n"
         "    return (c * c).mean(-1)\n", scope)
    assert "all 7 cases passed" in passes(check_token_var, scope["token_var"])
    exec("import numpy as np\n"
         "def token_var(x):\n"
         "    return np.var(x, axis=-1)\n", scope)
    assert "library variance" in fails(check_token_var, scope["token_var"])


def test_the_probe_reports_a_library_variance_and_a_replaced_profiler():
    x = {"x": np.arange(8.0).reshape(2, 4)}
    assert not recipe_probes._call_var_watched(torch_var, x)["library_variance"]
    assert recipe_probes._call_var_watched(lambda v: np.var(v, -1), x)["library_variance"]
    assert recipe_probes._call_var_watched(lambda v: v.std(-1) ** 2, x)["library_variance"]

    def replaces(v):
        sys.setprofile(None)
        return torch_var(v)

    assert recipe_probes._call_var_watched(replaces, x)["library_variance"]
    y = recipe_probes._call_var_watched(torch_var, x)["y"]
    np.testing.assert_allclose(y, [1.25, 1.25])


# ---------------------------------------------------------------- layer norm


def eps_ignored(x, gamma, beta, eps):
    """A layer_norm that always uses 1e-5, whatever eps it is given."""
    return ln(x, gamma, beta, 1e-5)


def test_a_layer_norm_that_ignores_eps_fails_on_the_eps_1_case():
    """The eps = 1 case is the one that catches eps left at its default: without
    it every other token case would pass."""
    message = fails(check_layer_norm_token, eps_ignored)
    assert message.startswith("layer_norm_token, x = [2, 4, 6, 8] with eps = 1: ")
    cases = _token_cases(_rng())
    failing = [label for label, case in cases
               if _judge_layer_norm(case, {"y": eps_ignored(case["x"], case["gamma"],
                                                            case["beta"], float(case["eps"]))})]
    assert failing == ["x = [2, 4, 6, 8] with eps = 1"]


@pytest.mark.parametrize("label", [label for label, _ in _token_cases(_rng())]
                         + [label for label, _ in _batch_cases(_rng())])
def test_torch_passes_every_layer_norm_case(label):
    case = {**_cases(_token_cases), **_cases(_batch_cases)}[label]
    y = torch_layer_norm(case["x"], case["gamma"], case["beta"], float(case["eps"]))
    assert _judge_layer_norm(case, {"y": y}) is None


MISTAKES = {
    "d - 1": (lambda x, g, b, eps: ln(x, g, b, eps, var=lambda v: v.var(-1, ddof=1,
                                                                         keepdims=True)),
              "the variance divides by d, not d - 1"),
    "eps outside": (lambda x, g, b, eps: ln(x, g, b, eps, eps_outside=True),
                    "eps goes inside the square root: (x - mu) / sqrt(var + eps). Your "
                    "output matches (x - mu) / (std + eps), which some code writes: close to "
                    "layer norm for a wide spread but not within the tolerance here, and far "
                    "off once the spread nears sqrt(eps)"),
    "eps argument ignored": (lambda x, g, b, eps: ln(x, g, b, 1e-5),
                             "the eps argument is ignored (a fixed 1e-5 used): add the eps "
                             "you are given to the variance"),
    "no eps": (lambda x, g, b, eps: ln(x, g, b, 0.0),
               "eps is missing: add it to the variance before the square root"),
    "swapped": (lambda x, g, b, eps: ln(x, b, g, eps),
                "gamma scales and beta shifts, in that order: gamma * x_hat + beta"),
    "affine first": (lambda x, g, b, eps: ln(g * x + b, 1.0, 0.0, eps),
                     "gamma and beta are applied after normalizing, not before"),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # no eps on a constant token: 0 / 0
def test_each_layer_norm_mistake_is_named(mistake):
    """Each mistake is named on a case that shows it, with the message's parts."""
    student, hint = MISTAKES[mistake]
    message = fails(check_layer_norm_token, student)
    assert message.endswith(f". Hint: {hint}"), message
    assert "expected" in message


@pytest.mark.parametrize("label", [label for label, _ in _token_cases(_rng())]
                         + [label for label, _ in _batch_cases(_rng())])
def test_the_eps_outside_hint_is_true_wherever_it_fires(label):
    """(x - mu) / (std + eps), as the Annotated Transformer writes it, fails a case
    only with the eps hint, and what the hint says holds there: the output is off
    by more than the tolerance, and by more than 10% where a token's spread is
    within 3 * sqrt(eps); on wide tokens (spread 1 or more) it is off by under 1e-4."""
    case = {**_cases(_token_cases), **_cases(_batch_cases)}[label]
    x, g, b, eps = case["x"], case["gamma"], case["beta"], float(case["eps"])
    y = MISTAKES["eps outside"][0](x, g, b, eps)
    right = torch_layer_norm(x, g, b, eps)
    std = x.astype(np.float64).std(-1)
    gap = np.abs(y - right).max(-1) / np.maximum(np.abs(right).max(-1), 1e-12)  # per token
    assert np.all(gap[(std >= 1) & (eps <= 1e-5)] < 1e-4)  # "close for a wide spread"
    verdict = _judge_layer_norm(case, {"y": y})
    near = (std > 0) & (std <= 3 * np.sqrt(eps))
    if near.any():
        assert np.all(gap[near] > 0.1) and verdict is not None  # "far off"
    if verdict is not None:
        assert verdict.endswith(". Hint: " + MISTAKES["eps outside"][1]), verdict


@pytest.mark.parametrize("label", [label for label, _ in _token_cases(_rng())])
def test_the_d_minus_1_hint_on_every_token_case(label):
    """Including the 2-feature token, where d - 1 = 1."""
    case = _cases(_token_cases)[label]
    x, g, b, eps = case["x"], case["gamma"], case["beta"], float(case["eps"])
    y = MISTAKES["d - 1"][0](x, g, b, eps)
    if not np.allclose(y, torch_layer_norm(x, g, b, eps), rtol=1e-4, atol=1e-4):
        assert _likely_layer_norm_mistake(case, y) == "the variance divides by d, not d - 1"


def test_the_shortcut_variance_in_layer_norm_is_named_at_a_large_offset():
    case = _cases(_batch_cases)["tokens around 1e6 with spread 1, (5, 32)"]
    x, g, b, eps = case["x"], case["gamma"], case["beta"], float(case["eps"])
    with np.errstate(all="ignore"):
        y = ln(x, g, b, eps, var=lambda v: np.maximum(_shortcut(v)[..., None], 0))
    message = _judge_layer_norm(case, {"y": y})
    assert message.endswith(". Hint: the shortcut mean(x**2) - mean(x)**2 cancels at a large "
                            "offset: use a variance that survives it (your token_var)")


def test_a_float32_computation_at_a_large_offset_gets_the_float32_hint():
    """float64 tokens around 1e6 computed in float32 (and cast back): the hint names
    the cast, not the shortcut, though no candidate reproduces the float32 numbers."""
    case = _cases(_batch_cases)["tokens around 1e6 with spread 1, (5, 32)"]
    x = case["x"].astype(np.float32)
    y = ln(x, case["gamma"], case["beta"], 1e-5,
           var=lambda v: ((v - v.mean(-1, keepdims=True)) ** 2).mean(-1, keepdims=True))
    for answer in (y, y.astype(np.float64), y.astype(np.float64) * 1.001):
        message = _judge_layer_norm(case, {"y": answer})
        assert message.endswith(". Hint: " + FLOAT32_CAST_HINT)


def test_an_unexplained_error_at_a_large_offset_gets_the_large_offset_hint():
    """A float64 answer around 1e6 off by 3e-4, far less than float32 would miss by
    (about 0.09) and matching no candidate: the judge still says where to look."""
    case = _cases(_batch_cases)["tokens around 1e6 with spread 1, (5, 32)"]
    y = torch_layer_norm(case["x"], case["gamma"], case["beta"], 1e-5) * (1 + 3e-4)
    message = _judge_layer_norm(case, {"y": y})
    assert message.endswith(". Hint: at a large offset the variance must not come from the "
                            "shortcut mean(x**2) - mean(x)**2: use your token_var")


def test_a_wrong_answer_no_mistake_explains_gets_no_hint():
    """Twice the right answer, near zero: the message has no Hint, not 'Hint: None'."""
    case = _cases(_token_cases)["x = [2, 4, 6, 8]"]
    y = 2 * torch_layer_norm(case["x"], case["gamma"], case["beta"], float(case["eps"]))
    message = _judge_layer_norm(case, {"y": y})
    assert "Hint" not in message and message.startswith("your result is")
    assert _likely_layer_norm_mistake(case, y) is None


def test_a_wrongly_shaped_answer_gets_the_shape_and_no_hint():
    case = _cases(_token_cases)["x = [2, 4, 6, 8]"]
    assert _likely_layer_norm_mistake(case, np.zeros(3)) is None
    message = _judge_layer_norm(case, {"y": np.zeros(3)})
    assert message == "your result has shape (3,); expected shape (4,)"


def test_batch_statistics_over_the_wrong_axis_are_named():
    """Normalizing over the batch axis, or over the whole array."""
    over_batch = fails(check_layer_norm_batches, lambda x, g, b, eps: ln(x, g, b, eps, axis=0))
    assert over_batch.endswith(". Hint: normalize each token over its features (the last "
                               "axis), not over the batch")
    case = _cases(_batch_cases)["a batch of 4 tokens, d = 8"]
    x, g, b, eps = case["x"], case["gamma"], case["beta"], float(case["eps"])
    whole = g * (x - x.mean()) / np.sqrt(x.var() + eps) + b
    assert _likely_layer_norm_mistake(case, whole) == (
        "take the mean and variance per token (axis=-1), not over the whole array")


def test_mistakes_are_named_on_a_batch_case_too():
    """The candidates are computed per token on any batch shape, with random gamma."""
    case = _cases(_batch_cases)["a 3-D batch (2, 3, 16) with random gamma and beta"]
    x, g, b, eps = case["x"], case["gamma"], case["beta"], float(case["eps"])
    for mistake in ("d - 1", "eps outside", "swapped", "affine first"):
        student, hint = MISTAKES[mistake]
        assert _likely_layer_norm_mistake(case, student(x, g, b, eps)) == hint, mistake


# ---------------------------------------------------------------- inline answers


def _answer(judge, key, value):
    """The verdict on `value`, sent as the probe sends it."""
    return judge({}, recipe_probes._answers_as_text({key: value}, {}))


def _shortcut_misses(spread):
    """The float32 shortcut's worst relative error over inline question 1's
    tokens, against torch's float64 variance (an independent reference)."""
    z = np.random.default_rng(0).standard_normal((256, 64))
    x = (1e4 + spread * z).astype(np.float32)
    shortcut = (x * x).mean(-1) - x.mean(-1) ** 2
    truth = torch.from_numpy(x.astype(np.float64)).var(-1, unbiased=False).numpy()
    return float(np.max(np.abs(shortcut / truth - 1)))


def test_the_safe_spread_is_the_smallest_the_shortcut_survives_by_a_margin():
    """Measured with torch: 16 keeps every token within 25%, 8 does not, and
    each is a factor of about two from the bound, so float32 summation on
    another machine does not move the answer."""
    assert _shortcut_misses(16) < 0.25 / 1.5 and _shortcut_misses(8) > 0.25 * 1.5
    for right in (16, 16.0, np.int64(16), torch.tensor(16), "16", Fraction(32, 2)):
        assert _answer(_judge_safe_spread, "safe_spread", right) is None
    assert "by 50%, more than 25%" in _answer(_judge_safe_spread, "safe_spread", 8)
    assert "the smallest" in _answer(_judge_safe_spread, "safe_spread", 32)
    for off_menu in (None, 10, "sixteen"):
        assert "give one of 1, 2, 4" in _answer(_judge_safe_spread, "safe_spread", off_menu)


def _float64_shortcut_misses(offset):
    """The float64 shortcut's worst error over spread-1 tokens at `offset`, against
    math.fsum's exactly rounded variance."""
    x = offset + np.random.default_rng(0).standard_normal((64, 64))
    shortcut = (x * x).mean(-1) - x.mean(-1) ** 2
    truth = [math.fsum((v - math.fsum(row) / 64) ** 2 for v in row) / 64 for row in x]
    return float(np.max(np.abs(shortcut - truth)))


def test_the_breaking_offset_is_where_offset_squared_times_eps_reaches_one():
    """Measured: a third of 1/sqrt(eps) leaves the float64 shortcut well inside a
    variance of 1, three times it well outside; answers in between pass."""
    breaks = 1 / np.sqrt(np.finfo(np.float64).eps)
    assert _float64_shortcut_misses(breaks / 3) < 0.5
    assert _float64_shortcut_misses(breaks * 3) > 2.0
    for right in (1e8, 10**8, "1e8", np.float64(1e8), torch.tensor(1e8, dtype=torch.float64),
                  6.7e7, "5e7", Fraction(10**8, 3)):
        assert _answer(_judge_breaking_offset, "breaking_offset", right) is None
    assert "far less than the variance" in _answer(_judge_breaking_offset, "breaking_offset",
                                                   1e4)
    assert "offset * eps is 1" in _answer(_judge_breaking_offset, "breaking_offset", 4.5e15)
    assert "already far larger" in _answer(_judge_breaking_offset, "breaking_offset", 1e9)
    for bad in (None, -1e8, "soon"):
        assert "give a positive number" in _answer(_judge_breaking_offset, "breaking_offset",
                                                   bad)


def test_the_spacing_estimate_is_the_spread_that_one_float32_gap_allows():
    """Float32 numbers near 1e8 lie 8 apart; an error of 8 is within 25% of the
    variance spread**2 from spread sqrt(32) = 5.7 on: 8 of the offered spreads."""
    gap = float(np.nextafter(np.float32(1e8), np.float32(np.inf)) - np.float32(1e8))
    assert gap == 8.0 and 4**2 * 0.25 < gap <= 8**2 * 0.25
    for right in (8, "8", 8.0, torch.tensor(8)):
        assert _answer(_judge_spacing_estimate, "spacing_estimate", right) is None
    assert "less than one float32 gap" in _answer(_judge_spacing_estimate, "spacing_estimate",
                                                  4)
    assert "asks for the smallest" in _answer(_judge_spacing_estimate, "spacing_estimate", 16)
    assert "give one of 1, 2, 4" in _answer(_judge_spacing_estimate, "spacing_estimate", 5.7)


def test_the_gap_between_estimate_and_measurement_is_the_worst_of_256_tokens():
    """Measured with torch's float64 variance: the typical token misses by about
    one gap (8) at every spread, the worst of 256 by several; so at spread 8
    the typical token is within 25% of its variance and the worst is not."""
    z = np.random.default_rng(0).standard_normal((256, 64))
    for spread in (4, 8, 16):
        x = (1e4 + spread * z).astype(np.float32)
        truth = torch.from_numpy(x.astype(np.float64)).var(-1, unbiased=False).numpy()
        errors = np.abs((x * x).mean(-1) - x.mean(-1) ** 2 - truth)
        assert 0.5 * 8 < np.median(errors) < 1.5 * 8
        assert errors.max() > 3 * 8
        if spread == 8:
            assert np.median(errors / truth) < 0.25 < np.max(errors / truth)
    for letter_c in (" 'C' ", "(c)", "c.", "C"):  # as the choice list writes it, or bare
        assert _answer(_judge_spread_gap_reason, "spread_gap_reason", letter_c) is None
    for wrong, hint in (("a", "exact to far below"), ("b", "hardly depends on the spread"),
                        ("d", "median token's error is about one gap")):
        assert hint in _answer(_judge_spread_gap_reason, "spread_gap_reason", wrong)
    assert "give one of a, b, c, d" in _answer(_judge_spread_gap_reason, "spread_gap_reason",
                                               None)


def test_the_shortcuts_error_comes_from_both_terms_not_mean_x_squared_alone():
    """Inline question 1 says both terms are rounded near 1e8 and mean(x)**2
    also carries mean(x)'s rounding: measured against float64 values of the
    same float32 numbers, mean(x)**2's error is the larger, mean(x**2)'s is
    not negligible, and neither depends on the spread."""
    z = np.random.default_rng(0).standard_normal((256, 64))
    gap = 8.0
    for spread in (1, 4, 16):
        x = (1e4 + spread * z).astype(np.float32)
        x64 = torch.from_numpy(x.astype(np.float64))
        square_mean = np.abs((x * x).mean(-1) - (x64 * x64).mean(-1).numpy()) / gap
        mean_square = np.abs(x.mean(-1).astype(np.float64) ** 2
                             - (x64.mean(-1) ** 2).numpy()) / gap
        assert 0.2 < np.median(square_mean) < np.median(mean_square) < 1.5
        assert np.max(mean_square) > 2 and np.max(square_mean) > 1


def test_the_s_for_half_output_is_checked_against_torch_layer_norm():
    """At s = 4 sqrt(eps) / 3 torch's layer norm maps s * [0, 0, 0, 1] to half of
    what it gives for a large s; the usual slips (sqrt(eps / 3), as if the variance were s**2; eps;
    the variance; s**2) are named, and any other answer is told what fraction
    layer norm returns at its s."""
    s = 4 * np.sqrt(1e-5) / 3
    one_up = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    large = F.layer_norm(1e3 * one_up, (4,), eps=1e-5)
    assert torch.allclose(F.layer_norm(s * one_up, (4,), eps=1e-5), large / 2)
    for right in (s, "4.216e-3", np.float32(s), torch.tensor(s), 0.00422):
        assert _answer(_judge_s_for_half_output, "s_for_half_output", right) is None
    lesson = np.sqrt(1e-5 / 3)
    assert "whose variance is s**2" in _answer(
        _judge_s_for_half_output, "s_for_half_output", lesson)
    assert "not s" in _answer(_judge_s_for_half_output, "s_for_half_output", s * s)
    assert "eps itself" in _answer(_judge_s_for_half_output, "s_for_half_output", 1e-5)
    # dividing by d - 1: s**2 / 4 = eps / 3 at the halving point, s = 2 sqrt(eps / 3)
    token = 2 * np.sqrt(1e-5 / 3) * np.array([0.0, 0.0, 0.0, 1.0])
    assert np.isclose(token.var(ddof=1), 1e-5 / 3)
    assert "d - 1" in _answer(_judge_s_for_half_output, "s_for_half_output", 3.651e-3)
    # eps beside the spread, (x - mu) / (std + eps): half where std = eps, s = 4 eps / sqrt 3
    outside = 4e-5 / np.sqrt(3)
    token = outside * np.array([0.0, 0.0, 0.0, 1.0])
    halved = (token - token.mean()) / (token.std() + 1e-5)
    assert np.isclose(halved[3] / (0.75 / np.sqrt(3 / 16)), 0.5)  # large s: std-free 1.732
    assert "(x - mu) / (std + eps)" in _answer(_judge_s_for_half_output, "s_for_half_output",
                                               outside)
    at_sqrt_eps = float(F.layer_norm(np.sqrt(1e-5) * one_up, (4,), eps=1e-5)[3] / large[3])
    assert f"returns {at_sqrt_eps:.3g} of what" in _answer(
        _judge_s_for_half_output, "s_for_half_output", np.sqrt(1e-5))
    assert "give a number" in _answer(_judge_s_for_half_output, "s_for_half_output", None)
    assert "not 0.5" in _answer(_judge_s_for_half_output, "s_for_half_output", 0.0041)


# Students may resubmit: a hint names what the wrong answer implies, never the right
# answer, its value or the formula that gives it.
HINT_LEAKS = {
    (_judge_spacing_estimate, "spacing_estimate"): (
        [1, 2, 4, 16, 32, 64, 128], [r"\b8\b", r"np\.spacing\("]),
    (_judge_safe_spread, "safe_spread"): ([1, 2, 4, 8, 32, 64, 128], [r"\b16\b", r"several"]),
    (_judge_spread_gap_reason, "spread_gap_reason"): (
        ["a", "b", "d"], [r"worst", r"typical", r"every token"]),
    (_judge_breaking_offset, "breaking_offset"): (
        [1e4, 1 / np.finfo(float).eps, 1e16], [r"offset\*\*2", r"1e\+?0?8", r"sqrt"]),
    (recipe_judges._judge_tiled_method, "tiled_method"): (
        ["a", "b", "d"], [r"Chan", r"two numbers:", r"same for every"]),
    (_judge_s_for_half_output, "s_for_half_output"): (
        [1e-5, 1e-5 / 3, np.sqrt(1e-5), np.sqrt(1e-5 / 3), 16e-5 / 9, 4e-5 / np.sqrt(3),
         0.01, 1.0],
        [r"eps ?/ ?3", r"0\.0042", r"4\.2\d*e-0?3", r"3 s\*\*2", r"16 ?eps"]),
}


@pytest.mark.parametrize("question", list(HINT_LEAKS), ids=lambda question: question[1])
def test_inline_hints_name_the_slip_not_the_answer(question):
    (judge, key), (wrong_answers, leaks) = question, HINT_LEAKS[question]
    for answer in wrong_answers:
        verdict = _answer(judge, key, answer)
        hint = verdict.split("(you answered", 1)[-1].split(")", 1)[-1]
        assert hint.strip(), (answer, verdict)
        for leak in leaks:
            assert not re.search(leak, hint), (answer, leak, hint)


# ---------------------------------------------------------------- more diagnoses


def test_a_float32_standard_deviation_or_unbiased_variance_is_named_at_float32_accuracy():
    """Float32 answers are compared with float32's tolerance, in the diagnoses too."""
    case = _cases(_var_cases)["float32 tokens around 10 000 with spread 1, (4, 64)"]
    truth = np.array([statistics.pvariance(row.tolist()) for row in case["x"]])
    std = np.sqrt(truth) * (1 + 2e-5)
    assert _judge_var(case, {"y": std}).endswith("That is the standard deviation; the variance "
                                                 "is its square")
    unbiased = truth * 64 / 63 * (1 + 2e-5)
    assert _judge_var(case, {"y": unbiased}).endswith("not d - 1 (np.var's default, ddof=0)")


def test_the_shortcut_is_named_where_it_was_used_even_at_a_moderate_offset():
    """Float32 tokens around 300: the float32 shortcut is off by more than float32's
    tolerance; not far from zero by the 1000-spreads rule, so only its values tell."""
    x = (300 + np.random.default_rng(5).normal(size=(4, 64))).astype(np.float32)
    assert not _far_from_zero(x)
    y = _shortcut(x)
    verdict = _judge_var({"x": x}, {"y": y})
    assert verdict is not None and "This looks like the shortcut" in verdict


@pytest.mark.parametrize("make", [_mean_cases, _var_cases, _token_cases, _batch_cases])
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


# ---------------------------------------------------------------- boundaries and robustness


def test_far_means_strictly_more_than_1000_spreads():
    """Exactly 1000 spreads (plus the 1e-12 guard) from zero is not far yet."""
    m = 1000 * (1.0 + 1e-12)
    assert not _far_from_zero(np.array([m - 1, m + 1]))


def test_a_variance_given_as_text_never_passes():
    """Right numbers as strings are refused, even far from zero in float32, where
    the float32 allowance applies."""
    case = _cases(_var_cases)["float32 tokens around 10 000 with spread 1, (4, 64)"]
    truth = np.array([statistics.pvariance(row.tolist()) for row in case["x"]])
    as_text = np.array([repr(float(v)) for v in truth])
    assert not _close_enough_in_float32(case["x"], as_text, truth)
    assert "not numbers" in _judge_var(case, {"y": as_text})


def test_the_float32_allowance_takes_float32_answers_and_has_no_absolute_slack():
    case = _cases(_var_cases)["float32 tokens around 10 000 with spread 1, (4, 64)"]
    truth = np.array([statistics.pvariance(row.tolist()) for row in case["x"]])
    assert _close_enough_in_float32(case["x"], (truth * (1 + 9e-3)).astype(np.float32), truth)
    just_over = truth * (1 + 1e-2) + 5e-9
    assert not _close_enough_in_float32(case["x"], just_over, truth)


def _far_case(gamma, beta, eps=1e-5):
    x = (1e6 + np.random.default_rng(3).normal(size=(3, 16)))
    return recipe_judges._ln_case(x, gamma, beta, eps)


def test_the_shortcut_is_named_with_a_random_affine():
    """At a large offset with gamma and beta not 1 and 0, the shortcut candidate
    applies them as the student would."""
    rng = np.random.default_rng(4)
    case = _far_case(rng.normal(size=16), rng.normal(size=16))
    x, g, b, eps = case["x"], case["gamma"], case["beta"], float(case["eps"])
    with np.errstate(all="ignore"):
        y = ln(x, g, b, eps, var=lambda v: np.maximum(_shortcut(v)[..., None], 0))
    assert _likely_layer_norm_mistake(case, y).startswith("the shortcut mean(x**2)")


def test_affine_before_normalizing_is_named_with_eps_1():
    """With eps = 1 the candidate's eps (inside the root, added) matters."""
    x = np.array([[2.0, 4.0, 6.0, 8.0], [1.0, -1.0, 0.5, 3.0]])
    case = recipe_judges._ln_case(x, [2.0, 0.5, 1.0, 3.0], [1.0, -1.0, 0.0, 2.0], eps=1.0)
    y = ln(case["gamma"] * x + case["beta"], 1.0, 0.0, 1.0)
    assert _likely_layer_norm_mistake(case, y) == (
        "gamma and beta are applied after normalizing, not before")


def test_batch_axis_mistakes_are_named_with_a_random_affine():
    case = _cases(_batch_cases)["a 3-D batch (2, 3, 16) with random gamma and beta"]
    x, g, b, eps = case["x"], case["gamma"], case["beta"], float(case["eps"])
    assert _likely_layer_norm_mistake(case, ln(x, g, b, eps, axis=0)) == (
        "normalize each token over its features (the last axis), not over the batch")
    whole = g * (x - x.mean()) / np.sqrt(x.var() + eps) + b
    assert _likely_layer_norm_mistake(case, whole) == (
        "take the mean and variance per token (axis=-1), not over the whole array")


def test_a_float32_mistake_is_named_at_float32_accuracy():
    """A float32 answer with the d - 1 variance, off by 2e-5 (inside float32's
    tolerance, outside float64's), is still named."""
    case = _cases(_batch_cases)["a float32 batch (6, 32)"]
    x, g, b, eps = case["x"], case["gamma"], case["beta"], float(case["eps"])
    y = (MISTAKES["d - 1"][0](x, g, b, eps) * (1 + 2e-5)).astype(np.float32)
    assert _likely_layer_norm_mistake(case, y) == "the variance divides by d, not d - 1"


def test_judging_prints_no_warnings():
    """0 / 0 in a candidate (a constant token with no eps) and numpy's own
    deprecations stay out of the grading log."""
    import warnings

    case = _cases(_token_cases)["a constant token [5, 5, 5, 5] with beta = 0.5"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _judge_layer_norm(case, {"y": np.full(4, 0.7)}) is not None
        assert _answer(_judge_spread_gap_reason, "spread_gap_reason", "c") is None
    arithmetic = [w for w in caught if "value encountered in" in str(w.message)
                  or "divide by zero" in str(w.message)]
    assert arithmetic == []
    assert [w for w in caught if issubclass(w.category, DeprecationWarning)] == []


def test_float32_inputs_are_judged_at_float32_accuracy():
    """Tolerances follow the input's dtype: a float32 answer 2e-5 off passes a
    float32 case (token_var near zero, layer_norm) and fails a float64 one."""
    x32 = np.random.default_rng(6).normal(size=(3, 16)).astype(np.float32)
    var = torch_var(x32) * (1 + 2e-5)
    assert _judge_var({"x": x32}, {"y": var.astype(np.float32)}) is None
    assert _judge_var({"x": x32.astype(np.float64)}, {"y": var}) is not None
    case = _cases(_batch_cases)["a float32 batch (6, 32)"]
    y = torch_layer_norm(case["x"], case["gamma"], case["beta"], 1e-5) * (1 + 2e-5)
    assert _judge_layer_norm(case, {"y": y.astype(np.float32)}) is None


def test_a_float32_variance_far_from_zero_within_the_allowance_passes_the_judge():
    case = _cases(_var_cases)["float32 tokens around 10 000 with spread 1, (4, 64)"]
    truth = np.array([statistics.pvariance(row.tolist()) for row in case["x"]])
    assert _judge_var(case, {"y": (truth * (1 + 9e-3)).astype(np.float32)}) is None
    assert _judge_var(case, {"y": (truth * (1 + 2e-2)).astype(np.float32)}) is not None


def test_the_library_variance_message_names_every_library_way():
    case = _cases(_var_cases)["x = [2, 4, 6, 8]"]
    assert _judge_var(case, {"y": np.array(5.0), "library_variance": np.array(True)}) == (
        "your token_var called a library variance (np.var, np.std, np.nanvar, np.nanstd, "
        "np.cov, np.corrcoef, np.ma's or torch.masked's var/std, a statistics function or an "
        "array's .var/.std method): compute it yourself")


def test_a_single_token_with_a_wrongly_shaped_variance_gets_no_axis_hint():
    case = _cases(_var_cases)["x = [2, 4, 6, 8]"]
    verdict = _judge_var(case, {"y": np.array([5.0, 5.0])})
    assert verdict == "your result has shape (2,); expected shape ()"


def test_a_slightly_different_float32_shortcut_is_named():
    """The float32 shortcut at a moderate offset, computed in another order (2e-5
    off): recognized at float32's tolerance."""
    x = (300 + np.random.default_rng(5).normal(size=(4, 64))).astype(np.float32)
    y = (_shortcut(x) * (1 + 2e-5)).astype(np.float32)
    assert "This looks like the shortcut" in _judge_var({"x": x}, {"y": y})


def test_judging_a_variance_prints_no_warnings():
    """float16 tokens around 300 overflow in the shortcut (300**2 > 65504): the
    judge's own arithmetic stays quiet."""
    import warnings

    x = (300 + np.random.default_rng(7).normal(size=(2, 8))).astype(np.float16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _judge_var({"x": x}, {"y": np.full(2, 7.0)}) is not None
    assert [str(w.message) for w in caught if "encountered in" in str(w.message)] == []


def test_explicit_gamma_and_beta_take_the_tokens_dtype():
    x = np.ones((2, 3), np.float32)
    case = recipe_judges._ln_case(x, [2.0, 2.0, 2.0], [0.5, 0.5, 0.5], eps=0.1)
    assert case["gamma"].dtype == case["beta"].dtype == np.float32
    np.testing.assert_array_equal(case["gamma"], [2.0] * 3)
    np.testing.assert_array_equal(case["beta"], [0.5] * 3)
    assert float(case["eps"]) == np.float64(0.1)


# ---------------------------------------------------------------- statistics in chunks


def _merged(case, merge):
    a = (int(case["n_a"]), case["mean_a"], case["m2_a"])
    b = (int(case["n_b"]), case["mean_b"], case["m2_b"])
    n, mean, m2 = merge(a, b)
    return {"n": np.asarray(n), "mean": np.asarray(mean), "m2": np.asarray(m2)}


def _torch_merge(a, b):
    """The merged statistics straight from torch, of the chunks' data rebuilt
    from nothing: the count, and torch's mean and var of the two chunks'
    statistics combined by the law of total variance."""
    (n_a, m_a, q_a), (n_b, m_b, q_b) = a, b
    n = n_a + n_b
    means = torch.stack([torch.as_tensor(m_a, dtype=torch.float64),
                         torch.as_tensor(m_b, dtype=torch.float64)])
    weights = torch.tensor([n_a / n, n_b / n], dtype=torch.float64).reshape(
        (2,) + (1,) * (means.ndim - 1))
    mean = (weights * means).sum(0)
    between = (weights * (means - mean) ** 2).sum(0) * n
    return n, mean.numpy(), (torch.as_tensor(q_a, dtype=torch.float64)
                             + torch.as_tensor(q_b, dtype=torch.float64)
                             + between).numpy()


def test_every_merge_case_passes_a_right_merge_computed_another_way():
    for label, case in recipe_judges._merge_cases(_rng()):
        assert recipe_judges._judge_merge(case, _merged(case, _torch_merge)) is None, label


def test_merge_cases_hold_the_statistics_of_real_chunks():
    case = dict(recipe_judges._merge_cases(_rng()))["[2, 4] and [6, 8]"]
    assert [float(case[k]) for k in ("n_a", "mean_a", "m2_a", "n_b", "mean_b", "m2_b")] == [
        2, 3, 2, 2, 7, 2]
    far = dict(recipe_judges._merge_cases(_rng()))[
        "float32 chunks of 16 and 48 features around 10 000 with spread 1, (4, 64)"]
    assert far["mean_a"].dtype == np.float32 and far["mean_a"].shape == (4,)
    assert int(far["n_a"]) == 16 and int(far["n_b"]) == 48
    assert np.all(np.abs(far["mean_a"] - 1e4) < 1)


def _slip(mean_rule, m2_rule):
    def merge(a, b):
        (n_a, m_a, q_a), (n_b, m_b, q_b) = a, b
        n = n_a + n_b
        delta = np.asarray(m_b, np.float64) - m_a
        return n, mean_rule(n_a, n_b, n, m_a, m_b, delta), m2_rule(n_a, n_b, n, q_a, q_b, delta)
    return merge


RIGHT_MEAN = lambda n_a, n_b, n, m_a, m_b, delta: m_a + delta * n_b / n  # noqa: E731
RIGHT_M2 = lambda n_a, n_b, n, q_a, q_b, delta: q_a + q_b + delta**2 * n_a * n_b / n  # noqa: E731


@pytest.mark.parametrize(("merge", "hint"), [
    (_slip(RIGHT_MEAN, lambda n_a, n_b, n, q_a, q_b, d: q_a + q_b), "M2_a \\+ M2_b alone"),
    (_slip(RIGHT_MEAN, lambda n_a, n_b, n, q_a, q_b, d: q_a + q_b + d**2 * n_a * n_b),
     "times too large"),
    (_slip(RIGHT_MEAN, lambda n_a, n_b, n, q_a, q_b, d: q_a + q_b + d**2 * n_a * n_b / n**2),
     "times too small"),
    (_slip(RIGHT_MEAN, lambda n_a, n_b, n, q_a, q_b, d: q_a + q_b + d**2 * n_a * n_b / (n - 1)),
     "divides by n - 1"),
    (_slip(RIGHT_MEAN, lambda n_a, n_b, n, q_a, q_b, d: (q_a + q_b + d**2 * n_a * n_b / n) / n),
     "not the variance M2 / n"),
    (_slip(lambda n_a, n_b, n, m_a, m_b, d: (m_a + m_b) / 2, RIGHT_M2), "weights each chunk"),
    (_slip(lambda n_a, n_b, n, m_a, m_b, d: m_a + d * n_a / n, RIGHT_M2), "n_b, not n_a"),
])
def test_each_merge_slip_is_named(merge, hint):
    verdicts = [recipe_judges._judge_merge(case, _merged(case, merge))
                for _, case in recipe_judges._merge_cases(_rng())]
    first = next(v for v in verdicts if v is not None)
    assert re.search(hint, first), first


def test_the_naive_sum_of_squares_is_named_far_from_zero_in_any_dtype():
    def naive(a, b):
        (n_a, m_a, q_a), (n_b, m_b, q_b) = a, b
        n = n_a + n_b
        mean = (n_a * m_a + n_b * m_b) / n
        return n, mean, q_a + n_a * m_a**2 + q_b + n_b * m_b**2 - n * mean**2

    cases = dict(recipe_judges._merge_cases(_rng()))
    for label in ("float32 chunks of 16 and 48 features around 10 000 with spread 1, (4, 64)",
                  "float64 chunks of 16 and 16 features around 1e8 with spread 1, (3, 32)"):
        verdict = recipe_judges._judge_merge(cases[label], _merged(cases[label], naive))
        assert "naive sum of squares" in verdict, label
    near_zero = cases["chunks of 3 and 5 features of 4 tokens"]
    assert recipe_judges._judge_merge(near_zero, _merged(near_zero, naive)) is None


def _merge_around_the_merged_mean(a, b):
    """Chan's merge through the merged mean, in the statistics' own dtype."""
    (n_a, m_a, q_a), (n_b, m_b, q_b) = a, b
    n = n_a + n_b
    mean = (n_a * m_a + n_b * m_b) / n
    return n, mean, q_a + q_b + n_a * (m_a - mean) ** 2 + n_b * (m_b - mean) ** 2


def _merge_welford_style(a, b):
    """Welford's update of M2, reusing the rounded merged mean."""
    (n_a, m_a, q_a), (n_b, m_b, q_b) = a, b
    n = n_a + n_b
    delta = m_b - m_a
    mean = m_a + delta * n_b / n
    return n, mean, q_a + q_b + n_b * delta * (m_b - mean)


def _merge_naive(a, b):
    (n_a, m_a, q_a), (n_b, m_b, q_b) = a, b
    n = n_a + n_b
    mean = (n_a * m_a + n_b * m_b) / n
    return n, mean, q_a + n_a * m_a**2 + q_b + n_b * m_b**2 - n * mean**2


_FLOAT32_FAR_MERGE = "float32 chunks of 16 and 48 features around 10 000 with spread 1, (4, 64)"


def test_sound_float32_merges_pass_the_far_case_and_the_naive_one_fails_it_for_every_seed():
    for seed in range(200):
        case = dict(recipe_judges._merge_cases(np.random.default_rng(seed)))[_FLOAT32_FAR_MERGE]
        for merge in (_merge_around_the_merged_mean, _merge_welford_style):
            out = _merged(case, merge)
            assert out["m2"].dtype == np.float32
            assert recipe_judges._judge_merge(case, out) is None, (seed, merge.__name__)
        verdict = recipe_judges._judge_merge(case, _merged(case, _merge_naive))
        assert verdict is not None and "naive sum of squares" in verdict, seed


def test_a_wrong_m2_far_from_the_naive_one_is_not_called_naive():
    case = dict(recipe_judges._merge_cases(_rng()))[_FLOAT32_FAR_MERGE]
    out = _merged(case, _merge_around_the_merged_mean)
    out["m2"] = out["m2"] * 1000
    verdict = recipe_judges._judge_merge(case, out)
    assert verdict.startswith("your m2 is") and "naive" not in verdict


def test_a_wrong_count_is_named_before_the_statistics():
    case = dict(recipe_judges._merge_cases(_rng()))["[2, 4] and [6, 8]"]
    verdict = recipe_judges._judge_merge(case, {"n": np.array(3), "mean": np.array(5.0),
                                                "m2": np.array(20.0)})
    assert verdict.endswith("the merged count is n_a + n_b")


def test_a_wrong_merge_with_no_known_slip_gets_no_hint():
    case = dict(recipe_judges._merge_cases(_rng()))["[2, 4] and [6, 8]"]
    verdict = recipe_judges._judge_merge(case, {"n": np.array(4), "mean": np.array(5.0),
                                                "m2": np.array(21.0)})
    assert verdict.startswith("your m2 is") and "Hint" not in verdict


def _chunk_case(label):
    return dict(recipe_judges._chunk_cases(_rng()))[label]


def _tiled(case):
    """What the probe notes of a chunked_var that merges chunk after chunk."""
    d, chunk = case["x"].shape[-1], int(case["chunk"])
    starts = range(chunk, d, chunk)
    return {"merge_counts": np.array([(s, min(chunk, d - s)) for s in starts],
                                     dtype=np.int64).reshape(-1, 2)}


def test_every_chunk_case_passes_torchs_variance_and_names_its_shape_and_chunk():
    for label, case in recipe_judges._chunk_cases(_rng()):
        x = case["x"]
        truth = torch_var(x)
        assert recipe_judges._judge_chunked(case, {"y": truth, **_tiled(case)}) is None, label
        assert f"chunk = {int(case['chunk'])}" in label
        shape = _shape_in_label(label)
        if shape is not None:
            assert x.shape == shape, label
        assert (x.dtype == np.float32) == ("float32" in label), label
    ragged = _chunk_case("a batch of 5 tokens, d = 8, chunk = 3 (the last chunk holds 2)")
    assert ragged["x"].shape == (5, 8) and 8 % int(ragged["chunk"]) == 2


@pytest.mark.parametrize(("label", "wrong", "hint"), [
    ("x = [2, 4, 6, 8], chunk = 2", lambda x, c: np.array(1.0), "adding the chunks' M2 alone"),
    ("a batch of 5 tokens, d = 8, chunk = 3 (the last chunk holds 2)",
     lambda x, c: np.mean([torch_var(x[:, s:s + c]) for s in range(0, 8, c)], axis=0),
     "averaging the chunks' variances"),
    ("a batch of 3 tokens, d = 8, chunk = 16 (one chunk holds them all)",
     lambda x, c: torch_var(x) * 8 / 16, "not `chunk` of them"),
    ("a batch of 5 tokens, d = 8, chunk = 3 (the last chunk holds 2)",
     lambda x, c: torch_var(x) * 8 / 7, "not d - 1"),
    ("a 3-D batch (2, 3, 16), chunk = 4", lambda x, c: np.sqrt(torch_var(x)),
     "standard deviation"),
    ("float32 tokens around 10 000 with spread 1, (4, 64), chunk = 16",
     lambda x, c: np.asarray(torch_var(x)) * 1.5, "naive one-pass"),
    ("a 3-D batch (2, 3, 16), chunk = 4", lambda x, c: torch_var(x)[0], "last axis"),
])
def test_each_chunked_slip_is_named(label, wrong, hint):
    case = _chunk_case(label)
    verdict = recipe_judges._judge_chunked(case, {"y": wrong(case["x"], int(case["chunk"]))})
    assert verdict is not None and hint in verdict, verdict


def test_the_naive_one_pass_is_named_by_its_values_near_zero_too():
    x = (300 + np.random.default_rng(4).normal(size=(4, 64))).astype(np.float32)
    from normref import recipe
    y = recipe.naive_chunked_var(x, 16)
    assert "naive one-pass" in recipe_judges._judge_chunked(
        {"x": x, "chunk": np.array(16)}, {"y": y})


def test_a_float32_chunked_variance_far_from_zero_within_the_allowance_passes():
    case = _chunk_case("float32 tokens around 10 000 with spread 1, (4, 64), chunk = 16")
    truth = np.array([statistics.pvariance(row.tolist()) for row in case["x"]])
    assert recipe_judges._judge_chunked(case, {"y": (truth * (1 + 9e-3)), **_tiled(case)}) \
        is None
    assert recipe_judges._judge_chunked(case, {"y": (truth * (1 + 2e-2)), **_tiled(case)}) \
        is not None


def _notebook(source):
    """The functions a notebook cell defines, sharing one namespace as a
    notebook's cells do."""
    namespace = {"np": np}
    exec(source, namespace)  # noqa: S102 - test code written here
    return namespace


EXACT_MERGE = """
def merge_stats(a, b):
    n = a[0] + b[0]
    delta = b[1] - a[1]
    return n, a[1] + delta * b[0] / n, a[2] + b[2] + delta**2 * a[0] * b[0] / n
"""

CHUNKED = """
def chunked_var(x, chunk):
    x = np.asarray(x, dtype=float)
    stats = None
    for start in range(0, x.shape[-1], chunk):
        part = x[..., start:start + chunk]
        mean = part.mean(axis=-1)
        here = (part.shape[-1], mean, ((part - mean[..., None]) ** 2).sum(-1))
        stats = here if stats is None else merge_stats(stats, here)
    return stats[2] / stats[0]
"""


def test_a_slip_in_merge_stats_costs_chunked_var_nothing():
    """The probe hands chunked_var an exact merge: a merge_stats that leaves
    out the term between the chunks fails its own check, not this one."""
    notebook = _notebook(CHUNKED + """
def merge_stats(a, b):
    return a[0] + b[0], (a[0] * a[1] + b[0] * b[1]) / (a[0] + b[0]), a[2] + b[2]
""")
    with contextlib.redirect_stdout(io.StringIO()) as out:
        check_chunked_var(notebook["chunked_var"])
        check_chunked_var_merges(notebook["chunked_var"])
    assert "chunked_var: all 8 cases passed" in out.getvalue()
    assert "chunked_var_merges: all 8 cases passed" in out.getvalue()
    assert notebook["merge_stats"]((2, 3.0, 2.0), (2, 7.0, 2.0))[2] == 4.0  # put back


def test_a_chunked_var_that_never_merges_tiles_earns_only_the_variance():
    notebook = _notebook("""
def merge_stats(a, b):
    raise NotImplementedError

def chunked_var(x, chunk):
    x = np.asarray(x, dtype=float)
    return ((x - x.mean(-1, keepdims=True)) ** 2).mean(-1)
""")
    assert "chunked_var: all 8 cases passed" in passes(check_chunked_var,
                                                         notebook["chunked_var"])
    with pytest.raises(CheckFailed, match="reuse your merge_stats: chunked_var never called it"):
        check_chunked_var_merges(notebook["chunked_var"])


def test_a_chunked_var_that_merges_inline_is_told_to_reuse_merge_stats():
    """Chan's merge copied into chunked_var's loop: a right variance (its point),
    but not the merge_stats the exercise asks it to reuse (the other point)."""
    notebook = _notebook(EXACT_MERGE + """
def chunked_var(x, chunk):
    x = np.asarray(x, dtype=float)
    n, mean, m2 = 0, 0.0, 0.0
    for start in range(0, x.shape[-1], chunk):
        part = x[..., start:start + chunk]
        n_b, mean_b = part.shape[-1], part.mean(-1)
        delta = mean_b - mean
        m2 = m2 + ((part - mean_b[..., None]) ** 2).sum(-1) + delta**2 * n * n_b / (n + n_b)
        mean, n = mean + delta * n_b / (n + n_b), n + n_b
    return m2 / n
""")
    assert "chunked_var: all 8 cases passed" in passes(check_chunked_var,
                                                         notebook["chunked_var"])
    with pytest.raises(CheckFailed, match="Merging inline, with a copy of its formula, does "
                                          "not count"):
        check_chunked_var_merges(notebook["chunked_var"])


def test_a_wrong_variance_is_explained_once_not_again_as_a_merge_problem():
    case = _chunk_case("a batch of 5 tokens, d = 8, chunk = 3 (the last chunk holds 2)")
    wrong = {"y": np.zeros(5), **_tiled(case)}
    assert recipe_judges._judge_chunked(case, wrong) is not None
    assert recipe_judges._judge_chunked_merges(case, wrong).startswith(
        "chunked_var's variance is not right yet (the cell above says why)")


@pytest.mark.parametrize("reached", [
    CHUNKED.replace("def chunked_var(x, chunk):", "def chunked_var(x, chunk, merge=merge_stats):")
    .replace("merge_stats(stats, here)", "merge(stats, here)"),
    CHUNKED.replace("merge_stats(stats, here)", "combine(stats, here)") + "combine = merge_stats\n",
    CHUNKED.replace("merge_stats(stats, here)", "merge_stats(b=here, a=stats)"),
])
def test_merges_count_under_any_name_chunked_var_reaches_them_by(reached):
    """The merges are counted on the merge_stats function itself: an alias, a
    default argument or keyword arguments reach the same function."""
    notebook = _notebook(EXACT_MERGE)
    exec(reached, notebook)  # noqa: S102 - test code written here
    with contextlib.redirect_stdout(io.StringIO()) as out:
        check_chunked_var_merges(notebook["chunked_var"])
    assert "chunked_var_merges: all 8 cases passed" in out.getvalue()
    assert notebook["merge_stats"]((2, 3.0, 2.0), (2, 7.0, 2.0)) == (4, 5.0, 20.0)


TORCH_CHUNKED = """
import torch

def merge_stats(a, b):
    n = a[0] + b[0]
    delta = b[1] - a[1]
    return n, a[1] + delta * b[0] / n, a[2] + b[2] + delta**2 * a[0] * b[0] / n

def chunked_var(x, chunk):
    x = torch.as_tensor(x, dtype=torch.float64)
    run = None
    for part in torch.split(x, chunk, dim=-1):
        mean = part.mean(-1)
        here = (part.shape[-1], mean, (part - mean[..., None]).pow(2).sum(-1))
        run = here if run is None else merge_stats(run, here)
    n, _, q = run
    return q.div(n)
"""


def test_a_torch_chunked_var_gets_torch_statistics_back_from_the_graded_merge():
    """The grader's own merge hands back what the student's would: tensor
    methods on the merged statistics keep working."""
    notebook = _notebook(TORCH_CHUNKED)
    assert "chunked_var_merges: all 8 cases passed" in passes(check_chunked_var_merges,
                                                                notebook["chunked_var"])


def test_a_tree_of_merges_as_threads_combine_them_passes():
    notebook = _notebook(EXACT_MERGE + """
def chunked_var(x, chunk):
    x = np.asarray(x, dtype=float)
    level = []
    for start in range(0, x.shape[-1], chunk):
        part = x[..., start:start + chunk]
        mean = part.mean(axis=-1)
        level.append((part.shape[-1], mean, ((part - mean[..., None]) ** 2).sum(-1)))
    while len(level) > 1:
        pairs = [merge_stats(a, b) for a, b in zip(level[::2], level[1::2])]
        level = pairs + level[len(pairs) * 2:]
    return level[0][2] / level[0][0]
""")
    with contextlib.redirect_stdout(io.StringIO()) as out:
        check_chunked_var_merges(notebook["chunked_var"])
    assert "chunked_var_merges: all 8 cases passed" in out.getvalue()


def test_merging_more_than_a_chunk_at_once_is_refused():
    notebook = _notebook(CHUNKED.replace("range(0, x.shape[-1], chunk)",
                                         "range(0, x.shape[-1], 2 * chunk)").replace(
        "start + chunk", "start + 2 * chunk") + """
def merge_stats(a, b):
    raise NotImplementedError
""")
    case = _chunk_case("a batch of 5 tokens, d = 8, chunk = 3 (the last chunk holds 2)")
    out = recipe_probes._call_chunked_var_watched(notebook["chunked_var"], case)
    assert out["merge_counts"].tolist() == [[6, 2]]
    halves = _chunk_case("a 3-D batch (2, 3, 16), chunk = 4")
    out = recipe_probes._call_chunked_var_watched(notebook["chunked_var"], halves)
    outputs = {k: np.asarray(v) for k, v in out.items()}
    assert recipe_judges._judge_chunked(halves, outputs) is None  # the variance is right
    verdict = recipe_judges._judge_chunked_merges(halves, outputs)
    assert "those of 8 features that no earlier merge had combined" in verdict
    slabs = {"y": torch_var(halves["x"]), "merge_counts": np.array([[4, 4], [4, 4], [4, 12]])}
    assert "those of 12 features that no earlier merge had combined" in \
        recipe_judges._judge_chunked_merges(halves, slabs)
    short = {"y": slabs["y"], "merge_counts": np.array([[4, 4], [8, 4], [4, 0]])}
    assert "counted 4 features, not the token's 16" in recipe_judges._judge_chunked_merges(
        halves, short)


def test_a_library_variance_in_chunked_var_is_refused_by_name():
    case = _chunk_case("x = [2, 4, 6, 8], chunk = 2")
    verdict = recipe_judges._judge_chunked(case, {"y": np.array(5.0),
                                                  "library_variance": np.array(True)})
    assert verdict.startswith("your chunked_var called a library variance")
    out = recipe_probes._call_chunked_var_watched(
        lambda x, c: np.var(x, axis=-1), {"x": np.arange(4.0), "chunk": np.array(2)})
    assert bool(out["library_variance"])


def test_the_chunk_probe_passes_the_chunk_as_an_int_and_a_copy_of_x():
    seen = {}

    def spy(x, chunk):
        seen["chunk"] = chunk
        x[...] = 0
        return np.zeros(x.shape[:-1])

    x = np.arange(4.0)
    recipe_probes._call_chunked_var_watched(spy, {"x": x, "chunk": np.array(2)})
    assert type(seen["chunk"]) is int and seen["chunk"] == 2
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("merged", [(4, 5.0), [4, 5.0, 20.0, 1.0], "abc", 20.0])
def test_the_merge_probe_wants_three_values(merged):
    case = dict(recipe_judges._merge_cases(_rng()))["[2, 4] and [6, 8]"]
    with pytest.raises(TypeError, match="a tuple of three"):
        recipe_probes._call_merge_stats(lambda a, b: merged, case)


def test_exact_python_numbers_are_read_as_numbers():
    """Fraction and Decimal results (a count, a single token's variance) are
    numbers the text allows: the probes send them as floats."""
    from decimal import Decimal
    from fractions import Fraction

    case = dict(recipe_judges._merge_cases(_rng()))["[2, 4] and [6, 8]"]
    out = recipe_probes._call_merge_stats(
        lambda a, b: (Fraction(4), Decimal("5"), Fraction(20)), case)
    assert {k: float(v) for k, v in out.items()} == {"n": 4.0, "mean": 5.0, "m2": 20.0}
    assert recipe_judges._judge_merge(case, out) is None
    assert recipe_probes._plain(Fraction(1, 2)) == 0.5
    kept = np.float32(2.5)
    assert recipe_probes._plain(kept) is kept
    var = recipe_probes._call_var_watched(lambda x: Fraction(5), {"x": np.arange(4.0)})
    assert float(var["y"]) == 5.0


@pytest.mark.parametrize(("answer", "verdict"), [
    ("c", None), ("C", None), (" 'c' ", None), ('"C"', None), ("(c)", None), ("c.", None),
    ("a", "not yet right (you answered a): two-pass needs the mean"),
    ("b", "not yet right (you answered b): running sums of x and x**2 fit"),
    ("d", "not yet right (you answered d): you answered that every method needs"),
    ("None", "TILED_KERNEL_METHOD: give one of a, b, c, d (you answered None)"),
    ("welford", "TILED_KERNEL_METHOD: give one of a, b, c, d (you answered welford)"),
])
def test_the_tiled_kernel_question_wants_welford_or_chan(answer, verdict):
    got = recipe_judges._judge_tiled_method({}, {"tiled_method": np.array(answer)})
    assert got == verdict if verdict is None else got.startswith(verdict), got


def test_a_missing_tiled_answer_is_named():
    assert recipe_judges._judge_tiled_method({}, {}) == (
        "no answer given for TILED_KERNEL_METHOD")


def test_a_wrong_default_eps_is_caught_and_named():
    """Every other case passes eps; one leaves it out, on a token whose variance
    (5e-6) is of eps's size, so a default of 1e-6 (some code's) changes the output."""
    def default_1e_6(x, gamma, beta, eps=1e-6):
        return torch_layer_norm(x, gamma, beta, eps)

    with pytest.raises(CheckFailed, match=r"eps left at its default.*eps = 1e-06; the "
                                          r"default must be eps=1e-05"):
        check_layer_norm_token(default_1e_6)
