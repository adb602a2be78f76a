"""Unit 01 checks, the grader-facing half: inputs, references, diagnoses."""

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
    ]


def _judge_mean(case, output):
    x = case["x"]
    expected = recipe.token_mean(x)
    problem = mismatch(output["y"], expected, dtype=x.dtype)
    if problem and x.ndim > 1 and np.shape(output["y"]) != expected.shape:
        problem += ": average over the last axis (the features of each token)"
    return problem


def _far_from_zero(x):
    """True when the tokens' mean is large next to their spread."""
    x64 = x.astype(np.float64)
    return bool(np.all(np.abs(x64.mean(-1)) > 1000 * (x64.std(-1) + 1e-12)))


# Welford's update in float32 rounds its running mean to about |mean| * 6e-8 at every
# step: at 10 000 with spread 1 and d = 64 it misses the variance by up to 1.4e-3
# (its worst over 12,000 tokens); the shortcut misses by 100% or more, and dividing
# by d - 1 by 1/63. A bound of 1e-2 sits between them.
FLOAT32_FAR_RTOL = 1e-2


def _close_enough_in_float32(x, y, expected):
    """Float32 tokens far from zero: a stable method that works in float32
    (Welford's, say) may miss the variance by parts in a thousand; the shortcut
    misses it by whole units."""
    if x.dtype != np.float32 or not _far_from_zero(x) or np.shape(y) != expected.shape:
        return False
    y = np.asarray(y)
    if not np.issubdtype(y.dtype, np.number):
        return False
    return bool(np.allclose(y.astype(np.float64), expected, rtol=FLOAT32_FAR_RTOL, atol=0))


def _judge_var(case, output):
    x, y = case["x"], output["y"]
    if bool(output.get("library_variance", False)):
        return ("your token_var called a library variance (np.var, np.std, np.nanvar, "
                "np.nanstd, np.cov, np.corrcoef, np.ma's or torch.masked's var/std, a "
                "statistics function or an array's .var/.std method): compute it yourself")
    expected = recipe.token_var(x)
    problem = mismatch(y, expected, dtype=x.dtype)
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
    if (matches(y, shortcut_here, dtype=x.dtype) or matches(y, shortcut_64, dtype=x.dtype)
            or _far_from_zero(x)):
        return problem + (". This looks like the shortcut mean(x**2) - mean(x)**2, which "
                          "cancels when the mean is large next to the spread: square "
                          "deviations from a centre inside the data instead")
    return problem


def _ln_case(x, gamma=None, beta=None, eps=1e-5):
    d = x.shape[-1]
    return {
        "x": x,
        "gamma": np.ones(d, x.dtype) if gamma is None else np.asarray(gamma, x.dtype),
        "beta": np.zeros(d, x.dtype) if beta is None else np.asarray(beta, x.dtype),
        "eps": np.array(eps),
    }


def _token_cases(rng):
    return [
        ("x = [2, 4, 6, 8]", _ln_case(EXAMPLE_A)),
        ("z = [2, 6, 4, 12] with gamma = 2, beta = 1", _ln_case(EXAMPLE_B, [2.0] * 4, [1.0] * 4)),
        ("x = [0, 3]", _ln_case(np.array([0.0, 3.0]))),
        ("a constant token [5, 5, 5, 5] with beta = 0.5",
         _ln_case(np.full(4, 5.0), beta=np.full(4, 0.5))),
        ("a tiny spread, 0.001 * [2, 4, 6, 8]", _ln_case(0.001 * EXAMPLE_A)),
        ("x = [2, 4, 6, 8] with eps = 1", _ln_case(EXAMPLE_A, eps=1.0)),
        ("a token of 16 features with random gamma and beta",
         _ln_case(rng.normal(size=16), rng.normal(size=16), rng.normal(size=16))),
        ("a float32 token of 64 features",
         _ln_case(rng.normal(3.0, 2.0, size=64).astype(np.float32))),
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
            "eps goes inside the square root: (x - mu) / sqrt(var + eps)":
                gamma * (x64 - mu) / (np.sqrt(var) + eps) + beta,
            "eps is missing: add it to the variance before the square root":
                gamma * (x64 - mu) / np.sqrt(var) + beta,
            "gamma scales and beta shifts, in that order: gamma * x_hat + beta":
                beta * (x64 - mu) / np.sqrt(var + eps) + gamma,
            "gamma and beta are applied after normalizing, not before":
                ((gamma * x64 + beta) - (gamma * x64 + beta).mean(-1, keepdims=True))
                / np.sqrt((gamma * x64 + beta).var(-1, keepdims=True) + eps),
        }
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
        return None


def _judge_layer_norm(case, output):
    x, y = case["x"], output["y"]
    expected = recipe.layer_norm(x, case["gamma"], case["beta"], float(case["eps"]))
    problem = mismatch(y, expected, dtype=x.dtype)
    if problem is None:
        return None
    hint = _likely_layer_norm_mistake(case, y)
    if hint is None and _far_from_zero(x):
        hint = ("at a large offset the variance must not come from the shortcut "
                "mean(x**2) - mean(x)**2: use your token_var")
    return problem + (f". Hint: {hint}" if hint else "")


_QUESTIONS = {
    "predict_shortcut": "Your prediction for the float32 shortcut at 10 000",
    "spacing_near_1e8": "The gap between neighbouring float32 numbers near 1e8",
    "shortcut_breaks_at": "The offset at which the float64 shortcut loses the variance",
}
PREDICTION_CHOICES = ("a", "b", "c")
OFFSET_CHOICES = (1e4, 1e8, 1e16)


def _true_answers():
    """Each inline answer worked out here, not typed in."""
    spacing = float(np.spacing(np.float32(1e8)))
    # The shortcut's error is about offset**2 times float64's relative
    # precision; it reaches a variance of 1 where offset = 1 / sqrt(eps).
    breaks = 1 / np.sqrt(np.finfo(np.float64).eps)
    nearest = min(OFFSET_CHOICES, key=lambda c: abs(np.log10(c) - np.log10(breaks)))
    return {"spacing_near_1e8": spacing, "shortcut_breaks_at": nearest}


def _judge_predictions(case, output):
    missing = [name for name in _QUESTIONS if name not in output]
    if missing:
        return f"no answer given for {', '.join(missing)}"
    answers = {name: str(output[name]) for name in _QUESTIONS}
    if answers["predict_shortcut"].strip().strip("'\"").lower() not in PREDICTION_CHOICES:
        return (f"{_QUESTIONS['predict_shortcut']}: give one of "
                f"{', '.join(PREDICTION_CHOICES)} (you answered {answers['predict_shortcut']}); "
                "any of them earns the point, it is your guess")
    wrong = []
    for name, truth in _true_answers().items():
        given = number_from_answer(answers[name])
        if given is None or not np.isclose(given, truth, rtol=1e-6, atol=0):
            wrong.append(f"{_QUESTIONS[name]} (you answered {answers[name]})")
    if wrong:
        return "not yet right: " + "; ".join(wrong)
    return None


CHECKS = {
    "token_mean": Check(_mean_cases, _judge_mean),
    "token_var": Check(_var_cases, _judge_var),
    "layer_norm_token": Check(_token_cases, _judge_layer_norm),
    "layer_norm_batches": Check(_batch_cases, _judge_layer_norm),
    "recipe_predictions": Check(lambda rng: [("your prediction and inline answers", {})],
                                _judge_predictions),
}
