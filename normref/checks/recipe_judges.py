"""Unit 01 checks, the grader-facing half: inputs, references, diagnoses."""

import re

import numpy as np

from normref import recipe
from normref.checks._registry import Check
from normref.checks.tolerances import matches, mismatch, number_from_answer

EXAMPLE_A = np.array([2.0, 4.0, 6.0, 8.0])
EXAMPLE_B = np.array([2.0, 6.0, 4.0, 12.0])


def _mean_cases(rng):
    return [
        ("x = [2, 4, 6, 8]", {"x": EXAMPLE_A}),
        ("a batch of 5 tokens, d = 8", {"x": rng.normal(size=(5, 8))}),
        ("a 3-D batch (2, 3, 16)", {"x": rng.normal(2.0, 3.0, size=(2, 3, 16))}),
        ("a 4-D batch (2, 2, 3, 8)", {"x": rng.normal(size=(2, 2, 3, 8))}),
        ("a constant token [5, 5, 5, 5]", {"x": np.full(4, 5.0)}),
        ("a float32 batch (4, 64)", {"x": rng.normal(size=(4, 64)).astype(np.float32)}),
        ("float64 tokens around 1e8 with spread 1, (3, 32)",
         {"x": _offset_tokens(rng, 1e8, (3, 32), np.float64)}),
    ]


def _offset_tokens(rng, offset, shape, dtype):
    """Tokens of spread about 1 around `offset`: where the shortcut cancels."""
    return (offset + rng.normal(size=shape)).astype(dtype)


def _var_cases(rng):
    return [
        ("x = [2, 4, 6, 8]", {"x": EXAMPLE_A}),
        ("a batch of 5 tokens, d = 8", {"x": rng.normal(size=(5, 8))}),
        ("a 4-D batch (2, 2, 3, 8)", {"x": rng.normal(2.0, 3.0, size=(2, 2, 3, 8))}),
        ("a constant token [5, 5, 5, 5]", {"x": np.full(4, 5.0)}),
        ("float32 tokens around 10 000 with spread 1, (4, 64)",
         {"x": _offset_tokens(rng, 1e4, (4, 64), np.float32)}),
        ("float64 tokens around 1e8 with spread 1, (3, 32)",
         {"x": _offset_tokens(rng, 1e8, (3, 32), np.float64)}),
        ("float32 tokens near 0, 100 and 10 000 in one batch, spread 1, (3, 64)",
         {"x": _offset_tokens(rng, np.array([[0.0], [1e2], [1e4]]), (3, 64), np.float32)}),
    ]


# A float64 mean of 32 numbers near 1e8 misses by under 1e-7 (float64's gaps there are
# 1.5e-8); float32's gaps there are 8, so a mean summed in float32 misses by units.
MEAN_SPREAD_RTOL = 1e-5


def _mean_off_the_spread(x, y, expected):
    """For float64 tokens far from zero, a sentence when the mean misses by more
    than MEAN_SPREAD_RTOL of the tokens' spread (rtol on the mean itself cannot see
    a float32 sum: 1e-6 of 1e8 is 100); None otherwise."""
    if x.dtype != np.float64 or not _far_from_zero(x) or np.shape(y) != expected.shape:
        return None
    error = float(np.max(np.abs(np.asarray(y, dtype=np.float64) - expected)))
    spread = float(np.min(x.std(-1)))
    if error <= MEAN_SPREAD_RTOL * spread:
        return None
    problem = (f"your means miss by up to {error:.3g}, {error / spread:.2g} times the "
               f"tokens' spread; float64 arithmetic misses by under {MEAN_SPREAD_RTOL:g} "
               "of it")
    float32_gap = float(np.spacing(np.float32(np.max(np.abs(expected)))))
    # float64 cannot miss by a thousandth of a float32 gap here; float32 sums, even
    # pairwise ones (np.mean's), miss by a hundredth of one or more
    if error >= float32_gap / 1000:
        problem += (f". An error this size is float32's (its gaps near "
                    f"{np.max(np.abs(expected)):.0e} are {float32_gap:g}): sum float64 "
                    "tokens in float64 (no dtype=np.float32, no cast)")
    return problem


def _judge_mean(case, output):
    x = case["x"]
    expected = recipe.token_mean(x)
    problem = mismatch(output["y"], expected, dtype=x.dtype)
    if problem and x.ndim > 1 and np.shape(output["y"]) != expected.shape:
        problem += ": average over the last axis (the features of each token)"
    return problem or _mean_off_the_spread(x, output["y"], expected)


def _far_from_zero(x):
    """True when the tokens' mean is large next to their spread."""
    x64 = x.astype(np.float64)
    return bool(np.all(np.abs(x64.mean(-1)) > 1000 * (x64.std(-1) + 1e-12)))


# Welford's update in float32 rounds its running mean to about |mean| * 6e-8 at every
# step: at 10 000 with spread 1 and d = 64 it misses the variance by up to 1.4e-3
# (its worst over 12,000 tokens); the shortcut misses by 100% or more, and dividing
# by d - 1 by 1/63. A bound of 1e-2 sits between them.
FLOAT32_FAR_RTOL = 1e-2


def _tokens_far_from_zero(x):
    """Each token's flag: its mean is large next to its spread. x: (..., d) -> (...)"""
    x64 = x.astype(np.float64)
    return np.abs(x64.mean(-1)) > 1000 * (x64.std(-1) + 1e-12)


def _close_enough_in_float32(x, y, expected):
    """Float32 tokens far from zero: a stable method that works in float32
    (Welford's, say) may miss the variance by parts in a thousand; the shortcut
    misses it by whole units. Token by token: the other tokens of the batch keep
    the usual float32 tolerance."""
    far = _tokens_far_from_zero(x)
    if x.dtype != np.float32 or not np.any(far) or np.shape(y) != expected.shape:
        return False
    y = np.asarray(y)
    if not np.issubdtype(y.dtype, np.number):
        return False
    y64 = y.astype(np.float64)
    return (bool(np.allclose(y64[far], expected[far], rtol=FLOAT32_FAR_RTOL, atol=0))
            and matches(y64[~far], expected[~far], dtype=x.dtype))


def _allowance_named(x, problem):
    """The float32-far allowance, 1%, named where it applies: mismatch names the
    usual float32 tolerance, which it does not use for these tokens."""
    if problem is not None and x.dtype == np.float32 and np.any(_tokens_far_from_zero(x)):
        return (f"{problem} (for float32 tokens this far from zero the allowance is "
                f"{FLOAT32_FAR_RTOL:.0%} instead)")
    return problem


def _one_shift_for_the_batch(x, y):
    """True when y is the shortcut taken after one shift for the whole batch (its
    first, last or middle number, or its mean) where each token needs its own."""
    if x.ndim < 2 or np.shape(y) != x.shape[:-1]:
        return False
    flat = x.reshape(-1)
    with np.errstate(all="ignore"):
        for shift in (flat[0], flat[-1], flat[flat.size // 2], x.astype(np.float64).mean()):
            shifted = x - x.dtype.type(shift)
            if matches(y, recipe.shortcut_var(shifted), dtype=x.dtype):
                return True
    return False


def _judge_var(case, output):
    x, y = case["x"], output["y"]
    if bool(output.get("library_variance", False)):
        return ("your token_var called a library variance (np.var, np.std, np.nanvar, "
                "np.nanstd, np.cov, np.corrcoef, np.ma's or torch.masked's var/std, a "
                "statistics function or an array's .var/.std method): compute it yourself")
    expected = recipe.token_var(x)
    problem = _allowance_named(x, mismatch(y, expected, dtype=x.dtype))
    if problem is None or _close_enough_in_float32(x, y, expected):
        return None
    d = x.shape[-1]
    with np.errstate(all="ignore"):
        shortcut_here = recipe.shortcut_var(x)
        shortcut_64 = recipe.shortcut_var(x.astype(np.float64))
    if matches(y, expected * d / (d - 1), dtype=x.dtype):
        return problem + ". The variance divides by d, not d - 1 (np.var's default, ddof=0)"
    if matches(y, np.sqrt(expected), dtype=x.dtype):
        return problem + ". That is the standard deviation; the variance is its square"
    if x.ndim > 1 and np.shape(y) != expected.shape:
        return problem + ". Take the variance over the last axis (each token's features)"
    if _one_shift_for_the_batch(x, y):
        return problem + (". This looks like the shortcut after one shift for the whole "
                          "batch: a number from one token is not a centre inside "
                          "tokens whose means lie far from it; centre each token on a "
                          "number of its own")
    if (matches(y, shortcut_here, dtype=x.dtype) or matches(y, shortcut_64, dtype=x.dtype)
            or _far_from_zero(x)):
        return problem + (". This looks like the shortcut mean(x**2) - mean(x)**2, which "
                          "cancels when the mean is large next to the spread: square "
                          "deviations from a centre inside the data instead")
    return problem


# layer_norm's default eps, PyTorch's: graded by a case that leaves eps out.
DEFAULT_EPS = 1e-5


def _ln_case(x, gamma=None, beta=None, eps=DEFAULT_EPS):
    d = x.shape[-1]
    return {
        "x": x,
        "gamma": np.ones(d, x.dtype) if gamma is None else np.asarray(gamma, x.dtype),
        "beta": np.zeros(d, x.dtype) if beta is None else np.asarray(beta, x.dtype),
        "eps": np.array(eps),
    }


def _ln_default_eps_case(x):
    """A case that calls layer_norm(x, gamma, beta), eps left at its default."""
    return {**_ln_case(x), "eps_default": np.array(True)}


def _token_cases(rng):
    return [
        ("x = [2, 4, 6, 8]", _ln_case(EXAMPLE_A)),
        ("z = [2, 6, 4, 12] with gamma = 2, beta = 1", _ln_case(EXAMPLE_B, [2.0] * 4, [1.0] * 4)),
        ("x = [0, 3]", _ln_case(np.array([0.0, 3.0]))),
        ("a constant token [5, 5, 5, 5] with beta = 0.5",
         _ln_case(np.full(4, 5.0), beta=np.full(4, 0.5))),
        ("a tiny spread, 0.001 * [2, 4, 6, 8]", _ln_case(0.001 * EXAMPLE_A)),
        ("x = [2, 4, 6, 8] with eps = 1", _ln_case(EXAMPLE_A, eps=1.0)),
        ("a tiny spread, 0.001 * [2, 4, 6, 8], eps left at its default",
         _ln_default_eps_case(0.001 * EXAMPLE_A)),
        ("a token of 16 features with random gamma and beta",
         _ln_case(rng.normal(size=16), rng.normal(size=16), rng.normal(size=16))),
        ("a float32 token of 64 features",
         _ln_case(rng.normal(3.0, 2.0, size=64).astype(np.float32))),
        ("a float64 token near 100 with spread 0.01, 100 + 0.01 * [0, 1, 2, 3]",
         _ln_case(100.0 + 0.01 * np.arange(4.0))),
    ]


def _batch_cases(rng):
    with_constant_token = rng.normal(size=(2, 2, 3, 8))
    with_constant_token[1, 0, 2] = 7.0
    return [
        ("a batch of 4 tokens, d = 8", _ln_case(rng.normal(size=(4, 8)))),
        ("a 3-D batch (2, 3, 16) with random gamma and beta",
         _ln_case(rng.normal(1.0, 4.0, size=(2, 3, 16)), rng.normal(size=16), rng.normal(size=16))),
        ("a 4-D batch (2, 2, 3, 8) holding one constant token",
         _ln_case(with_constant_token, beta=np.full(8, 0.25))),
        ("tokens around 1e6 with spread 1, (5, 32)",
         _ln_case(_offset_tokens(rng, 1e6, (5, 32), np.float64))),
        ("a float32 batch (6, 32)", _ln_case(rng.normal(size=(6, 32)).astype(np.float32))),
        ("a batch of 2 tokens, d = 2", _ln_case(np.array([[0.0, 3.0], [10.0, -10.0]]))),
    ]


FLOAT32_CAST_HINT = ("float64 input must be computed in float64: your output matches a "
                     "float32 computation, and a cast to float32 rounds x itself (near 100 "
                     "its gaps are 8e-6; near 1e6, 0.06). Keep the input's dtype")


def _float32_layer_norm(case):
    """The layer norm computed in float32 throughout, as a cast to float32 would.

    case: x (..., d), gamma and beta (d,), eps -> (..., d) float64
    """
    x32 = case["x"].astype(np.float32)  # ..., d
    mu = x32.mean(-1, keepdims=True)  # ..., 1
    var = ((x32 - mu) ** 2).mean(-1, keepdims=True)  # ..., 1
    y = (case["gamma"].astype(np.float32) * (x32 - mu) / np.sqrt(var + np.float32(case["eps"]))
         + case["beta"].astype(np.float32))  # ..., d
    return y.astype(np.float64)


def _computed_in_float32(case, y, expected):
    """True when float64 tokens gave an output only as accurate as float32 arithmetic:
    a float32 array, values that all sit on float32's grid where the answer does not,
    or an error within a factor 8 of a float32 computation's."""
    if case["x"].dtype != np.float64 or np.shape(y) != expected.shape:
        return False
    y = np.asarray(y)
    if y.dtype == np.float32:
        return True
    if not np.issubdtype(y.dtype, np.floating):
        return False
    y64 = y.astype(np.float64)
    off_grid = expected.astype(np.float32).astype(np.float64) != expected
    if off_grid.any() and np.array_equal(
            y64[off_grid], y64[off_grid].astype(np.float32).astype(np.float64)):
        return True
    # Float32 methods (two-pass, Welford, torch's) miss by 0.9 to 1.8 times what a
    # float32 two-pass misses; a float64 shortcut at 1e6 by 0.003 times that.
    float32_error = np.max(np.abs(_float32_layer_norm(case) - expected))
    return bool(float32_error / 8 <= np.max(np.abs(y64 - expected)) <= 8 * float32_error)


def _likely_layer_norm_mistake(case, y):
    """Name the mistake whose output `y` reproduces, if any."""
    # 0 / 0 in a candidate (a constant token without eps) is expected: no warning
    with np.errstate(all="ignore"):
        x, gamma, beta, eps = case["x"], case["gamma"], case["beta"], float(case["eps"])
        x64 = x.astype(np.float64)
        mu = x64.mean(-1, keepdims=True)
        var = x64.var(-1, keepdims=True)
        d = x.shape[-1]
        shortcut = np.maximum(recipe.shortcut_var(x64)[..., None], 0.0)
        candidates = {
            "the variance divides by d, not d - 1":
                gamma * (x64 - mu) / np.sqrt(var * d / max(d - 1, 1) + eps) + beta,
            "the shortcut mean(x**2) - mean(x)**2 cancels at a large offset: use a "
            "variance that survives it (your token_var)":
                gamma * (x64 - mu) / np.sqrt(shortcut + eps) + beta,
            "eps goes inside the square root: (x - mu) / sqrt(var + eps). Your output "
            "matches (x - mu) / (std + eps), which some code writes: close to layer norm "
            "for a wide spread but not within the tolerance here, and far off once the "
            "spread nears sqrt(eps)":
                gamma * (x64 - mu) / (np.sqrt(var) + eps) + beta,
            "the eps argument is ignored (a fixed 1e-5 used): add the eps you are given "
            "to the variance": gamma * (x64 - mu) / np.sqrt(var + 1e-5) + beta,
            "eps is missing: add it to the variance before the square root":
                gamma * (x64 - mu) / np.sqrt(var) + beta,
            "gamma scales and beta shifts, in that order: gamma * x_hat + beta":
                beta * (x64 - mu) / np.sqrt(var + eps) + gamma,
            "gamma and beta are applied after normalizing, not before":
                ((gamma * x64 + beta) - (gamma * x64 + beta).mean(-1, keepdims=True))
                / np.sqrt((gamma * x64 + beta).var(-1, keepdims=True) + eps),
        }
        if eps == 1e-5:  # a fixed 1e-5 is then the eps given
            del candidates["the eps argument is ignored (a fixed 1e-5 used): add the eps "
                           "you are given to the variance"]
        if x.ndim > 1:
            m0, v0 = x64.mean(0, keepdims=True), x64.var(0, keepdims=True)
            mall, vall = x64.mean(), x64.var()
            candidates[
                "normalize each token over its features (the last axis), not over the batch"] = (
                gamma * (x64 - m0) / np.sqrt(v0 + eps) + beta)
            candidates[
                "take the mean and variance per token (axis=-1), not over the whole array"] = (
                gamma * (x64 - mall) / np.sqrt(vall + eps) + beta)
        for hint, wrong in candidates.items():
            if np.shape(y) == wrong.shape and matches(y, wrong, dtype=x.dtype):
                return hint
        if _computed_in_float32(case, y, recipe.layer_norm(x64, gamma, beta, eps)):
            return FLOAT32_CAST_HINT
        return None


def _default_eps_used(case, y):
    """The eps a layer norm must have used to give y, when the case left eps at its
    default and y is a layer norm with some other eps; None otherwise."""
    if not bool(case.get("eps_default", False)) or np.shape(y) != case["x"].shape:
        return None
    x64, gamma, beta = case["x"].astype(np.float64), case["gamma"], case["beta"]
    centred = x64 - x64.mean(-1, keepdims=True)
    with np.errstate(all="ignore"):
        x_hat = (np.asarray(y, dtype=np.float64) - beta) / gamma
        used = float(np.mean((centred / x_hat)[centred != 0] ** 2) - np.mean(centred**2))
    if not np.isfinite(used) or used < 0 or np.isclose(used, DEFAULT_EPS, rtol=1e-2):
        return None
    if not matches(y, recipe.layer_norm(x64, gamma, beta, used), dtype=case["x"].dtype):
        return None
    return used


def _judge_layer_norm(case, output):
    x, y = case["x"], output["y"]
    expected = recipe.layer_norm(x, case["gamma"], case["beta"], float(case["eps"]))
    problem = mismatch(y, expected, dtype=x.dtype)
    if problem is None:
        return None
    hint = _likely_layer_norm_mistake(case, y)
    used = None if hint else _default_eps_used(case, y)
    if used is not None:
        return problem + (f". Hint: called without eps, your output matches layer norm "
                          f"with eps = {used:.2g}; the default must be eps="
                          f"{DEFAULT_EPS:g}, PyTorch's")
    if hint is None and _far_from_zero(x):
        hint = ("at a large offset the variance must not come from the shortcut "
                "mean(x**2) - mean(x)**2: use your token_var")
    return problem + (f". Hint: {hint}" if hint else "")


# Inline question 1: the tokens it names, the spreads it offers, the error it allows.
SPREAD_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128)
SPREAD_OFFSET, SPREAD_ALLOWED = 1e4, 0.25


def spread_question_tokens(spread):
    """The float32 tokens of inline question 1: 256 tokens of 64 features around
    10 000, spread `spread` times a fixed standard normal draw."""
    z = np.random.default_rng(0).standard_normal((256, 64))
    return (SPREAD_OFFSET + spread * z).astype(np.float32)


def safe_spread():
    """The smallest offered spread at which the float32 shortcut gives every token
    of inline question 1 within 25% of its variance, measured here as the student
    measures it."""
    for spread in SPREAD_CHOICES:
        x = spread_question_tokens(spread)
        truth = recipe.token_var(x.astype(np.float64))
        if np.all(np.abs(recipe.shortcut_var(x) - truth) <= SPREAD_ALLOWED * truth):
            return spread
    return None


def spacing_estimate():
    """The smallest offered spread whose variance, spread**2, is at least four
    float32 gaps near mean(x**2) = 1e8: an error of one gap is then within 25%."""
    gap = float(np.spacing(np.float32(SPREAD_OFFSET**2)))
    return next(s for s in SPREAD_CHOICES if gap <= SPREAD_ALLOWED * s**2)


def shortcut_errors_in_gaps(spread):
    """Each token's float32 shortcut error at `spread`, in float32 gaps near 1e8."""
    x = spread_question_tokens(spread)
    errors = np.abs(recipe.shortcut_var(x) - recipe.token_var(x.astype(np.float64)))
    return errors / float(np.spacing(np.float32(SPREAD_OFFSET**2)))


def breaking_offset():
    """Where the float64 shortcut's error, about offset**2 times float64's relative
    precision, reaches the variance 1 of a spread-1 token."""
    return float(1 / np.sqrt(np.finfo(np.float64).eps))


# How far from breaking_offset() an answer may be: the error is a few roundings of
# offset**2, so the offset where it reaches 1 is known to a small factor only.
OFFSET_FACTOR = 3.0


HALVING_EPS = 1e-5


def s_for_half_output():
    """The s at which layer norm with eps = 1e-5 maps s * [0, 0, 0, 1] to half its
    output for a large s. That token's mean is s / 4 and its variance 3 s**2 / 16;
    the output is x_hat * sqrt(var / (var + eps)), half of x_hat where
    var = eps / 3: s = sqrt(16 eps / 9) = 4 sqrt(eps) / 3."""
    return float(4 * np.sqrt(HALVING_EPS) / 3)


def eps_halving_fraction(s):
    """What layer norm returns for s * [0, 0, 0, 1], as a fraction of what it
    returns for a large s."""
    variance = 3 * s * s / 16
    return float(np.sqrt(variance / (variance + HALVING_EPS)))


def _judge_safe_spread(case, output):
    given = str(output.get("safe_spread"))
    value = number_from_answer(given)
    if value is None or value not in SPREAD_CHOICES:
        return (f"SHORTCUT_SAFE_SPREAD: give one of {', '.join(map(str, SPREAD_CHOICES))} "
                f"(you answered {given})")
    truth = safe_spread()
    if value == truth:
        return None
    x = spread_question_tokens(value)
    with np.errstate(all="ignore"):
        worst = float(np.max(np.abs(recipe.shortcut_var(x) / recipe.token_var(
            x.astype(np.float64)) - 1)))
    if value < truth:
        return (f"not yet right (you answered {given}): at spread {value:g} the float32 "
                f"shortcut misses some token's variance by {worst:.0%}, more than 25%")
    return (f"not yet right (you answered {given}): at spread {value:g} every token is "
            f"within 25% (worst {worst:.1%}), but so is a smaller spread: the question "
            "asks for the smallest")


def _judge_spacing_estimate(case, output):
    given = str(output.get("spacing_estimate"))
    value = number_from_answer(given)
    if value is None or value not in SPREAD_CHOICES:
        return (f"SPACING_ESTIMATE: give one of {', '.join(map(str, SPREAD_CHOICES))} "
                f"(you answered {given})")
    truth = spacing_estimate()
    if value == truth:
        return None
    if value > truth:
        return (f"not yet right (you answered {given}): at spread {value:g} an error of one "
                "gap is within 25% of the variance, but it is at a smaller offered spread "
                "too; the question asks for the smallest")
    return (f"not yet right (you answered {given}): at spread {value:g} the variance is "
            f"{value**2:g}, and 25% of it, {0.25 * value**2:g}, is less than one float32 gap "
            "near 1e8: an error of one gap would be more than 25%")


# Inline question 1.3: why every token of 256 needs a wider spread than one gap
# of error allows.
GAP_REASONS = {
    "a": "the float64 reference is exact to far below a unit at 10 000 (float64 keeps "
         "about 16 digits); compare it with math.fsum if in doubt",
    "b": "the shortcut's error hardly depends on the spread (it rounds numbers near "
         "1e8 whatever the spread): measure a token's error at spreads 4, 8 and 16",
    "c": None,
    "d": "measure it: the median token's error is about one gap (np.median of the errors "
         "over np.spacing(np.float32(1e8))) at every spread; only some tokens miss by "
         "several",
}


def _letter(given):
    """A multiple-choice answer as its bare letter: "c", 'C', "(c)" and "c." alike."""
    return given.strip(" '\"().").lower()


def _multiple_choice(given, choices, name):
    """The verdict on a letter answer: None if right, else the wrong letter's hint."""
    choice = _letter(given)
    if choice not in choices:
        return f"{name}: give one of a, b, c, d (you answered {given})"
    hint = choices[choice]
    return None if hint is None else f"not yet right (you answered {given}): {hint}"


def _judge_spread_gap_reason(case, output):
    return _multiple_choice(str(output.get("spread_gap_reason")), GAP_REASONS,
                            "SPREAD_GAP_REASON")


def _judge_breaking_offset(case, output):
    given = str(output.get("breaking_offset"))
    value = number_from_answer(given)
    if value is None or value <= 0:
        return f"SHORTCUT_BREAKS_AT: give a positive number, an offset (you answered {given})"
    truth = breaking_offset()
    if truth / OFFSET_FACTOR <= value <= truth * OFFSET_FACTOR:
        return None
    eps = float(np.finfo(np.float64).eps)
    if 1 / eps / OFFSET_FACTOR <= value <= OFFSET_FACTOR / eps:
        return (f"not yet right (you answered {given}): at that offset, offset * eps is 1; "
                "but the number rounded is mean(x**2), and its size is not the offset")
    if value < truth:
        return (f"not yet right (you answered {given}): at that offset the rounding of "
                "mean(x**2) is still far less than the variance 1")
    return (f"not yet right (you answered {given}): at that offset the rounding of "
            "mean(x**2) is already far larger than the variance 1")


def _judge_s_for_half_output(case, output):
    given = str(output.get("s_for_half_output"))
    value = number_from_answer(given)
    if value is None:
        return f"S_FOR_HALF_OUTPUT: give a number (you answered {given})"
    truth = s_for_half_output()
    if np.isclose(value, truth, rtol=1e-2, atol=0):
        return None
    hints = {
        "that s halves a token whose variance is s**2, such as s * [-1, 1, -1, 1]; "
        "work out the variance of s * [0, 0, 0, 1]": np.sqrt(HALVING_EPS / 3),
        "that s comes from the variance divided by d - 1 = 3 (s**2 / 4 for "
        "s * [0, 0, 0, 1]); layer norm's variance divides by d = 4":
            2 * np.sqrt(HALVING_EPS / 3),
        "that is eps itself: eps goes inside the square root, beside the token's "
        "variance, not beside s": HALVING_EPS,
        "that number is the token's variance at the halving point, not s":
            HALVING_EPS / 3,
        "that number is s**2 at the halving point, not s": 16 * HALVING_EPS / 9,
        "that s halves (x - mu) / (std + eps), where eps sits beside the spread; layer "
        "norm's eps sits inside the square root, beside the variance":
            4 * HALVING_EPS / np.sqrt(3),
    }
    for hint, wrong in hints.items():
        if np.isclose(value, wrong, rtol=1e-2, atol=0):
            return f"not yet right (you answered {given}): {hint}"
    with np.errstate(all="ignore"):
        fraction = eps_halving_fraction(value)
    return (f"not yet right (you answered {given}): at that s layer norm returns "
            f"{fraction:.3g} of what it returns for a large s, not 0.5")


# ---------------------------------------------------------------- statistics in chunks


def _stats_case(x, split):
    """Statistics of the chunks x[..., :split] and x[..., split:], as the
    grader would hand them to merge_stats, in x's dtype."""
    dtype = x.dtype
    n_a, mean_a, m2_a = recipe.chunk_stats(x[..., :split])
    n_b, mean_b, m2_b = recipe.chunk_stats(x[..., split:])
    return {"n_a": np.array(n_a), "mean_a": mean_a.astype(dtype), "m2_a": m2_a.astype(dtype),
            "n_b": np.array(n_b), "mean_b": mean_b.astype(dtype), "m2_b": m2_b.astype(dtype)}


def _apart(rng, shape, split, gap):
    """Tokens whose first `split` features sit around 0 and the rest around `gap`."""
    x = rng.normal(size=shape)
    x[..., split:] += gap
    return x


def _merge_cases(rng):
    return [
        ("[2, 4] and [6, 8]", _stats_case(EXAMPLE_A, 2)),
        ("chunks of 3 and 5 features of 4 tokens", _stats_case(rng.normal(size=(4, 8)), 3)),
        ("chunks of 1 and 7 features (the first has M2 = 0)",
         _stats_case(rng.normal(1.0, 2.0, size=(3, 8)), 1)),
        ("chunks of 6 and 2 features whose means sit 10 apart, (2, 3) tokens",
         _stats_case(_apart(rng, (2, 3, 8), 6, 10.0), 6)),
        ("float32 chunks of 16 and 48 features around 10 000 with spread 1, (4, 64)",
         _stats_case(_offset_tokens(rng, 1e4, (4, 64), np.float32), 16)),
        ("float64 chunks of 16 and 16 features around 1e8 with spread 1, (3, 32)",
         _stats_case(_offset_tokens(rng, 1e8, (3, 32), np.float64), 16)),
    ]


_NAIVE_MERGE = ("this looks like the naive sum of squares, (M2_a + n_a * mean_a**2 + M2_b + "
                "n_b * mean_b**2) - n * mean**2, which cancels when the means are large next "
                "to the spread: add the spread between the chunks' means, as you derived it, "
                "to M2_a + M2_b instead")


def _merge_mistakes(case):
    """{sentence: (mean, m2)} of the usual slips in Chan's merge, in float64 (the
    naive sum of squares is _naive_reach's)."""
    n_a, n_b = float(case["n_a"]), float(case["n_b"])
    n = n_a + n_b
    m_a, m_b = case["mean_a"].astype(np.float64), case["mean_b"].astype(np.float64)
    q_a, q_b = case["m2_a"].astype(np.float64), case["m2_b"].astype(np.float64)
    delta = m_b - m_a
    mean = m_a + delta * n_b / n
    m2 = q_a + q_b + delta**2 * n_a * n_b / n
    return {
        "M2_a + M2_b alone leaves out how far apart the chunks' means are: each chunk's "
        "M2 measures deviations from its own mean, not from the merged one":
            (mean, q_a + q_b),
        "your term between the chunks is n = n_a + n_b times too large: check the powers "
        "of n when you write mean_a - mean and mean_b - mean through delta":
            (mean, q_a + q_b + delta**2 * n_a * n_b),
        "your term between the chunks is n = n_a + n_b times too small: check the powers "
        "of n when you write mean_a - mean and mean_b - mean through delta":
            (mean, q_a + q_b + delta**2 * n_a * n_b / n**2),
        "your term between the chunks divides by n - 1: nothing in the derivation brings "
        "in n - 1, only the counts n_a, n_b and n = n_a + n_b":
            (mean, q_a + q_b + delta**2 * n_a * n_b / max(n - 1, 1)),
        "return M2, the sum of squared deviations, not the variance M2 / n":
            (mean, m2 / n),
        "the merged mean weights each chunk by its count: mean_a + delta * n_b / n, "
        "not the plain average of the two means":
            ((m_a + m_b) / 2, m2),
        "the merged mean moves from mean_a towards mean_b by delta * n_b / n (n_b, "
        "not n_a)":
            (m_a + delta * n_a / n, m2),
    }


def _judge_merge(case, output):
    dtype = case["mean_a"].dtype
    n = int(case["n_a"]) + int(case["n_b"])
    _, mean, m2 = recipe.merge_stats(
        (int(case["n_a"]), case["mean_a"].astype(np.float64), case["m2_a"].astype(np.float64)),
        (int(case["n_b"]), case["mean_b"].astype(np.float64), case["m2_b"].astype(np.float64)))
    count = mismatch(output["n"], np.array(float(n)), dtype=np.float64, what="your n")
    if count:
        return count + ": the merged count is n_a + n_b"
    m2_problem = mismatch(output["m2"], m2, dtype=dtype, what="your m2")
    if _float32_far_stats(case):
        m2_problem = None if _within_far_allowance(output["m2"], m2) else (
            m2_problem and f"{m2_problem} (for float32 statistics this far from zero the "
                           f"allowance is {FLOAT32_FAR_RTOL:.0%} instead)")
    mean_problem = mismatch(output["mean"], mean, dtype=dtype, what="your mean")
    problems = [p for p in (mean_problem, m2_problem) if p]
    if not problems:
        return None
    for hint, (wrong_mean, wrong_m2) in _merge_mistakes(case).items():
        if (matches(output["mean"], wrong_mean, dtype=dtype)
                and matches(output["m2"], wrong_m2, dtype=dtype)):
            return f"{problems[0]}. Hint: {hint}"
    if mean_problem is None and _within_naive_reach(case, output["m2"], m2):
        return f"{problems[0]}. Hint: {_NAIVE_MERGE}"
    return problems[0]


def _float32_far_stats(case):
    """True for float32 statistics whose chunks' means are large next to their
    spreads: there a sound merge that works in float32 rounds its merged mean to
    about |mean| * 6e-8, and the forms that reuse that mean (n_b * delta *
    (mean_b - mean), Welford's update) miss M2 by parts in ten thousand."""
    if case["mean_a"].dtype != np.float32:
        return False
    far = True
    for side in "ab":
        mean = np.abs(case[f"mean_{side}"].astype(np.float64))
        spread = np.sqrt(case[f"m2_{side}"].astype(np.float64) / float(case[f"n_{side}"]))
        far = far and bool(np.all(mean > 1000 * (spread + 1e-12)))
    return far


def _within_far_allowance(m2_given, m2):
    """True when M2 (d,...) is within FLOAT32_FAR_RTOL of the float64 one: the
    sound float32 merges miss it by at most 4.1e-4 (their worst over 2,000 seeds
    of the float32 case), the naive sum of squares by 100% or more on some
    token of every one of those seeds."""
    m2_given = np.asarray(m2_given)
    if m2_given.shape != np.shape(m2) or not np.issubdtype(m2_given.dtype, np.number):
        return False
    return bool(np.allclose(m2_given.astype(np.float64), m2, rtol=FLOAT32_FAR_RTOL, atol=0))


# The naive sum of squares subtracts n * mean**2 from a sum of the same size, S =
# M2_a + n_a * mean_a**2 + M2_b + n_b * mean_b**2: in both orders of its terms tried it
# misses M2 by at most 2.3 units of S's last place in the statistics' dtype (its
# worst over 2,000 seeds of the far cases, float32 and float64). Twice that is its
# reach; a wrong M2 beyond it is some other slip.
_NAIVE_REACH_ULPS = 4.6


def _within_naive_reach(case, m2_given, m2):
    """True when M2 is as far from the float64 one as the naive sum of squares,
    computed in the statistics' dtype, can land."""
    m2_given = np.asarray(m2_given)
    if m2_given.shape != np.shape(m2) or not np.issubdtype(m2_given.dtype, np.number):
        return False
    size = sum(case[f"m2_{side}"].astype(np.float64)
               + float(case[f"n_{side}"]) * case[f"mean_{side}"].astype(np.float64) ** 2
               for side in "ab")
    reach = _NAIVE_REACH_ULPS * np.finfo(case["mean_a"].dtype).eps * size
    return bool(np.all(np.abs(m2_given.astype(np.float64) - m2) <= reach))


def _chunk_cases(rng):
    def case(x, chunk):
        return {"x": x, "chunk": np.array(chunk)}

    return [
        ("x = [2, 4, 6, 8], chunk = 2", case(EXAMPLE_A, 2)),
        ("a batch of 5 tokens, d = 8, chunk = 3 (the last chunk holds 2)",
         case(rng.normal(size=(5, 8)), 3)),
        ("a 3-D batch (2, 3, 16), chunk = 4", case(rng.normal(2.0, 3.0, size=(2, 3, 16)), 4)),
        ("a token of d = 8, chunk = 1 (one feature at a time)",
         case(rng.normal(size=8), 1)),
        ("a batch of 3 tokens, d = 8, chunk = 16 (one chunk holds them all)",
         case(rng.normal(size=(3, 8)), 16)),
        ("tokens (4, 12) whose last 7 features sit 10 above the first 5, chunk = 5",
         case(_apart(rng, (4, 12), 5, 10.0), 5)),
        ("float32 tokens around 10 000 with spread 1, (4, 64), chunk = 16",
         case(_offset_tokens(rng, 1e4, (4, 64), np.float32), 16)),
        ("float64 tokens around 1e8 with spread 1, (3, 32), chunk = 8",
         case(_offset_tokens(rng, 1e8, (3, 32), np.float64), 8)),
    ]


def _chunked_mistakes(x, chunk):
    """{sentence: variance} of the usual slips in a chunked variance, float64."""
    x64 = x.astype(np.float64)
    d = x.shape[-1]
    chunks = [recipe.chunk_stats(x64[..., s:s + chunk]) for s in range(0, d, chunk)]
    m2_sum = sum(m2 for _, _, m2 in chunks)
    full = [(chunk, mean, m2) for _, mean, m2 in chunks]  # every chunk counted as full
    merged = full[0]
    for stats in full[1:]:
        merged = recipe.merge_stats(merged, stats)
    counted = chunk * len(chunks)
    return {
        "merging M2 needs the term between the chunks that you derived for merge_stats: "
        "adding the chunks' M2 alone leaves out how far apart their means are": m2_sum / d,
        "averaging the chunks' variances leaves out how far apart their means are: merge "
        "each chunk's (count, mean, M2) with your merge_stats":
            sum(m2 / n for n, _, m2 in chunks) / len(chunks),
        "the last chunk holds only what is left of the token's features, not `chunk` of "
        "them: count what each chunk holds": merged[2] / counted,
        "the last chunk holds only what is left of the token's features: count what "
        "each chunk holds (the total count is d)": merged[2] / d,
        "the variance divides M2 by d, not d - 1": recipe.token_var(x64) * d / max(d - 1, 1),
        "that is the standard deviation; the variance is its square":
            np.sqrt(recipe.token_var(x64)),
    }


# The variance earns chunked_var_correct; this cell's points are for reaching it the
# way the exercise asks.
_REUSE = ("the variance is right (that earns its own point), but the exercise asks you to "
          "reuse your merge_stats")


def _piece_means(row, chunk):
    """{count: (sorted means, their feature masks)} of the pieces a merge may take
    from one token `row` (d,) read in chunks of `chunk` features: every union of
    whole chunks (one chunk, neighbouring chunks, or chunks a halving tree pairs, i
    with i + half), and every run of neighbouring features (a chunk built feature
    by feature). A mask is an int whose bit j stands for feature j."""
    d = len(row)
    sums = np.concatenate([[0.0], np.cumsum(row)])
    found = {}

    def add(count, total, mask):
        found.setdefault(count, []).append((total / count, mask))

    for count in range(1, d + 1):
        for start in range(d - count + 1):
            add(count, sums[start + count] - sums[start], ((1 << count) - 1) << start)
    starts = list(range(0, d, chunk))
    if len(starts) <= 12:  # 4096 unions at most
        for pick in range(1, 1 << len(starts)):
            chosen = [s for i, s in enumerate(starts) if pick >> i & 1]
            ends = [min(s + chunk, d) for s in chosen]
            mask = sum(((1 << (e - s)) - 1) << s for s, e in zip(chosen, ends))
            add(sum(e - s for s, e in zip(chosen, ends)),
                sum(sums[e] - sums[s] for s, e in zip(chosen, ends)), mask)
    pieces = {}
    for count, options in found.items():
        options.sort(key=lambda option: option[0])
        pieces[count] = (np.array([m for m, _ in options]), [k for _, k in options])
    return pieces


def _masks_near(pieces, count, mean, tol):
    """The feature masks of the pieces of `count` features whose mean is within tol
    of `mean`."""
    if count not in pieces:
        return []
    means, masks = pieces[count]
    lo = np.searchsorted(means, mean - tol, side="left")
    hi = np.searchsorted(means, mean + tol, side="right")
    return masks[lo:hi]


def _merge_sides(output):
    """[(counts_a, means_a, counts_b, means_b)], one per merge, as flat float64
    arrays (the probe notes each side's length in side_sizes)."""
    counts = np.asarray(output.get("side_counts", np.zeros(0)), dtype=np.float64).ravel()
    means = np.asarray(output.get("side_means", np.zeros(0)), dtype=np.float64).ravel()
    sizes = np.asarray(output.get("side_sizes", np.zeros(0)), dtype=np.int64).ravel()
    if counts.shape != means.shape or int(sizes.sum()) != len(counts) or len(sizes) % 2:
        return []
    cut = np.cumsum(sizes)[:-1]
    counts, means = np.split(counts, cut), np.split(means, cut)
    return [(counts[i], means[i], counts[i + 1], means[i + 1])
            for i in range(0, len(sizes), 2)]


_OWN = ("Each piece's (n, mean, m2) are those of its own features, about its own "
        "mean: a chunk's, or what earlier merges returned, and no feature in two pieces")


def _not_chunk_unions(x, chunk, output):
    """None when the two pieces of every merge hold the statistics of disjoint sets
    of a token's features, each a union of whole chunks or a run of neighbouring
    features (so each piece's mean is the mean of its own features, whatever order
    or tree merged them); else a sentence."""
    d = x.shape[-1]
    rows = x.astype(np.float64).reshape(-1, d)
    tol = 64 * np.finfo(x.dtype).eps * float(np.max(np.abs(x))) + 1e-12
    tokens = [_piece_means(row, chunk) for row in rows]
    for counts_a, means_a, counts_b, means_b in _merge_sides(output):
        paired = len(counts_a) == len(counts_b)
        for k in range(max(len(counts_a), len(counts_b))):
            sides = [(c[k], m[k]) for c, m in ((counts_a, means_a), (counts_b, means_b))
                     if k < len(c)]
            held = [(c, m) for c, m in sides if c > 0 and np.isfinite(m)]
            # a token by its place when one entry stands for each token, else any token
            where = ([tokens[k]] if len(counts_a) == len(rows) and paired else tokens)
            for count, mean in held:
                if not any(_masks_near(t, count, mean, tol) for t in where):
                    return (f"{_REUSE} on each chunk's own statistics: one merge took a "
                            f"piece of {count:g} features whose mean, {mean:.6g}, is not "
                            f"the mean of any {count:g} of a token's features that make up "
                            "whole chunks (or a run of neighbouring features). " + _OWN)
            if paired and len(held) == 2 and not any(
                    a & b == 0 for t in where
                    for a in _masks_near(t, *held[0], tol)
                    for b in _masks_near(t, *held[1], tol)):
                return (f"{_REUSE} on each chunk's own statistics: one merge took pieces "
                        f"of {held[0][0]:g} and {held[1][0]:g} features, with means "
                        f"{held[0][1]:.6g} and {held[1][1]:.6g}, that are not two separate "
                        "sets of a token's features (they would share features). " + _OWN)
    return None


def _not_tiled(x, chunk, output):
    """None when chunked_var combined tiles of at most `chunk` features with
    merge_stats into the statistics of all d features, one after another or as any
    tree of disjoint pieces, and its variance follows those merges; else what
    it did instead. (The grader makes the student's merge_stats an exact merge,
    notes the counts and means of the two sides of every call, and calls chunked_var
    again with a merge that doubles M2.)"""
    d = x.shape[-1]
    counts = np.asarray(output.get("merge_counts", np.zeros((0, 2))), dtype=np.int64)
    counts = counts.reshape(-1, 2)
    needed = -(-d // chunk) - 1
    if needed and not len(counts):
        return (f"{_REUSE}: chunked_var never called it, and {d} features in chunks of "
                f"{chunk} need merges. Merging inline, with a copy of its formula, does not "
                "count: merge each chunk's (n, mean, m2) into the running statistics by "
                "calling merge_stats")
    merged = set()
    for n_a, n_b in counts.tolist():
        for side in (n_a, n_b):
            if side > chunk and side not in merged:
                return (f"{_REUSE} on statistics of one chunk at a time: one merge took "
                        f"those of {side} features that no earlier merge had combined, more "
                        f"than a chunk of {chunk}: work out each chunk's (n, mean, m2) on its "
                        "own and merge those")
        merged.add(n_a + n_b)
    if len(counts) and int(counts[-1].sum()) != d:
        return (f"{_REUSE} to merge every chunk once: the last merge counted "
                f"{int(counts[-1].sum())} features, not the token's {d}")
    apart = _not_chunk_unions(x, chunk, output)
    if apart:
        return apart
    if needed:
        y = np.asarray(output["y"], dtype=np.float64)
        tainted = np.asarray(output.get("y_tainted", np.nan), dtype=np.float64)
        with np.errstate(all="ignore"):
            followed = (tainted.shape == y.shape
                        and bool(np.all(np.abs(tainted - y) > 0.25 * np.abs(y))))
        if not followed:
            return (f"{_REUSE} and to return what the merges give: when the grader's "
                    "merge_stats returned twice the M2, your chunked_var returned the "
                    "same variance, so the variance does not come from the merges. Return "
                    "M2 / n of the merged statistics")
    return None


def _judge_chunked(case, output):
    x, y, chunk = case["x"], output["y"], int(case["chunk"])
    if bool(output.get("library_variance", False)):
        return ("your chunked_var called a library variance (np.var, np.std, np.nanvar, "
                "np.nanstd, np.cov, np.corrcoef, np.ma's or torch.masked's var/std, a "
                "statistics function or an array's .var/.std method): compute each "
                "chunk's M2 yourself")
    expected = recipe.chunked_var(x, chunk).astype(np.float64)
    problem = _allowance_named(x, mismatch(y, expected, dtype=x.dtype))
    if problem is None or _close_enough_in_float32(x, y, expected):
        return None
    if x.ndim > 1 and np.shape(y) != expected.shape:
        return problem + ". Take the variance over the last axis (each token's features)"
    with np.errstate(all="ignore"):
        naive = [recipe.naive_chunked_var(x, chunk),
                 recipe.naive_chunked_var(x.astype(np.float64), chunk)]
    for hint, wrong in _chunked_mistakes(x, chunk).items():
        if matches(y, wrong, dtype=x.dtype):
            return f"{problem}. Hint: {hint}"
    if any(matches(y, w, dtype=x.dtype) for w in naive) or _far_from_zero(x):
        return problem + (". This looks like the naive one-pass formula, sum(x**2) / d - "
                          "mean**2 from running sums, which cancels when the mean is large "
                          "next to the spread: carry (count, mean, M2) from chunk to chunk "
                          "and merge them with merge_stats")
    return problem


def _judge_chunked_merges(case, output):
    """The merge structure, once the variance is right: a wrong variance is
    chunked_var_correct's to explain."""
    problem = _judge_chunked(case, output)
    if problem is not None:
        return ("chunked_var's variance is not right yet (the cell above says why); these "
                "points are for reaching the right variance by merging chunks with your "
                "merge_stats")
    return _not_tiled(case["x"], int(case["chunk"]), output)


# Inline question 3.1: a kernel that streams tiles of 16 features and keeps two
# float32 numbers per token between them.
TILED_CHOICES = {
    "a": "two-pass needs the mean before it can square a single deviation, so it reads "
         "each row twice (or keeps all of it); this kernel sees each row once",
    "b": "running sums of x and x**2 fit in two float32 numbers, but subtracting them "
         "cancels: you measured the shortcut lose the variance far from zero",
    "c": None,
    "d": "you answered that every method needs a second read or more than two numbers "
         "per token: check that claim for each of a, b and c, listing what it keeps between "
         "tiles and which of those each token needs a copy of",
}


def _judge_tiled_method(case, output):
    if "tiled_method" not in output:
        return "no answer given for TILED_KERNEL_METHOD"
    given = str(output["tiled_method"])
    choice = _letter(given)
    if choice not in TILED_CHOICES:
        return f"TILED_KERNEL_METHOD: give one of a, b, c, d (you answered {given})"
    hint = TILED_CHOICES[choice]
    return None if hint is None else f"not yet right (you answered {given}): {hint}"


# Inline question 3.2: two-pass, Welford (chunked_var(x, 1)) and Chan with tiles of
# 16 (chunked_var(x, 16)), all in float32, ranked by their worst relative error on
# float32 tokens around 10 000 of 1024 features. What sets the order is the means
# (inline question 3.3): near 10 000 float32 keeps a mean to about 0.001. Two-pass
# rounds its one mean, but its deviations sum to zero about it, so that rounding
# reaches M2 only squared; a merge's delta, the difference of two rounded means,
# and Welford's update carry it into M2 directly, once per tile or once per
# feature. With every mean in float64 (M2 still float32) Welford and Chan come
# within about 1e-6 like two-pass; with M2 in float64 instead nothing changes.
RANKING_SHAPE, RANKING_OFFSET, RANKING_TILE = (256, 1024), 1e4, 16
RANKING_NAMES = ("two-pass", "chan", "welford")  # most accurate first
_RANKING_PATTERN = r"two[\s_-]*pass|2[\s_-]*pass|chan|welford"


def ranking_tokens():
    """The tokens inline question 3.2 hands the student."""
    z = np.random.default_rng(0).standard_normal(RANKING_SHAPE)
    return (RANKING_OFFSET + z).astype(np.float32)


def _welford32(x):
    n, mean, m2 = 0, np.zeros(x.shape[:-1], np.float32), np.zeros(x.shape[:-1], np.float32)
    for j in range(x.shape[-1]):
        n += 1
        delta = x[..., j] - mean
        mean = mean + delta / np.float32(n)
        m2 = m2 + delta * (x[..., j] - mean)
    return m2 / np.float32(n)


def _tile32(part):
    mean = part.sum(axis=-1) / np.float32(part.shape[-1])
    return part.shape[-1], mean, ((part - mean[..., None]) ** 2).sum(axis=-1)


def _chan32(x, tile):
    stats = _tile32(x[..., :tile])
    for start in range(tile, x.shape[-1], tile):
        n_b, mean_b, m2_b = _tile32(x[..., start:start + tile])
        n_a, mean_a, m2_a = stats
        n = n_a + n_b
        delta = mean_b - mean_a
        stats = (n, mean_a + delta * np.float32(n_b / n),
                 m2_a + m2_b + delta * delta * np.float32(n_a * n_b / n))
    return stats[2] / np.float32(stats[0])


def float32_worst_errors(x=None):
    """Worst relative error of each method in float32 against float64's variance of
    the same float32 numbers: {"two-pass": ..., "chan": ..., "welford": ...}."""
    x = ranking_tokens() if x is None else np.asarray(x, np.float32)
    truth = np.var(x.astype(np.float64), axis=-1)
    methods = {"two-pass": lambda t: _tile32(t)[2] / np.float32(t.shape[-1]),
               "chan": lambda t: _chan32(t, RANKING_TILE), "welford": _welford32}
    return {name: float(np.max(np.abs(f(x).astype(np.float64) - truth) / truth))
            for name, f in methods.items()}


def ranking_from_answer(given):
    """A ranking answer (a list or tuple of names, or one string naming all three)
    as a tuple of canonical names in the order given, or None."""
    if isinstance(given, (list, tuple)):
        given = ", ".join(str(item) for item in given)
    found = re.findall(_RANKING_PATTERN, str(given).lower())
    names = tuple("chan" if f == "chan" else "welford" if f == "welford" else "two-pass"
                  for f in found)
    return names if sorted(names) == sorted(RANKING_NAMES) else None


def _judge_float32_ranking(case, output):
    given = output.get("float32_ranking")
    ranking = ranking_from_answer(given)
    if ranking is None:
        return ("FLOAT32_RANKING: name each of \"two-pass\", \"chan\" and \"welford\" once, "
                f"most accurate first (you answered {given})")
    if ranking == RANKING_NAMES:
        return None
    wrong = f"not yet right (you answered {given})"
    return (f"{wrong}: measure all three on the tokens the question gives, each in "
            "float32 (print each result's dtype: in float64 all three agree to many "
            "digits), take each one's worst relative error over the 256 tokens, and "
            "order them by it. Welford and Chan merge left to right here (a tree of "
            "merges is neither), Chan's tiles with their statistics about each tile's "
            "own mean, and counts kept as Python ints (a NumPy integer count turns "
            "float32 arithmetic into float64)")


# Inline question 3.3: which rounding sets the three methods apart in float32: the
# means' (see the comment of question 3.2 for the measurements).
COST_CHOICES = {
    "a": "the reference is float64's variance of the same float32 numbers, so what "
         "float32 stored is the reference's input too, and two-pass reads the very "
         "same stored numbers: storage alone cannot separate the methods",
    "b": "two-pass also adds d squared deviations into one float32 number: if that "
         "lost the digits, two-pass would lose them too; compare its error with the "
         "others'",
    "c": None,
    "d": "each fraction of counts is rounded once per merge, to a relative 6e-8 or so, "
         "far below the errors you measured",
}


def _judge_one_read_cost(case, output):
    return _multiple_choice(str(output.get("one_read_cost")), COST_CHOICES, "ONE_READ_COST")


# Inline question 3.4: the tile-size sweep. Chan's merge (chunked_var, in float32,
# merged left to right) and the naive one-pass formula read in the same tiles, on the
# tokens of question 3.2, for tiles of SWEEP_TILES features (the last is the whole
# row: one tile, no merge). The merge's worst error shrinks as the tiles grow, from
# tiles of 1 (Welford) to the whole row (two-pass), and most of the change comes
# with the one merge of tiles of 512: each tile's mean is rounded near 10 000, and
# the merge's delta carries that rounding into M2 (question 3.3); one-pass misses
# by far more than 100% at every tile size. The options pair each direction of the
# merge's trend with each shape and each claim about one-pass twice, so none of
# them gives away the order question 3.2 asks for.
SWEEP_TILES = (1, 8, 64, 512, 1024)
_SWEEP_DIRECTION = ("print the merge's worst error at tiles of 1 and for the whole row: "
                    "which of the two is larger?")
_SWEEP_STEPS = ("compare the steps of your table: how much does the merge's error change "
                "from tiles of 64 to tiles of 512, and how much from 512 to the whole row?")
_SWEEP_ONE_PASS = ("print one-pass's worst error at tiles of 512 and for the whole row: "
                   "the running sums near 1e8 and 1e4 still cancel, whatever the tile size")
SWEEP_CHOICES = {
    "a": f"{_SWEEP_DIRECTION} Then {_SWEEP_STEPS}",
    "b": f"{_SWEEP_ONE_PASS}. Then {_SWEEP_STEPS}",
    "c": f"{_SWEEP_ONE_PASS}. Then {_SWEEP_DIRECTION}",
    "d": None,
}


def tile_sweep_errors(x=None):
    """Worst relative float32 error of the merge and of one-pass at each tile size of
    SWEEP_TILES, against float64's variance of the same float32 numbers:
    {tile: (merge, one_pass)}."""
    x = ranking_tokens() if x is None else np.asarray(x, np.float32)
    truth = np.var(x.astype(np.float64), axis=-1)

    def worst(v):
        return float(np.max(np.abs(np.asarray(v, np.float64) - truth) / truth))

    return {tile: (worst(_welford32(x) if tile == 1 else _chan32(x, tile)),
                   worst(recipe.naive_chunked_var(x, tile)))
            for tile in SWEEP_TILES}


def _judge_tile_sweep(case, output):
    return _multiple_choice(str(output.get("tile_sweep")), SWEEP_CHOICES, "TILE_SWEEP_PATTERN")


# Inline question 5: RMSNorm subtracts no mean, so a shift c does not cancel. For
# the token x = [-1, 1, -1, 1] (mean 0, variance 1) and gamma all ones, x + c keeps
# its spread 1 and has the mean square 1 + c**2, so rms_norm(x + c) has the spread
# 1 / sqrt(1 + c**2 + eps): half its spread at c = 0 where c = sqrt(3 (1 + eps)).
RMS_EPS = 1e-5
RMS_SHIFT_TOKEN = (-1.0, 1.0, -1.0, 1.0)
RMS_RELATIVE = 1e-2  # a right answer: within 1% (three significant figures)


def rms_shift_halving():
    """The shift c > 0 at which RMSNorm's output of RMS_SHIFT_TOKEN + c has half
    the spread it has at c = 0."""
    return float(np.sqrt(3 * (1 + RMS_EPS)))


def rms_shift_spread_ratio(c):
    """Spread of rms_norm(x + c) over that of rms_norm(x), for RMS_SHIFT_TOKEN."""
    return float(np.sqrt((1 + RMS_EPS) / (1 + c * c + RMS_EPS)))


def _judge_rms_shift_halving(case, output):
    given = str(output.get("rms_shift_halving"))
    value = number_from_answer(given)
    if value is None:
        if given.strip().lower() not in ("none", ""):
            return (f"RMS_SHIFT_HALVING: give a number, the shift c (you answered "
                    f"{given}); RMSNorm subtracts no mean, so the shift does not "
                    "cancel: the spread falls as c grows")
        return f"RMS_SHIFT_HALVING: give a number, the shift c (you answered {given})"
    truth = rms_shift_halving()
    if abs(abs(value) - truth) <= RMS_RELATIVE * truth:
        return None
    slips = {
        2.0: "mean((x + c)**2) is the token's variance 1 plus c**2, not c**2 alone: "
             "the root mean square is not c",
        3.0: "that is c**2 at the halving point, not c",
        1.0: "at c = 1 the mean square doubles, so the root mean square grows by "
             "sqrt(2), not by 2",
    }
    for wrong, slip in slips.items():
        if abs(abs(value) - wrong) <= RMS_RELATIVE * wrong:
            return f"not yet right (you answered {given}): {slip}"
    return (f"not yet right (you answered {given}): at that c the output's spread is "
            f"{rms_shift_spread_ratio(value):.3g} of its spread at c = 0, not 0.5; "
            "measure it with your functions")


CHECKS = {
    "token_mean": Check(_mean_cases, _judge_mean),
    "token_var": Check(_var_cases, _judge_var),
    "merge_stats": Check(_merge_cases, _judge_merge),
    "chunked_var": Check(_chunk_cases, _judge_chunked),
    "chunked_var_merges": Check(_chunk_cases, _judge_chunked_merges),
    "recipe_tiled_method": Check(lambda rng: [("your answer to inline question 3.1", {})],
                                 _judge_tiled_method),
    "recipe_float32_ranking": Check(
        lambda rng: [("your answer to inline question 3.2", {})], _judge_float32_ranking),
    "recipe_one_read_cost": Check(
        lambda rng: [("your answer to inline question 3.3", {})], _judge_one_read_cost),
    "recipe_tile_sweep": Check(
        lambda rng: [("your answer to inline question 3.4", {})], _judge_tile_sweep),
    "layer_norm_token": Check(_token_cases, _judge_layer_norm),
    "layer_norm_batches": Check(_batch_cases, _judge_layer_norm),
    "recipe_safe_spread": Check(lambda rng: [("your answer to inline question 1.2", {})],
                                _judge_safe_spread),
    "recipe_spacing_estimate": Check(
        lambda rng: [("your answer to inline question 1.1", {})], _judge_spacing_estimate),
    "recipe_spread_gap_reason": Check(
        lambda rng: [("your answer to inline question 1.3", {})], _judge_spread_gap_reason),
    "recipe_breaking_offset": Check(lambda rng: [("your answer to inline question 2", {})],
                                    _judge_breaking_offset),
    "recipe_rms_shift_halving": Check(
        lambda rng: [("your answer to inline question 5", {})], _judge_rms_shift_halving),
    "recipe_s_for_half_output": Check(
        lambda rng: [("your answer to inline question 4", {})], _judge_s_for_half_output),
}
