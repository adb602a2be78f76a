"""Unit 02 checks, the grader-facing half: inputs, references, diagnoses."""

import numpy as np

from normref import batchnorm, recipe, rmsnorm
from normref.checks._registry import Check
from normref.checks.tolerances import matches, mismatch

# nn.GroupNorm raises ValueError for indivisible channels, F.group_norm RuntimeError;
# any subclass of either counts (NotImplementedError, a RuntimeError, is a blank answer)
TORCH_ERRORS = ("builtins.ValueError", "builtins.RuntimeError")
NOT_WRITTEN = "builtins.NotImplementedError"


def raised_as_asked(output):
    """Did the student's code raise a ValueError (or RuntimeError), or a subclass?"""
    classes = {str(c) for c in np.atleast_1d(output.get("raised_classes", np.array([])))}
    return NOT_WRITTEN not in classes and any(error in classes for error in TORCH_ERRORS)


def _first_matching_hint(y, candidates, dtype):
    """The hint of the first candidate (hint -> wrong output) that `y` reproduces."""
    with np.errstate(all="ignore"):
        for hint, wrong in candidates.items():
            if np.shape(y) == np.shape(wrong) and matches(y, wrong, dtype=dtype):
                return hint
    return None


def _with_hint(problem, hint):
    return problem + (f". Hint: {hint}" if hint else "")


# ---------------------------------------------------------------- batch norm


def _bn_case(x, *, gamma=None, beta=None, running_mean=None, running_var=None,
             momentum=0.1, eps=1e-5):
    """x: (steps, N, C) for training cases, (N, C) for eval cases."""
    c, dtype = x.shape[-1], x.dtype
    return {
        "x": x,
        "gamma": np.ones(c, dtype) if gamma is None else np.asarray(gamma, dtype),
        "beta": np.zeros(c, dtype) if beta is None else np.asarray(beta, dtype),
        "running_mean": (np.zeros(c, dtype) if running_mean is None
                         else np.asarray(running_mean, dtype)),
        "running_var": (np.ones(c, dtype) if running_var is None
                        else np.asarray(running_var, dtype)),
        "momentum": np.array(momentum),
        "eps": np.array(eps),
    }


def _training_cases(rng):
    single = _bn_case(rng.normal(size=(1, 1, 3)))
    single["must_raise"] = np.array(1)
    return [
        # square batches first: code that reduces over the wrong axis still runs on them
        ("3 steps of a batch of 4 tokens, C = 4", _bn_case(rng.normal(size=(3, 4, 4)))),
        ("5 steps of a batch of 8 tokens, C = 5, data N(3, 2), random gamma and beta",
         _bn_case(rng.normal(3.0, 2.0, size=(5, 8, 5)), gamma=rng.normal(size=5),
                  beta=rng.normal(size=5))),
        ("4 steps with momentum 0.3 and eps 1e-3, starting from running mean 1, var 2",
         _bn_case(rng.normal(-1.0, 3.0, size=(4, 6, 4)), running_mean=np.ones(4),
                  running_var=np.full(4, 2.0), momentum=0.3, eps=1e-3)),
        ("2 steps of a batch of 2 tokens (the smallest batch training allows)",
         _bn_case(rng.normal(size=(2, 2, 3)))),
        ("3 steps of a float32 batch of 16 tokens, C = 8",
         _bn_case(rng.normal(1.0, 2.0, size=(3, 16, 8)).astype(np.float32))),
        ("a training batch of one token (must raise ValueError)", single),
    ]


def _eval_cases(rng):
    return [
        ("a batch of 4 tokens, C = 3, running mean [1, -1, 0.5], var [4, 0.25, 1]",
         _bn_case(rng.normal(size=(4, 3)), running_mean=[1.0, -1.0, 0.5],
                  running_var=[4.0, 0.25, 1.0])),
        ("a single token (a batch of one works in eval mode)",
         _bn_case(rng.normal(size=(1, 5)), running_mean=rng.normal(size=5),
                  running_var=rng.uniform(0.5, 2.0, size=5))),
        ("a batch of 6 tokens, C = 6, random gamma and beta, momentum 0.3",
         _bn_case(rng.normal(2.0, 3.0, size=(6, 6)), gamma=rng.normal(size=6),
                  beta=rng.normal(size=6), running_mean=rng.normal(size=6),
                  running_var=rng.uniform(0.5, 2.0, size=6), momentum=0.3)),
        ("a float32 batch of 8 tokens, C = 4, eps 1e-3",
         _bn_case(rng.normal(size=(8, 4)).astype(np.float32),
                  running_mean=rng.normal(size=4), running_var=rng.uniform(0.5, 2.0, size=4),
                  eps=1e-3)),
    ]


def _reference_training(case):
    """The reference's y, running means and running variances, step by step."""
    mean, var = case["running_mean"], case["running_var"]
    ys, means, variances = [], [], []
    for batch in case["x"]:
        y, mean, var = batchnorm.batch_norm(batch, case["gamma"], case["beta"], mean, var,
                                            True, float(case["momentum"]), float(case["eps"]))
        ys.append(y)
        means.append(mean)
        variances.append(var)
    return np.stack(ys), np.stack(means), np.stack(variances)


def _running_stats_variant(case, *, unbiased, weight_on_new):
    """Running statistics per step for a variant of the update rule."""
    mean = case["running_mean"].astype(np.float64)
    var = case["running_var"].astype(np.float64)
    means, variances = [], []
    for batch in case["x"].astype(np.float64):
        n = batch.shape[0]
        batch_var = batch.var(axis=0) * (n / (n - 1) if unbiased else 1.0)
        mean = (1 - weight_on_new) * mean + weight_on_new * batch.mean(axis=0)
        var = (1 - weight_on_new) * var + weight_on_new * batch_var
        means.append(mean)
        variances.append(var)
    return np.stack(means), np.stack(variances)


def _training_output_hint(case, y):
    x = case["x"].astype(np.float64)  # steps, N, C
    gamma, beta, eps = case["gamma"], case["beta"], float(case["eps"])
    mean0, var0 = x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True)
    row_mean, row_var = x.mean(axis=2, keepdims=True), x.var(axis=2, keepdims=True)
    all_mean, all_var = x.mean(axis=(1, 2), keepdims=True), x.var(axis=(1, 2), keepdims=True)
    n = x.shape[1]
    candidates = {
        "batch norm normalizes each feature (a column) over the batch: take the mean and "
        "variance over axis 0 (the tokens), not over each token's features (that is layer "
        "norm)": gamma * (x - row_mean) / np.sqrt(row_var + eps) + beta,
        "take one mean and one variance per feature (column), not one for the whole batch":
            gamma * (x - all_mean) / np.sqrt(all_var + eps) + beta,
        "normalize with the biased variance (divide by N); the unbiased one (N - 1) is only "
        "for updating running_var": gamma * (x - mean0) / np.sqrt(var0 * n / (n - 1) + eps) + beta,
        "eps goes inside the square root: (x - mean) / sqrt(var + eps)":
            gamma * (x - mean0) / (np.sqrt(var0) + eps) + beta,
        "gamma scales and beta shifts: gamma * x_hat + beta":
            beta * (x - mean0) / np.sqrt(var0 + eps) + gamma,
    }
    _, means, variances = _reference_training(case)
    previous_mean = np.concatenate([case["running_mean"][None], means[:-1]])[:, None, :]
    previous_var = np.concatenate([case["running_var"][None], variances[:-1]])[:, None, :]
    candidates["in training mode normalize with the batch's own mean and variance; the "
               "running statistics are only for eval mode"] = (
        gamma * (x - previous_mean) / np.sqrt(previous_var + eps) + beta)
    return _first_matching_hint(y, candidates, case["x"].dtype)


_REVERSED_MOMENTUM = (
    "in PyTorch momentum is the weight of the NEW value: running = (1 - momentum) * running "
    "+ momentum * batch. You used the opposite convention (CS231n's, where momentum = 0.9 "
    "is the weight of the old value)")


def _running_stat_hint(case, actual, which):
    momentum = float(case["momentum"])
    index = 0 if which == "mean" else 1

    def variant(unbiased, weight_on_new):
        return _running_stats_variant(case, unbiased=unbiased, weight_on_new=weight_on_new)[index]

    candidates = {
        _REVERSED_MOMENTUM: variant(True, 1 - momentum),
        "update running_var with the unbiased variance of the batch (divide by N - 1), "
        "even though x is normalized with the biased one (divide by N)": variant(False, momentum),
        _REVERSED_MOMENTUM + "; also, running_var takes the unbiased variance (N - 1)":
            variant(False, 1 - momentum),
        "training mode moves the running statistics towards the batch's: "
        "running = (1 - momentum) * running + momentum * batch":
            variant(True, 0.0),
        "blend the batch's statistic into the running one with weight momentum; "
        "do not replace it": variant(True, 1.0),
    }
    return _first_matching_hint(actual, candidates, case["x"].dtype)


def _judge_batch_norm_training(case, output):
    if "must_raise" in case:
        raised = str(output["raised"])
        if raised_as_asked(output):
            return None
        what = "returned normally" if raised == "nothing" else f"raised {raised}"
        return ("a training batch with one value per feature has no variance to measure: "
                f"raise a ValueError, as torch does (your code {what})")
    dtype = case["x"].dtype
    ys, means, variances = _reference_training(case)
    problem = mismatch(output["y"], ys, dtype=dtype, what="your y")
    if problem:
        return _with_hint(problem, _training_output_hint(case, output["y"]))
    for which, expected in (("mean", means), ("var", variances)):
        actual = output[f"running_{which}"]
        problem = mismatch(actual, expected, dtype=dtype,
                           what=f"your running_{which} after each step")
        if problem:
            return _with_hint(problem, _running_stat_hint(case, actual, which))
    return None


def _judge_batch_norm_eval(case, output):
    x, dtype = case["x"], case["x"].dtype
    gamma, beta, eps = case["gamma"], case["beta"], float(case["eps"])
    mean, var = case["running_mean"], case["running_var"]
    expected, _, _ = batchnorm.batch_norm(x, gamma, beta, mean, var, False,
                                          float(case["momentum"]), eps)
    problem = mismatch(output["y"], expected, dtype=dtype, what="your y")
    if problem:
        x64 = x.astype(np.float64)
        candidates = {
            "eval mode normalizes with the running mean and variance, not with the batch's":
                gamma * (x64 - x64.mean(0)) / np.sqrt(x64.var(0) + eps) + beta,
            "eps goes inside the square root: sqrt(running_var + eps)":
                gamma * (x64 - mean) / (np.sqrt(var) + eps) + beta,
            "running_var is a variance: divide by its square root":
                gamma * (x64 - mean) / (var + eps) + beta,
        }
        return _with_hint(problem, _first_matching_hint(output["y"], candidates, dtype))
    for which in ("mean", "var"):
        problem = mismatch(output[f"running_{which}"], case[f"running_{which}"], dtype=dtype,
                           what=f"the running_{which} you returned")
        if problem:
            return problem + ". Eval mode leaves the running statistics as they are"
    return None


# ---------------------------------------------------------------- rms norm


def _rms_case(x, gamma=None, eps=1e-5):
    d = x.shape[-1]
    return {"x": x, "gamma": np.ones(d, x.dtype) if gamma is None else np.asarray(gamma, x.dtype),
            "eps": np.array(eps)}


def _rms_cases(rng):
    return [
        ("x = [2, 4, 6, 8]", _rms_case(np.array([2.0, 4.0, 6.0, 8.0]))),
        ("a batch of 5 tokens, d = 8, random gamma",
         _rms_case(rng.normal(size=(5, 8)), rng.normal(size=8))),
        ("tokens with an offset (N(4, 1)), where RMSNorm and layer norm differ",
         _rms_case(rng.normal(4.0, 1.0, size=(3, 16)))),
        ("a 3-D batch (2, 3, 16) with random gamma",
         _rms_case(rng.normal(size=(2, 3, 16)), rng.normal(size=16))),
        ("a token of zeros", _rms_case(np.zeros(6))),
        ("x = [2, 4, 6, 8] with eps = 1", _rms_case(np.array([2.0, 4.0, 6.0, 8.0]), eps=1.0)),
        ("a float32 batch (4, 64)", _rms_case(rng.normal(size=(4, 64)).astype(np.float32))),
    ]


def _judge_rms_norm(case, output):
    x, gamma, eps = case["x"], case["gamma"], float(case["eps"])
    expected = rmsnorm.rms_norm(x, gamma, eps)
    problem = mismatch(output["y"], expected, dtype=x.dtype)
    if problem is None:
        return None
    x64 = x.astype(np.float64)
    mean_square = (x64**2).mean(-1, keepdims=True)
    centred = x64 - x64.mean(-1, keepdims=True)
    candidates = {
        "RMSNorm does not subtract the mean: divide x itself by sqrt(mean(x ** 2) + eps)":
            gamma * centred / np.sqrt((centred**2).mean(-1, keepdims=True) + eps),
        "divide by sqrt(mean(x ** 2) + eps), the root mean square, not by the standard "
        "deviation": gamma * x64 / np.sqrt(x64.var(-1, keepdims=True) + eps),
        "eps goes inside the square root: sqrt(mean(x ** 2) + eps)":
            gamma * x64 / (np.sqrt(mean_square) + eps),
        "take the square root of the mean square": gamma * x64 / (mean_square + eps),
        "average the squares (divide by d), do not just sum them":
            gamma * x64 / np.sqrt((x64**2).sum(-1, keepdims=True) + eps),
    }
    if x.ndim > 1:
        candidates["average over each token's features (the last axis), not over the batch"] = (
            gamma * x64 / np.sqrt((x64**2).mean(0, keepdims=True) + eps))
    return _with_hint(problem, _first_matching_hint(output["y"], candidates, x.dtype))


# ---------------------------------------------------------------- group norm


def _gn_case(x, num_groups, gamma=None, beta=None, eps=1e-5):
    c = x.shape[1]
    return {
        "x": x,
        "num_groups": np.array(num_groups),
        "gamma": np.ones(c, x.dtype) if gamma is None else np.asarray(gamma, x.dtype),
        "beta": np.zeros(c, x.dtype) if beta is None else np.asarray(beta, x.dtype),
        "eps": np.array(eps),
    }


def _group_cases(rng):
    indivisible = _gn_case(rng.normal(size=(2, 6, 2)), 4)
    indivisible["must_raise"] = np.array(1)
    # channel offsets make groups of different channels differ, so wrong groupings show
    offsets = np.arange(8.0)[None, :, None]
    return [
        ("x (2, 6, 4) with 3 groups", _gn_case(rng.normal(size=(2, 6, 4)) + offsets[:, :6], 3)),
        ("x (3, 4, 5) with 2 groups, random gamma and beta",
         _gn_case(rng.normal(1.0, 2.0, size=(3, 4, 5)), 2, rng.normal(size=4),
                  rng.normal(size=4))),
        ("1 group: layer norm over (C, L) of each example",
         _gn_case(rng.normal(size=(2, 4, 3)) + offsets[:, :4], 1)),
        ("C groups: instance norm (each channel of each example on its own)",
         _gn_case(rng.normal(size=(3, 4, 5)) + offsets[:, :4], 4)),
        ("an image batch (2, 8, 3, 3) with 4 groups",
         _gn_case(rng.normal(size=(2, 8, 3, 3)) + offsets[..., None], 4, rng.normal(size=8),
                  rng.normal(size=8))),
        ("a float32 batch (4, 8, 16) with 2 groups, eps 1e-3",
         _gn_case((rng.normal(size=(4, 8, 16)) + offsets).astype(np.float32), 2, eps=1e-3)),
        ("C = 6 channels in 4 groups (must raise ValueError)", indivisible),
    ]


def _normalize_blocks(x, shape, axes, eps, eps_outside_root=False):
    """Normalize x reshaped to `shape` over `axes`, then give it x's shape back."""
    blocks = x.reshape(shape)
    mean = blocks.mean(axis=axes, keepdims=True)
    var = blocks.var(axis=axes, keepdims=True)
    spread = np.sqrt(var) + eps if eps_outside_root else np.sqrt(var + eps)
    return ((blocks - mean) / spread).reshape(x.shape)


def _judge_group_norm(case, output):
    num_groups = int(case["num_groups"])
    if "must_raise" in case:
        raised = str(output["raised"])
        if raised_as_asked(output):
            return None
        what = "returned normally" if raised == "nothing" else f"raised {raised}"
        return (f"{case['x'].shape[1]} channels cannot be split into {num_groups} equal groups: "
                f"raise a ValueError, as torch does (your code {what})")
    x, gamma, beta, eps = case["x"], case["gamma"], case["beta"], float(case["eps"])
    expected = batchnorm.group_norm(x, num_groups, gamma, beta, eps)
    problem = mismatch(output["y"], expected, dtype=x.dtype)
    if problem is None:
        return None
    x64 = x.astype(np.float64)
    n, c = x.shape[:2]
    affine_shape = (1, c) + (1,) * (x.ndim - 2)
    g, b = gamma.reshape(affine_shape), beta.reshape(affine_shape)
    # channel k in group k % G: every G-th channel grouped instead of consecutive ones
    strided = np.swapaxes(x64.reshape(n, c // num_groups, num_groups, -1), 1, 2)
    interleaved = np.swapaxes(
        _normalize_blocks(strided, (n, num_groups, -1), (2,), eps).reshape(strided.shape), 1, 2)
    candidates = {
        "num_groups is how many groups there are, each of C // num_groups consecutive "
        "channels, not how many channels a group holds":
            _normalize_blocks(x64, (n, c // num_groups, -1), (2,), eps) * g + b,
        "group consecutive channels (0 .. C/G - 1 form the first group), not every G-th "
        "channel": interleaved.reshape(x.shape) * g + b,
        "take the statistics of each example on its own, not over the batch":
            _normalize_blocks(x64, (n, num_groups, -1), (0, 2), eps) * g + b,
        "normalize over the group's channels AND positions of one example, not each "
        "channel on its own": _normalize_blocks(x64, (n, c, -1), (2,), eps) * g + b,
        "one set of statistics per group of channels, not one per example":
            _normalize_blocks(x64, (n, 1, -1), (2,), eps) * g + b,
        "eps goes inside the square root: sqrt(var + eps)":
            _normalize_blocks(x64, (n, num_groups, -1), (2,), eps, eps_outside_root=True) * g + b,
    }
    return _with_hint(problem, _first_matching_hint(output["y"], candidates, x.dtype))


# ---------------------------------------------------------------- questions

_QUESTIONS = {
    "layer_norm": "Does layer norm's output for a token change with its batch-mates?",
    "rms_norm": "Does RMSNorm's output for a token change with its batch-mates?",
    "group_norm": "Does group norm's output for an example change with its batch-mates?",
    "batch_norm_training": "Does batch norm's output in training mode change with the "
                           "batch-mates?",
    "batch_norm_eval": "Does batch norm's output in eval mode change with the batch-mates?",
    "groups_for_layer_norm": "With how many groups is group norm of x (N, 6, L) layer norm "
                             "over (C, L)?",
    "groups_for_instance_norm": "With how many groups is group norm of x (N, 6, L) instance "
                                "norm?",
}


def _depends_on_batch(normalize, token, mates, other_mates):
    """Does normalize(batch)[0] move when token's batch-mates change?"""
    first = normalize(np.concatenate([token[None], mates]))[0]
    second = normalize(np.concatenate([token[None], other_mates]))[0]
    return not np.allclose(first, second)


def _true_answers():
    """Each answer worked out by running the references, not typed in."""
    rng = np.random.default_rng(2)
    token, mates, other_mates = rng.normal(size=6), rng.normal(size=(3, 6)), rng.normal(
        3.0, 2.0, size=(5, 6))
    running_mean, running_var = rng.normal(size=6), rng.uniform(0.5, 2.0, size=6)

    def batch_norm_in(training):
        return lambda batch: batchnorm.batch_norm(batch, None, None, running_mean, running_var,
                                                  training)[0]

    def as_examples(normalize):  # tokens of 6 features become examples (6 channels, 2 positions)
        return lambda batch: normalize(np.repeat(batch[:, :, None], 2, axis=2)
                                       + np.arange(2.0))

    depends = {
        "layer_norm": recipe.layer_norm,
        "rms_norm": rmsnorm.rms_norm,
        "group_norm": as_examples(lambda batch: batchnorm.group_norm(batch, 3)),
        "batch_norm_training": batch_norm_in(True),
        "batch_norm_eval": batch_norm_in(False),
    }
    answers = {name: str(_depends_on_batch(fn, token, mates, other_mates))
               for name, fn in depends.items()}
    examples = rng.normal(size=(2, 6, 5))
    whole_example = recipe.layer_norm(examples.reshape(2, -1)).reshape(examples.shape)
    per_channel = recipe.layer_norm(examples)
    divisors = [g for g in range(1, 7) if 6 % g == 0]
    answers["groups_for_layer_norm"] = str(next(
        g for g in divisors if np.allclose(batchnorm.group_norm(examples, g), whole_example)))
    answers["groups_for_instance_norm"] = str(next(
        g for g in divisors if np.allclose(batchnorm.group_norm(examples, g), per_channel)))
    return answers


def _same_answer(given, truth):
    if given == truth:
        return True
    try:  # 6, 6.0 and "6" are the same number of groups
        return float(given) == float(truth)
    except ValueError:
        return False


def _judge_batch_dependence(case, output):
    truths = _true_answers()
    missing = [name for name in truths if name not in output]
    if missing:
        return f"no answer given for {', '.join(missing)}"
    wrong = [name for name, truth in truths.items() if not _same_answer(str(output[name]), truth)]
    if wrong:
        return "not yet right: " + "; ".join(
            f"{_QUESTIONS[name]} (you answered {output[name]})" for name in wrong)
    return None


CHECKS = {
    "rows_batch_norm_training": Check(_training_cases, _judge_batch_norm_training),
    "rows_batch_norm_eval": Check(_eval_cases, _judge_batch_norm_eval),
    "rows_rms_norm": Check(_rms_cases, _judge_rms_norm),
    "rows_group_norm": Check(_group_cases, _judge_group_norm),
    "rows_batch_dependence": Check(lambda rng: [("your seven answers", {})],
                                   _judge_batch_dependence),
}
