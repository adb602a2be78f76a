"""Unit 01 checks, the grader-facing half: inputs, references, diagnoses."""

import numpy as np

from normref import recipe
from normref.checks._registry import Check
from normref.checks.tolerances import matches, mismatch

EXAMPLE_A = np.array([2.0, 4.0, 6.0, 8.0])
EXAMPLE_B = np.array([2.0, 6.0, 4.0, 12.0])


def _statistic_cases(rng):
    return [
        ("x = [2, 4, 6, 8]", {"x": EXAMPLE_A}),
        ("a batch of 5 tokens, d = 8", {"x": rng.normal(size=(5, 8))}),
        ("a 3-D batch (2, 3, 16)", {"x": rng.normal(2.0, 3.0, size=(2, 3, 16))}),
        ("a constant token [5, 5, 5, 5]", {"x": np.full(4, 5.0)}),
        ("tokens with a large offset (1000 + N(0, 1))", {"x": 1000 + rng.normal(size=(3, 32))}),
        ("a float32 batch (4, 64)", {"x": rng.normal(size=(4, 64)).astype(np.float32)}),
    ]


def _judge_mean(case, output):
    x = case["x"]
    expected = recipe.token_mean(x)
    problem = mismatch(output["y"], expected, dtype=x.dtype)
    if problem and x.ndim > 1 and np.shape(output["y"]) != expected.shape:
        problem += ": average over the last axis (the features of each token)"
    return problem


def _judge_var(case, output):
    x, y = case["x"], output["y"]
    expected = recipe.token_var(x)
    problem = mismatch(y, expected, dtype=x.dtype)
    if problem is None:
        return None
    d = x.shape[-1]
    if matches(y, expected * d / (d - 1), dtype=x.dtype):
        return problem + ". The variance divides by d, not d - 1 (np.var's default, ddof=0)"
    if matches(y, np.sqrt(expected), dtype=x.dtype):
        return problem + ". That is the standard deviation; the variance is its square"
    if x.ndim > 1 and np.shape(y) != expected.shape:
        return problem + ". Take the variance over the last axis (each token's features)"
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
    constant_row = rng.normal(size=(3, 8))
    constant_row[1] = 7.0
    return [
        ("a batch of 4 tokens, d = 8", _ln_case(rng.normal(size=(4, 8)))),
        ("a 3-D batch (2, 3, 16) with random gamma and beta",
         _ln_case(rng.normal(1.0, 4.0, size=(2, 3, 16)), rng.normal(size=16), rng.normal(size=16))),
        ("a batch whose second token is constant", _ln_case(constant_row, beta=np.full(8, 0.25))),
        ("a batch with a large offset (1000 + N(0, 1))", _ln_case(1000 + rng.normal(size=(5, 32)))),
        ("a float32 batch (6, 32)", _ln_case(rng.normal(size=(6, 32)).astype(np.float32))),
        ("a batch of 2 tokens, d = 2", _ln_case(np.array([[0.0, 3.0], [10.0, -10.0]]))),
    ]


def _likely_layer_norm_mistake(case, y):
    """Name the mistake whose output `y` reproduces, if any."""
    x, gamma, beta, eps = case["x"], case["gamma"], case["beta"], float(case["eps"])
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    var = x64.var(-1, keepdims=True)
    d = x.shape[-1]
    candidates = {
        "the variance divides by d, not d - 1":
            gamma * (x64 - mu) / np.sqrt(var * d / max(d - 1, 1) + eps) + beta,
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
        candidates["normalize each token over its features (the last axis), not over the batch"] = (
            gamma * (x64 - m0) / np.sqrt(v0 + eps) + beta)
        candidates["take the mean and variance per token (axis=-1), not over the whole array"] = (
            gamma * (x64 - mall) / np.sqrt(vall + eps) + beta)
    with np.errstate(all="ignore"):
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
    return problem + (f". Hint: {hint}" if hint else "")


_QUESTIONS = {
    "shift_changes_output": "Does adding c to every feature change the output?",
    "negative_scale_effect": "What does multiplying a token by k = -2 do to its output?",
    "zero_scale_output": "What does the layer return when k = 0?",
    "batch_mates_matter": "Does a token's output depend on the other tokens in its batch?",
}


def _true_answers():
    """Each answer worked out by running the reference, not typed in."""
    x = EXAMPLE_A
    gamma, beta = np.full(4, 2.0), np.full(4, 1.0)
    ln = recipe.layer_norm
    if np.allclose(ln(-2 * x), -ln(x), atol=1e-6):
        negative = "flipped"
    else:
        negative = "doubled" if np.allclose(ln(-2 * x), 2 * ln(x)) else "unchanged"
    zero = ln(0 * x, gamma, beta)
    if np.allclose(zero, beta):
        zero_answer = "beta"
    else:
        zero_answer = "zeros" if np.allclose(zero, 0) else "nan"
    batch = np.stack([x, 10 * x[::-1], x + 3])
    return {
        "shift_changes_output": str(not np.allclose(ln(x + 10), ln(x))),
        "negative_scale_effect": negative,
        "zero_scale_output": zero_answer,
        "batch_mates_matter": str(not np.allclose(ln(batch)[0], ln(x))),
    }


def _judge_predictions(case, output):
    truths = _true_answers()
    missing = [name for name in truths if name not in output]
    if missing:
        return f"no answer given for {', '.join(missing)}"
    wrong = [name for name, truth in truths.items() if str(output[name]) != truth]
    if wrong:
        return "not yet right: " + "; ".join(
            f"{_QUESTIONS[name]} (you answered {output[name]})" for name in wrong)
    return None


CHECKS = {
    "token_mean": Check(_statistic_cases, _judge_mean),
    "token_var": Check(_statistic_cases, _judge_var),
    "layer_norm_token": Check(_token_cases, _judge_layer_norm),
    "layer_norm_batches": Check(_batch_cases, _judge_layer_norm),
    "recipe_predictions": Check(lambda rng: [("your four predictions", {})], _judge_predictions),
}
