"""Unit 02 checks, the grader-facing half: inputs, references, diagnoses."""

from fractions import Fraction

import numpy as np

from normref import batchnorm
from normref.checks._registry import Check
from normref.checks.rows_probes import GROUP_NORM_MARK
from normref.checks.tolerances import matches, mismatch, number_from_answer

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


def _judged_at(dtype, *outputs):
    """The precision a result is judged at: the input's, or float32's where the input
    is float64 and the result came back in float32. Returning float32 for float64
    input breaks the unit's precision rule, and that slip is charged once, by
    rows_precision_kept, not again by every function's own check."""
    if np.dtype(dtype) == np.float64 and any(
            np.asarray(output).dtype == np.float32 for output in outputs):
        return np.dtype(np.float32)
    return dtype


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
        # eps as large as the groups' variance: where eps goes, and whether it is there at
        # all, changes every output by a tenth or more (eps 1e-5 hides all three)
        ("x (2, 4, 3) with 2 groups and eps 0.5",
         _gn_case(rng.normal(size=(2, 4, 3)) + offsets[:, :4], 2, eps=0.5)),
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
    dtype = _judged_at(x.dtype, output["y"])
    problem = mismatch(output["y"], expected, dtype=dtype)
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
        "your output has no eps in it: add the eps you are given to the variance, "
        "sqrt(var + eps)": _normalize_blocks(x64, (n, num_groups, -1), (2,), 0.0) * g + b,
    }
    return _with_hint(problem, _first_matching_hint(output["y"], candidates, dtype))


# ---------------------------------------------------------------- layer norm over channels


def _channel_cases(rng):
    offsets = np.arange(8.0)[None, :, None]  # every channel its own offset
    return [
        # C != L: a reshape that mixes channels and positions is not instance norm here
        ("x (2, 4, 6), channels at different offsets",
         {"x": rng.normal(size=(2, 4, 6)) + offsets[:, :4], "eps": np.array(1e-5)}),
        ("x (3, 6, 5)", {"x": rng.normal(1.0, 2.0, size=(3, 6, 5)), "eps": np.array(1e-5)}),
        ("an image batch (2, 3, 4, 5)",
         {"x": rng.normal(size=(2, 3, 4, 5)) + offsets[:, :3, :, None], "eps": np.array(1e-5)}),
        ("a float32 batch (2, 8, 16) with eps 1e-3",
         {"x": (rng.normal(size=(2, 8, 16)) + offsets).astype(np.float32),
          "eps": np.array(1e-3)}),
    ]


def _judge_channel_layer_norm(case, output):
    x, eps = case["x"], float(case["eps"])
    dtype = _judged_at(x.dtype, output["y"])
    # the mark, where the grader's group_norm could be swapped in (calls -1: it could not)
    mark = 1 + GROUP_NORM_MARK if int(output["group_norm_calls"]) != -1 else 1.0
    unmarked = batchnorm.channel_layer_norm(x, eps)
    # judged with the mark taken off both sides, so that the values the feedback quotes
    # are layer norm's own, not the grader's group_norm's marked ones
    problem = mismatch(np.asarray(output["y"]) / mark, unmarked, dtype=dtype,
                       what="your channel_layer_norm")
    calls = int(output["group_norm_calls"])
    if problem is None and calls > 1:
        return (f"your channel_layer_norm gives the right values, but it called group_norm "
                f"{calls} times for one input, where the exercise asks for one call: lay "
                "every position of every example out as an example of its own, so that a "
                "single group_norm call normalizes them all")
    if problem is None:
        return None
    if mark != 1.0 and matches(output["y"], unmarked, dtype=dtype):
        return ("your channel_layer_norm gives layer norm over the channels, but not "
                "through group_norm: the grader's group_norm marks what it returns, and "
                "your output does not carry the mark. Let one call of group_norm do the "
                "normalizing, with no mean or variance of your own")
    x64 = x.astype(np.float64)
    c = x.shape[1]
    candidates = {
        "group_norm(x, 1, ...) normalizes everything one example holds, its channels AND "
        "positions; here each position is normalized over its channels alone, so make "
        "every position an example of its own first": batchnorm.group_norm(x64, 1, eps=eps),
        "group_norm(x, C, ...) is instance norm, each channel over its positions; here "
        "each position is normalized over its channels": batchnorm.group_norm(x64, c, eps=eps),
        "a reshape keeps the order of the values: x.reshape(-1, C, 1) mixes channels and "
        "positions; move the channel axis last first (np.moveaxis or a transpose), then "
        "reshape, and move it back at the end":
            batchnorm.group_norm(x64.reshape(-1, c, 1), 1, eps=eps).reshape(x.shape),
    }
    if eps != 1e-5:  # group_norm's own default eps, or none, in place of the one given
        candidates[f"your output is layer norm over the channels with eps = 1e-5 (or 0), "
                   f"not the eps = {eps:g} this call passed: hand eps on to group_norm"] = \
            batchnorm.channel_layer_norm(x64, 1e-5)
    candidates = {hint: wrong * mark for hint, wrong in candidates.items()}
    return _with_hint(problem, _first_matching_hint(output["y"], candidates, dtype))


# ---------------------------------------------------------------- batch norm, running stats


def _bn_case(x, convention, momentum, *, gamma=None, beta=None, running_mean=None,
             running_var=None, eps=1e-5):
    """x: (steps, N, C) or (steps, N, C, L), fed one step after another."""
    c, dtype = x.shape[2], x.dtype
    return {
        "x": x,
        "gamma": np.ones(c, dtype) if gamma is None else np.asarray(gamma, dtype),
        "beta": np.zeros(c, dtype) if beta is None else np.asarray(beta, dtype),
        "running_mean": (np.zeros(c, dtype) if running_mean is None
                         else np.asarray(running_mean, dtype)),
        "running_var": (np.ones(c, dtype) if running_var is None
                        else np.asarray(running_var, dtype)),
        "momentum": np.array(momentum),
        "convention": np.array(convention),
        "eps": np.array(eps),
    }


def _train_cases(rng):
    one_token = _bn_case(rng.normal(size=(1, 1, 3)), "pytorch", 0.1)
    one_token["must_raise"] = np.array(1)
    one_value = _bn_case(rng.normal(size=(1, 1, 3, 1)), "cs231n", 0.9)
    one_value["must_raise"] = np.array(1)
    return [
        # square batches first: code that reduces over the wrong axis still runs on them
        ("pytorch, momentum 0.1: 3 steps of a batch of 4 tokens, C = 4",
         _bn_case(rng.normal(size=(3, 4, 4)), "pytorch", 0.1)),
        ("cs231n, momentum 0.9: 3 steps of a batch of 4 tokens, C = 4",
         _bn_case(rng.normal(size=(3, 4, 4)), "cs231n", 0.9)),
        ("pytorch, momentum 0.3: 4 steps of x (6, 3, 5), random gamma and beta, "
         "starting from running mean 1 and var 2",
         _bn_case(rng.normal(3.0, 2.0, size=(4, 6, 3, 5)), "pytorch", 0.3,
                  gamma=rng.normal(size=3), beta=rng.normal(size=3),
                  running_mean=np.ones(3), running_var=np.full(3, 2.0))),
        ("cs231n, momentum 0.99, eps 1e-3: 3 steps of x (2, 3, 4)",
         _bn_case(rng.normal(-1.0, 3.0, size=(3, 2, 3, 4)), "cs231n", 0.99, eps=1e-3)),
        ("pytorch: one example of 5 positions, x (1, 3, 5), trains (5 values per channel)",
         _bn_case(rng.normal(size=(2, 1, 3, 5)), "pytorch", 0.1)),
        ("pytorch: 2 steps of a batch of 2 tokens (the smallest batch training allows)",
         _bn_case(rng.normal(size=(2, 2, 3)), "pytorch", 0.1)),
        ("cs231n, momentum 0.9: 3 steps of a float32 batch of 16 tokens, C = 8",
         _bn_case(rng.normal(1.0, 2.0, size=(3, 16, 8)).astype(np.float32), "cs231n", 0.9,
                  gamma=rng.normal(size=8), beta=rng.normal(size=8))),
        ("pytorch: a batch of one token (must raise ValueError)", one_token),
        ("cs231n: x (1, 3, 1), one value per channel (must raise ValueError)", one_value),
    ]


def _train_part(case):
    """Which graded cell of Exercise 3 a case belongs to: a batch of one example (it
    trains when its positions give two values per channel, and raises otherwise), or
    else its convention."""
    return "one_example" if case["x"].shape[1] == 1 else str(case["convention"])


def _train_cases_of(part):
    """The cases of _train_cases that one graded cell of Exercise 3 judges, so that a
    slip in one part (the one-example guard, say) costs only that part's points."""
    return lambda rng: [(label, case) for label, case in _train_cases(rng)
                        if _train_part(case) == part]


def _steps(case, *, weight_on_new, unbiased, count_positions=True):
    """Reference-like running statistics after each step, with the knobs a
    mistake turns: the weight on the new value, the variance flavour, and
    whether n counts the positions."""
    mean, var = case["running_mean"].astype(np.float64), case["running_var"].astype(np.float64)
    means, variances = [], []
    for batch in case["x"].astype(np.float64):
        axes = (0,) if batch.ndim == 2 else (0, 2)
        n = batch.size // batch.shape[1] if count_positions else batch.shape[0]
        batch_var = batch.var(axis=axes) * (n / (n - 1) if unbiased and n > 1 else 1.0)
        mean = (1 - weight_on_new) * mean + weight_on_new * batch.mean(axis=axes)
        var = (1 - weight_on_new) * var + weight_on_new * batch_var
        means.append(mean)
        variances.append(var)
    return np.stack(means), np.stack(variances)


def _reference_train(case):
    mean, var = case["running_mean"], case["running_var"]
    ys, means, variances = [], [], []
    for batch in case["x"]:
        y, mean, var = batchnorm.batch_norm_train(
            batch, case["gamma"], case["beta"], mean, var, float(case["momentum"]),
            str(case["convention"]), float(case["eps"]))
        ys.append(y)
        means.append(mean)
        variances.append(var)
    return np.stack(ys), np.stack(means), np.stack(variances)


def _running_stat_hint(case, actual, which):
    m, convention = float(case["momentum"]), str(case["convention"])
    pytorch = convention == "pytorch"
    right_weight, wrong_weight = (m, 1 - m) if pytorch else (1 - m, m)
    index = 0 if which == "mean" else 1

    def variant(**knobs):
        return _steps(case, **knobs)[index]

    swapped = ("the conventions weigh the new batch value differently: PyTorch's momentum "
               "is the weight of the NEW value, CS231n's the weight of the OLD one")
    candidates = {
        swapped: variant(weight_on_new=wrong_weight, unbiased=pytorch),
        swapped + "; and each convention has its own variance (PyTorch unbiased, CS231n "
                  "biased)": variant(weight_on_new=wrong_weight, unbiased=not pytorch),
        ("PyTorch's running_var follows the unbiased batch variance (divide by n - 1)"
         if pytorch else "CS231n's running_var follows the biased batch variance (divide "
                         "by n), the one it normalizes with"):
            variant(weight_on_new=right_weight, unbiased=not pytorch),
        "n in n / (n - 1) is the number of values per channel: N * L for x (N, C, L)":
            variant(weight_on_new=right_weight, unbiased=pytorch, count_positions=False),
        "a training step moves the running statistics towards the batch's":
            variant(weight_on_new=0.0, unbiased=pytorch),
        "blend the batch's statistic into the running one; do not replace it":
            variant(weight_on_new=1.0, unbiased=pytorch),
    }
    return _first_matching_hint(actual, candidates, case["x"].dtype)


def _output_hint(case, y):
    x = case["x"].astype(np.float64)  # steps, N, C, *
    shape = (1, 1, -1) + (1,) * (x.ndim - 3)
    gamma, beta = case["gamma"].reshape(shape), case["beta"].reshape(shape)
    eps = float(case["eps"])
    axes = (1,) if x.ndim == 3 else (1, 3)
    mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    n = x[0].size // x.shape[2]

    def normalized(m, v):
        return gamma * (x - m) / np.sqrt(v + eps) + beta

    candidates = {
        "batch norm takes one mean and one variance per channel, over the batch (and the "
        "positions), not per token": normalized(x.mean(axis=2, keepdims=True),
                                                 x.var(axis=2, keepdims=True)),
        "normalize with the biased batch variance (divide by n) under both conventions":
            normalized(mean, var * n / max(n - 1, 1)),
        "eps goes inside the square root: (x - mean) / sqrt(var + eps)":
            gamma * (x - mean) / (np.sqrt(var) + eps) + beta,
    }
    if x.ndim == 4:
        candidates["for x (N, C, L) a channel's statistics cover the batch AND the positions"] = (
            normalized(x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True)))
    return _first_matching_hint(y, candidates, case["x"].dtype)


def _judge_batch_norm_train(case, output):
    if "must_raise" in case:
        raised = str(output["raised"])
        if raised_as_asked(output):
            return None
        what = "returned normally" if raised == "nothing" else f"raised {raised}"
        return ("one value per channel has no variance to measure: raise a ValueError, as "
                f"torch does (your code {what})")
    dtype = _judged_at(case["x"].dtype, output["y"], output["running_mean"],
                       output["running_var"])
    ys, means, variances = _reference_train(case)
    problem = mismatch(output["y"], ys, dtype=dtype, what="your y")
    if problem:
        return _with_hint(problem, _output_hint(case, output["y"]))
    for which, expected in (("mean", means), ("var", variances)):
        actual = output[f"running_{which}"]
        problem = mismatch(actual, expected, dtype=dtype,
                           what=f"your running_{which} after each step")
        if problem:
            return _with_hint(problem, _running_stat_hint(case, actual, which))
    return None


# ---------------------------------------------------------------- questions


def _block_outputs_moved(shape, num_groups):
    """How many outputs of a block, the reference spatial batch norm (training mode)
    and then group norm, move when x's first value moves: counted by running it, for
    shapes small enough to run."""
    x = np.random.default_rng(0).normal(size=shape)
    nudged = x.copy()
    nudged.flat[0] += 1.0

    def block(values):
        return batchnorm.group_norm(batchnorm.spatial_batch_norm_forward(
            values, np.ones(shape[1]), np.zeros(shape[1])), num_groups)

    moved = ~np.isclose(block(x), block(nudged), rtol=0, atol=1e-12)
    return int(moved.sum())


def block_outputs_moved_by_rule(shape, num_groups):
    """The same count, derived: batch norm moves channel 0 of every example at every
    position (N * H * W values); group norm then moves, in every example, the whole
    group holding channel 0, its C / G channels at every position."""
    n, c = shape[:2]
    positions = int(np.prod(shape[2:]))
    return n * (c // num_groups) * positions


# far too large to run (537 million values, 4.3 GB a copy in float64): the count must
# be derived, and block_outputs_moved_by_rule is tested against _block_outputs_moved
_NUDGE_SHAPE, _NUDGE_GROUPS = (64, 512, 128, 128), 32


def _judge_nudge_answer(case, output):
    given = number_from_answer(output.get("outputs_moved"))
    if given is None:
        return "give OUTPUTS_MOVED as a number (you gave " \
               f"{output.get('outputs_moved')})"
    truth = block_outputs_moved_by_rule(_NUDGE_SHAPE, _NUDGE_GROUPS)
    if given == truth:
        return None
    n, c, h, w = _NUDGE_SHAPE
    per_group = c // _NUDGE_GROUPS
    slips = {
        per_group * h * w: "that is what group norm alone moves, in one example; batch norm "
                           "first spreads the nudge to channel 0 of every example",
        n * h * w: "that is what batch norm alone moves, channel 0 of every example; group "
                   "norm then moves the rest of channel 0's group in each example",
        n * _NUDGE_GROUPS * h * w: "G = 32 is the number of groups; each holds C / G = "
                                   f"{per_group} channels",
        c * h * w: "batch norm's statistics cross from one example to the others: channel 0 "
                   "moves in all of them, and group norm then moves one group in each",
        n * c * h * w: "group norm keeps the groups apart: only the group holding channel 0 "
                       "moves, in each example",
    }
    hint = slips.get(given, "follow the nudge through both norms: which outputs share "
                            "statistics with a moved value, first across the batch, then "
                            "inside each example")
    return f"OUTPUTS_MOVED: {output['outputs_moved']} is not right. Hint: {hint}"


# the questions ask about batches of 8; the experiment, which prints its eval std, used 4
_VARIANCE, _VALUES_PER_CHANNEL, _EXPERIMENT_VALUES = 4.0, 8, 4


def _biased_settles_at(values):
    """Where CS231n's running_var settles: the biased variance of `values` values
    averages sigma^2 (n - 1) / n, and running_var is an average of them."""
    return _VARIANCE * (values - 1) / values


def eval_std_after(values):
    """The eval-mode std of data of variance _VARIANCE normalized with CS231n's running
    statistics, settled after training on batches of `values` values per channel."""
    return np.sqrt(_VARIANCE / (_biased_settles_at(values) + 1e-5))


def _judge_running_var_answers(case, output):
    var_truth = _biased_settles_at(_VALUES_PER_CHANNEL)
    # eval divides data of std sigma by sqrt(running_var + eps), with running_var
    # settled at the biased average for batches of 8
    std_truth = eval_std_after(_VALUES_PER_CHANNEL)
    wrong = []
    var_given = number_from_answer(output.get("cs231n_var_for_8"))
    if var_given is None or abs(var_given - var_truth) > 0.1:
        wrong.append(f"CS231N_RUNNING_VAR_FOR_8 (you answered {output.get('cs231n_var_for_8')}"
                     "): what does the biased variance of 8 values average to?")
    std_given = number_from_answer(output.get("cs231n_eval_std"))
    if std_given is not None and abs(std_given - eval_std_after(_EXPERIMENT_VALUES)) <= 0.01:
        wrong.append(f"CS231N_EVAL_STD (you answered {output.get('cs231n_eval_std')}): that is "
                     "the eval std after training on batches of 4, as in the experiment; the "
                     "question trains on batches of 8, so running_var settles elsewhere")
    elif std_given is None or abs(std_given - std_truth) > 0.01:
        wrong.append(f"CS231N_EVAL_STD (you answered {output.get('cs231n_eval_std')}): in eval "
                     "mode the data's own spread is divided by sqrt(running_var + eps); where "
                     "does CS231n's running_var settle for batches of 8?")
    return "not yet right: " + "; ".join(wrong) if wrong else None


# ---------------------------------------------------------------- images (N, C, H, W)


def _spatial_case(x, gamma, beta, eps=1e-5):
    return {"x": x, "gamma": np.asarray(gamma, x.dtype), "beta": np.asarray(beta, x.dtype),
            "eps": np.array(eps)}


def _spatial_images(rng, shape, dtype=np.float64):
    """Images whose channels sit at their own offsets and scales, so that
    statistics over the wrong axes give visibly wrong outputs."""
    c = shape[1]
    offsets = np.linspace(-3.0, 3.0, c)[None, :, None, None]
    scales = np.linspace(0.5, 2.5, c)[None, :, None, None]
    return (rng.normal(size=shape) * scales + offsets).astype(dtype)


def _spatial_bn_cases(rng):
    def case(label, shape, eps=1e-5, dtype=np.float64):
        c = shape[1]
        return (label, _spatial_case(_spatial_images(rng, shape, dtype),
                                     rng.normal(1.0, 0.5, size=c), rng.normal(size=c), eps))

    return [
        # C = H = W first: code that broadcasts gamma on the wrong axis still runs
        case("x (3, 4, 4, 4), random gamma and beta", (3, 4, 4, 4)),
        case("x (2, 3, 4, 5), random gamma and beta", (2, 3, 4, 5)),
        case("one image, x (1, 3, 5, 2): statistics over its positions only", (1, 3, 5, 2)),
        case("x (4, 2, 3, 3) with eps 1e-3", (4, 2, 3, 3), eps=1e-3),
        case("a float32 batch (5, 6, 4, 3)", (5, 6, 4, 3), dtype=np.float32),
    ]


def _torch_spatial(case):
    """The judge's own reference: torch's batch norm in training mode."""
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(case["x"].astype(np.float64))
    gamma = torch.from_numpy(case["gamma"].astype(np.float64))
    beta = torch.from_numpy(case["beta"].astype(np.float64))
    y = F.batch_norm(x, None, None, gamma, beta, training=True, eps=float(case["eps"]))
    return y.numpy()


def _gamma_on_last_axis(case, normalized):
    """{hint: output} for gamma and beta broadcast along W, where that runs (W == C)."""
    x = case["x"]
    if x.shape[3] != x.shape[1]:
        return {}
    g, b = case["gamma"].astype(np.float64), case["beta"].astype(np.float64)
    return {"gamma and beta hold one number per channel: shape them (1, C, 1, 1) so "
            "that they line up with axis 1, not with the last axis (W)": normalized * g + b}


def _spatial_bn_slips(case):
    x, eps = case["x"].astype(np.float64), float(case["eps"])
    c = x.shape[1]
    g = case["gamma"].astype(np.float64).reshape(1, c, 1, 1)
    b = case["beta"].astype(np.float64).reshape(1, c, 1, 1)
    n_values = x.size // c

    def normalized(axes, **knobs):
        return _normalize_blocks(x, x.shape, axes, eps, **knobs)

    candidates = _gamma_on_last_axis(case, normalized((0, 2, 3)))
    unbiased = ((x - x.mean((0, 2, 3), keepdims=True))
                / np.sqrt(x.var((0, 2, 3), keepdims=True) * n_values / max(n_values - 1, 1)
                          + eps))
    candidates.update({
        "batch norm keeps one mean and one variance per channel, over all N images "
        "and all H x W positions; yours are per image and channel (that is instance "
        "norm): reduce over axes (0, 2, 3)": normalized((2, 3)) * g + b,
        "a channel's statistics cover its H x W positions too, not only the N images: "
        "reduce over axes (0, 2, 3), not axis 0 alone": normalized((0,)) * g + b,
        "batch norm's statistics are per channel across the batch, not per image: "
        "reduce over axes (0, 2, 3), not (1, 2, 3)": normalized((1, 2, 3)) * g + b,
        "normalize with the biased variance (divide by N * H * W)": unbiased * g + b,
        "eps goes inside the square root: sqrt(var + eps)":
            normalized((0, 2, 3), eps_outside_root=True) * g + b,
    })
    return candidates


def _judge_spatial(case, output):
    expected = _torch_spatial(case)
    dtype = _judged_at(case["x"].dtype, output["y"])
    problem = mismatch(output["y"], expected, dtype=dtype)
    if problem is None:
        return None
    slips = _spatial_bn_slips(case)
    return _with_hint(problem, _first_matching_hint(output["y"], slips, dtype))


# ---------------------------------------------------------------- batch norm in eval mode


def _eval_case(rng, shape, dtype=np.float64, eps=1e-5):
    """A batch whose own statistics are far from the running ones, so that code
    normalizing with the batch's statistics gives visibly different outputs."""
    c = shape[1]
    return {
        "x": rng.normal(2.0, 3.0, size=shape).astype(dtype),
        "gamma": rng.normal(1.0, 0.5, size=c).astype(dtype),
        "beta": rng.normal(size=c).astype(dtype),
        "running_mean": rng.normal(size=c).astype(dtype),
        "running_var": rng.uniform(0.5, 4.0, size=c).astype(dtype),
        "eps": np.array(eps),
    }


def _eval_cases(rng):
    return [
        # C = L first: gamma broadcast along the last axis still runs there
        ("x (3, 4, 4), sequences of 4 positions, C = 4", _eval_case(rng, (3, 4, 4))),
        ("a batch of 5 tokens, x (5, 3)", _eval_case(rng, (5, 3))),
        ("one token, x (1, 3): eval mode needs no batch", _eval_case(rng, (1, 3))),
        ("an image batch x (2, 3, 4, 5)", _eval_case(rng, (2, 3, 4, 5))),
        ("one image x (1, 2, 3, 3) with eps 1e-3", _eval_case(rng, (1, 2, 3, 3), eps=1e-3)),
        ("a float32 batch x (8, 6)", _eval_case(rng, (8, 6), dtype=np.float32)),
    ]


def _torch_eval(case):
    """The judge's own reference: torch's batch norm in eval mode, in float64."""
    import torch
    import torch.nn.functional as F

    def t(key):
        return torch.from_numpy(case[key].astype(np.float64))

    return F.batch_norm(t("x"), t("running_mean"), t("running_var"), t("gamma"), t("beta"),
                        training=False, eps=float(case["eps"])).numpy()


def _eval_slips(case):
    x, eps = case["x"].astype(np.float64), float(case["eps"])
    shape = (1, -1) + (1,) * (x.ndim - 2)

    def per_channel(key):
        return case[key].astype(np.float64).reshape(shape)

    g, b = per_channel("gamma"), per_channel("beta")
    mean, var = per_channel("running_mean"), per_channel("running_var")
    candidates = {}
    if x.ndim == 3 and x.shape[2] == x.shape[1]:
        flat = [case[k].astype(np.float64) for k in ("gamma", "beta", "running_mean",
                                                       "running_var")]
        candidates["gamma, beta and the running statistics hold one number per channel: "
                   "shape them (1, C, 1, ...) so that they line up with axis 1, not with "
                   "the last axis"] = (x - flat[2]) / np.sqrt(flat[3] + eps) * flat[0] + flat[1]
    axes = (0,) + tuple(range(2, x.ndim))
    if x.size // x.shape[1] > 1:
        batch = _normalize_blocks(x, x.shape, axes, eps)
        candidates["eval mode normalizes with running_mean and running_var, not with the "
                   "batch's own statistics (that is training mode)"] = batch * g + b
    candidates.update({
        "running_var is a variance: divide by sqrt(running_var + eps), not by "
        "running_var + eps": (x - mean) / (var + eps) * g + b,
        "eps goes inside the square root: sqrt(running_var + eps)":
            (x - mean) / (np.sqrt(var) + eps) * g + b,
        "scale by gamma, then shift by beta: y = gamma * x_hat + beta":
            ((x - mean) / np.sqrt(var + eps) + b) * g,
    })
    return candidates


def _judge_batch_norm_eval(case, output):
    dtype = _judged_at(case["x"].dtype, output["y"])
    for key in ("running_mean", "running_var"):
        if not np.array_equal(output[f"{key}_after"], case[key]):
            return (f"your batch_norm_eval changed the {key} it was given: eval mode reads the "
                    "running statistics and leaves them as they are")
    problem = mismatch(output["y"], _torch_eval(case), dtype=dtype)
    if problem is None:
        return None
    return _with_hint(problem, _first_matching_hint(output["y"], _eval_slips(case), dtype))


# ---------------------------------------------------------------- folding batch norm


def _fold_case(rng, channels, inputs, dtype=np.float64, eps=1e-5, var_low=0.5):
    return {
        "weight": rng.normal(size=(channels, inputs)).astype(dtype),
        "bias": rng.normal(size=channels).astype(dtype),
        "gamma": rng.normal(1.0, 0.5, size=channels).astype(dtype),
        "beta": rng.normal(size=channels).astype(dtype),
        "running_mean": rng.normal(size=channels).astype(dtype),
        "running_var": rng.uniform(var_low, 4.0, size=channels).astype(dtype),
        "eps": np.array(eps),
    }


def _fold_cases(rng):
    return [
        # a square weight first: scaling its columns instead of its rows still runs
        ("a Linear(4, 4) then BatchNorm1d(4)", _fold_case(rng, 4, 4)),
        ("a Linear(6, 3) then BatchNorm1d(3)", _fold_case(rng, 3, 6)),
        ("a Linear(2, 5) then BatchNorm1d(5)", _fold_case(rng, 5, 2)),
        ("running variances near 1e-3, eps 1e-3: eps counts",
         _fold_case(rng, 4, 3, eps=1e-3, var_low=1e-3)),
        ("a float32 Linear(8, 8) then BatchNorm1d(8)", _fold_case(rng, 8, 8, np.float32)),
    ]


def _fold_slips(case):
    """{hint: (folded_weight, folded_bias)} for the usual slips in the formula."""
    w, b, g, beta, mean, var = (case[key].astype(np.float64) for key in (
        "weight", "bias", "gamma", "beta", "running_mean", "running_var"))
    eps = float(case["eps"])
    scale = g / np.sqrt(var + eps)
    rows = w * scale[:, None]
    slips = {
        "scale the bias part too: batch norm multiplies (x @ W.T + b - running_mean) as a "
        "whole, so folded_bias = (b - running_mean) * gamma / sqrt(running_var + eps) + beta":
            (rows, b - mean + beta),
        "the layer's own bias b passes through batch norm as well, so it is scaled with "
        "running_mean: folded_bias = (b - running_mean) * scale + beta":
            (rows, b - mean * scale + beta),
        "subtract running_mean from the layer's bias before scaling: folded_bias = "
        "(b - running_mean) * scale + beta": (rows, b * scale + beta),
        "beta is added after the scaling, not scaled with it": (rows, (b - mean + beta) * scale),
        "the scale is gamma / sqrt(running_var + eps): eps belongs inside the square root "
        "(batch norm in eval mode adds it too)":
            (w * (g / np.sqrt(var))[:, None], (b - mean) * g / np.sqrt(var) + beta),
        "running_var is a variance: divide by its square root, sqrt(running_var + eps)":
            (w * (g / (var + eps))[:, None], (b - mean) * g / (var + eps) + beta),
    }
    if w.shape[0] == w.shape[1]:
        slips["weight has nn.Linear's layout (C, D): row c makes channel c, so scale each "
              "ROW by its channel's factor (weight * scale[:, None]), not each column"] = (
            w * scale[None, :], (b - mean) * scale + beta)
    return slips


def _fold_judge(reference, slips_of):
    """A judge of a fold: the pair against reference's, with the hint of the first
    slip (slips_of(case): {hint: (folded_weight, folded_bias)}) the pair reproduces."""
    def judge(case, output):
        if output["torch_fold"]:
            return ("your fold called PyTorch's own (torch.nn.utils.fusion), which does "
                    "the exercise for you: compute the scale per output channel and "
                    "fold it into the weight and bias yourself")
        dtype = _judged_at(case["weight"].dtype, output["weight"], output["bias"])
        weight, bias = reference(*(case[key] for key in (
            "weight", "bias", "gamma", "beta", "running_mean", "running_var")),
            float(case["eps"]))
        problem = (mismatch(output["weight"], weight, dtype=dtype, what="your folded_weight")
                   or mismatch(output["bias"], bias, dtype=dtype, what="your folded_bias"))
        if problem is None:
            return None
        with np.errstate(all="ignore"):
            for hint, (slip_weight, slip_bias) in slips_of(case).items():
                if all(np.shape(given) == np.shape(slip) and matches(given, slip, dtype=dtype)
                       for given, slip in ((output["weight"], slip_weight),
                                           (output["bias"], slip_bias))):
                    return _with_hint(problem, hint)
        return problem
    return judge


_judge_fold_batch_norm = _fold_judge(batchnorm.fold_batch_norm, _fold_slips)


def _conv_fold_case(rng, c_out, c_in, kernel, eps=1e-5, var_low=0.5):
    case = _fold_case(rng, c_out, c_in * kernel * kernel, eps=eps, var_low=var_low)
    case["weight"] = case["weight"].reshape(c_out, c_in, kernel, kernel)
    return case


def _conv_fold_cases(rng):
    return [
        # as many input channels as output ones first: scaling axis 1 instead of 0 runs
        ("a Conv2d(4, 4, 3) then BatchNorm2d(4)", _conv_fold_case(rng, 4, 4, 3)),
        ("a Conv2d(2, 5, 3) then BatchNorm2d(5)", _conv_fold_case(rng, 5, 2, 3)),
        ("a Conv2d(6, 3, 1) then BatchNorm2d(3), a 1 x 1 convolution",
         _conv_fold_case(rng, 3, 6, 1)),
        ("running variances near 1e-3, eps 1e-3: eps counts",
         _conv_fold_case(rng, 3, 3, 3, eps=1e-3, var_low=1e-3)),
    ]


def _conv_fold_slips(case):
    """{hint: (folded_weight, folded_bias)} for the usual slips of the Conv2d fold."""
    w, b, g, beta, mean, var = (case[key].astype(np.float64) for key in (
        "weight", "bias", "gamma", "beta", "running_mean", "running_var"))
    eps = float(case["eps"])
    scale = g / np.sqrt(var + eps)
    folded = w * scale[:, None, None, None]
    right_bias = (b - mean) * scale + beta
    slips = {
        "the bias is folded too: batch norm subtracts running_mean from the convolution's "
        "output, bias included, then scales and shifts, so folded_bias = (bias - "
        "running_mean) * scale + beta": (folded, b),
        "the shift is part of the fold: folded_bias = (bias - running_mean) * scale + beta, "
        "with running_mean subtracted before the scaling": (folded, b * scale + beta),
        "scale the bias part too: folded_bias = (bias - running_mean) * scale + beta":
            (folded, b - mean + beta),
        "the scale is gamma / sqrt(running_var + eps): eps belongs inside the square root "
        "(batch norm in eval mode adds it too)":
            (w * (g / np.sqrt(var))[:, None, None, None], (b - mean) * g / np.sqrt(var) + beta),
    }
    if w.shape[0] == w.shape[1]:
        slips["weight has nn.Conv2d's layout (C_out, C_in, kh, kw): filter c, weight[c], "
              "makes output channel c, so scale along axis 0 (weight * scale[:, None, None, "
              "None]), not along the input channels"] = (
            w * scale[None, :, None, None], right_bias)
    return slips


_judge_fold_conv_batch_norm = _fold_judge(batchnorm.fold_conv_batch_norm, _conv_fold_slips)


# ---------------------------------------------------------------- RMSNorm


def _rms_case(x, gamma, eps):
    case = {"x": x, "gamma": np.asarray(gamma, x.dtype)}
    if eps is not None:  # no "eps" key: the probe passes eps=None
        case["eps"] = np.array(eps)
    return case


def _rms_cases(rng):
    def tokens(shape, dtype=np.float64, loc=2.0, scale=1.0):
        return (rng.normal(loc, 1.0, size=shape) * scale).astype(dtype)

    d = 8
    return [
        ("x (4, 8) with eps 1e-5, tokens with mean 2", _rms_case(tokens((4, d)),
                                                                 rng.normal(size=d), 1e-5)),
        ("x (2, 3, 6), random gamma, eps 1e-3", _rms_case(tokens((2, 3, 6)),
                                                          rng.normal(size=6), 1e-3)),
        # values of size 1e-3: eps 1e-5 would outweigh their mean square (about 5e-6)
        ("a float32 batch (3, 8) of small values, eps=None (float32's machine epsilon)",
         _rms_case(tokens((3, d), np.float32, scale=1e-3), rng.normal(size=d), None)),
        ("a float64 batch (2, 5, 8) of small values, eps=None (float64's machine epsilon)",
         _rms_case(tokens((2, 5, d), scale=1e-3), rng.normal(size=d), None)),
        ("one token of 16 features, eps 1e-5", _rms_case(tokens((16,)), rng.normal(size=16),
                                                         1e-5)),
        # values of size 1e-5: their mean square (about 5e-10) is far below float32's
        # epsilon (about 1.2e-7), so the output is about x / sqrt(eps) and tells
        # float32's eps from float16's (about 1e-3, 90 times smaller outputs) and from
        # float64's or none (outputs of size 1, 10 times larger). At size 1e-3 the
        # choices differ by about 1%, no more than a correct hand-in that squares
        # float16 values in float16 (they fall below its normal range) loses.
        ("a float16 batch (3, 8) of tiny values, eps=None (what torch does there)",
         _rms_case(tokens((3, d), np.float16, scale=1e-5), rng.normal(size=d), None)),
    ]


def _rms_eps(case):
    """The eps torch's F.rms_norm uses: the one given, or for eps=None the machine
    epsilon of the dtype it computes in, float32 for half-precision input."""
    if "eps" in case:
        return float(case["eps"])
    return float(np.finfo(np.promote_types(case["x"].dtype, np.float32)).eps)


def _torch_rms(case):
    """The judge's own reference: torch's F.rms_norm, in float64 with the eps
    the case asks for (machine epsilon of the case's dtype where it says None)."""
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(case["x"].astype(np.float64))
    gamma = torch.from_numpy(case["gamma"].astype(np.float64))
    return F.rms_norm(x, (x.shape[-1],), gamma, eps=_rms_eps(case)).numpy()


def _rms_slips(case):
    x, g = case["x"].astype(np.float64), case["gamma"].astype(np.float64)
    eps = _rms_eps(case)
    mean_square = (x**2).mean(-1, keepdims=True)
    candidates = {}
    if "eps" not in case and case["x"].dtype == np.float16:
        # the case's mean square (about 5e-10) is far below every eps a hand-in may
        # pick, so the output is about x / sqrt(eps): each text below is true of both
        # larger eps, 1e-5 and float16's, which may land within tolerance of each other
        torch_rule = ("eps=None on float16 input: torch computes half-precision input in "
                      "float32, and its eps is then float32's machine epsilon (about "
                      "1.2e-7)")
        candidates[f"{torch_rule}; yours is far larger (1e-5 and float16's epsilon, "
                   "about 1e-3, are both far larger)"] = x / np.sqrt(mean_square + 1e-5) * g
        candidates[f"{torch_rule}, not float16's; yours is far larger (try F.rms_norm on a "
                   "float16 tensor of tiny values)"] = (
            x / np.sqrt(mean_square + np.finfo(np.float16).eps) * g)
        candidates[f"{torch_rule}, not float64's and not 0; yours is far smaller"] = (
            x / np.sqrt(mean_square + np.finfo(np.float64).eps) * g)
    elif "eps" not in case:
        candidates["eps=None means the machine epsilon of x's dtype "
                   "(np.finfo(x.dtype).eps), as torch's F.rms_norm and nn.RMSNorm do, not "
                   "1e-5 as in layer norm"] = x / np.sqrt(mean_square + 1e-5) * g
        # the other float type's epsilon: float64's for float32 input, or float32's
        # for float64 input (a constant copied from a float32 run, or x cast down)
        other = np.float64 if case["x"].dtype == np.float32 else np.float32
        candidates[f"eps=None means the machine epsilon of x's OWN dtype: "
                   f"{case['x'].dtype}'s for {case['x'].dtype} input, not "
                   f"{np.dtype(other)}'s"] = (
            x / np.sqrt(mean_square + np.finfo(other).eps) * g)
    centred = x - x.mean(-1, keepdims=True)
    candidates.update({
        "RMSNorm does not subtract the mean: divide x itself by its root mean square":
            centred / np.sqrt((centred**2).mean(-1, keepdims=True) + eps) * g,
        "divide by the root mean square sqrt(mean(x ** 2) + eps), not by the standard "
        "deviation": x / np.sqrt(x.var(-1, keepdims=True) + eps) * g,
        "eps goes inside the square root: sqrt(mean(x ** 2) + eps)":
            x / (np.sqrt(mean_square) + eps) * g,
    })
    return candidates


def _judge_rms_norm(case, output):
    dtype = _judged_at(case["x"].dtype, output["y"])
    problem = mismatch(output["y"], _torch_rms(case), dtype=dtype)
    if problem is None:
        return None
    return _with_hint(problem, _first_matching_hint(output["y"], _rms_slips(case), dtype))


_SPREAD, _SPREAD_FRACTION = 2.0, 0.5  # a token's features: std 2; output std 0.5


def rms_offset_std(mean, spread=_SPREAD, eps=1e-5):
    """The std over its features of RMSNorm's output for a token whose features
    have this mean and std: the root mean square is sqrt(mean ** 2 + spread ** 2),
    and it divides the spread as well."""
    return spread / np.sqrt(mean**2 + spread**2 + eps)


def rms_offset_for_spread(fraction=_SPREAD_FRACTION, spread=_SPREAD, eps=1e-5):
    """The mean at which rms_offset_std falls to `fraction`: rms_offset_std solved
    for the mean."""
    return np.sqrt((spread / fraction) ** 2 - spread**2 - eps)


def _judge_rms_offset_answer(case, output):
    given = number_from_answer(output.get("rms_offset_for_half_spread"))
    truth = rms_offset_for_spread()
    if given is not None and abs(given - truth) <= 0.01:
        return None
    answered = output.get("rms_offset_for_half_spread")
    slips = {
        rms_offset_for_spread(spread=1.0): "that is the mean for features of standard "
             "deviation 1; these have standard deviation 2, which counts in the root mean "
             "square too",
        _SPREAD: "that halves the output's variance, not its standard deviation",
        _SPREAD / _SPREAD_FRACTION: "the root mean square of the features is "
             "sqrt(mean ** 2 + std ** 2), not the mean alone: the spread counts too",
    }
    hint = next((text for value, text in slips.items()
                 if given is not None and abs(given - value) <= 0.01), None)
    return _with_hint(f"RMS_OFFSET_FOR_HALF_SPREAD: {answered} is not right (judged within "
                      "0.01)",
                      hint or "RMSNorm divides the features' spread by their root mean "
                              "square, which counts their mean as well as their spread")


# ---------------------------------------------------------------- a batch of two

# the first question's channel holds two values this far apart (3.000 and 3.005)
_CLOSE_GAP, _PAIR_EPS = 0.005, 1e-5
# the second asks for the gap at which an output is within 0.01 of +1 or -1
_SIGN_LEVEL = 0.99


def pair_output(gap, eps=_PAIR_EPS, *, unbiased=False, eps_outside_root=False):
    """Training-mode batch norm's output for the larger of a channel's two values
    `gap` apart: their mean lies halfway, so the value sits gap / 2 above it, and
    the biased variance of the two is (gap / 2) ** 2 (the unbiased one twice that)."""
    half = gap / 2
    variance = 2 * half**2 if unbiased else half**2
    if eps_outside_root:
        return half / (np.sqrt(variance) + eps)
    return half / np.sqrt(variance + eps)


def sign_only_gap(level=_SIGN_LEVEL, eps=_PAIR_EPS):
    """The gap at which pair_output reaches `level`: solve
    half / sqrt(half ** 2 + eps) = level for half, and double it."""
    return 2 * level * np.sqrt(eps / (1 - level**2))


def _named_slip(given, slips, within):
    return next((text for value, text in slips.items()
                 if given is not None and abs(given - value) <= within * abs(value)), None)


def _judge_pair_output_answer(case, output):
    given = number_from_answer(output.get("pair_output_close"))
    truth = pair_output(_CLOSE_GAP)
    if given is not None and abs(given - truth) <= 0.005:
        return None
    slips = {
        pair_output(_CLOSE_GAP, eps_outside_root=True): "that adds eps to the standard "
             "deviation; batch norm adds it to the variance, inside the square root",
        1.0: "that is the output when the two values are far apart; here their gap is "
             "comparable to sqrt(eps), and eps, added to the variance, counts",
        pair_output(_CLOSE_GAP, unbiased=True): "that normalizes with the unbiased variance "
             "(dividing by n - 1 = 1); training-mode batch norm divides by the biased one",
        pair_output(_CLOSE_GAP, eps=0.0, unbiased=True): "that normalizes with the unbiased "
             "variance and leaves out eps; batch norm uses the biased variance, plus eps",
        -truth: "the example holding 3.005 is the larger one: its output is positive",
    }
    hint = _named_slip(given, slips, within=0.003)
    return _with_hint(f"PAIR_OUTPUT_CLOSE: {output.get('pair_output_close')} is not right "
                      "(judged within 0.005)",
                      hint or "the mean of the two values lies halfway between them; how "
                              "many standard deviations, with eps, is 3.005 above it?")


def _judge_sign_only_gap_answer(case, output):
    gap = number_from_answer(output.get("sign_only_gap"))
    truth = sign_only_gap()
    if gap is not None and abs(gap - truth) <= 0.02 * truth:
        return None
    slips = {
        truth / 2: "that is each value's distance from the mean; SIGN_ONLY_GAP is the "
                   "distance between the two values, twice as far",
        2 * _SIGN_LEVEL * _PAIR_EPS / (1 - _SIGN_LEVEL): "that adds eps to the standard "
                   "deviation; batch norm adds it to the variance, inside the root",
    }
    return (f"SIGN_ONLY_GAP (you answered {output.get('sign_only_gap')}, judged within 2%) "
            "is not yet right: " + (_named_slip(gap, slips, within=0.02)
                                    or "at what gap does the larger value's output reach "
                                       "0.99, with eps inside the square root?"))


_GROUPS_OF_TWO = 32  # GroupNorm(32, 64): 2 values a group


def _judge_pair_information_answers(case, output):
    """Group norm with 32 groups of 2 values and eps = 0: each group's outputs are
    (+1, -1) or (-1, +1) whenever its two values differ, one bit; the groups are
    normalized apart, so the 64 outputs carry 32 bits."""
    given = output.get("bits_per_example")
    bits = number_from_answer(given)
    if bits is not None and abs(bits - _GROUPS_OF_TWO) <= 1e-9:
        return None
    slips = {
        1.0: "that is one group's share: each of the 32 groups is normalized on its own, "
             "and each keeps its own bit",
        float(2 * _GROUPS_OF_TWO): "the two outputs of a group are not independent: one is "
                                   "minus the other, so a group shows only two patterns",
        2.0: "count every group: the 64 features make 32 groups of 2",
        0.0: "the outputs still say something: which of each group's two values is larger",
    }
    return (f"BITS_PER_EXAMPLE (you answered {given}) is not yet right: "
            + (_named_slip(bits, slips, within=1e-9)
               or "with eps = 0, count how many output patterns one group of two values "
                  "can show, take the base-2 logarithm, and add over the groups"))


# ---------------------------------------------------------------- the spatial run

# Exercise 11: a frozen 3 x 3 convolution (no padding) gives every digit 16 channels
# of 6 x 6; spatial_batch_norm_forward, batch_norm_train on the flattened features
# (N, 16 * 36) and group_norm with 4 groups normalize them, batch after batch, in
# training mode.

# Question 1: over how many values each statistic of the three norms is taken at batch 2,
# for a segmentation network's features at full resolution, far too large to run by
# nudging (2 x 128 x 1024 x 2048 values, 4.3 GB in float64): the counts must be derived
RUN_BATCH, RUN_CHANNELS, RUN_POSITIONS, RUN_GROUPS = 2, 128, 1024 * 2048, 32


def values_per_statistic(batch=RUN_BATCH, channels=RUN_CHANNELS, positions=RUN_POSITIONS,
                         groups=RUN_GROUPS):
    """{answer name: values each mean and variance is taken over} for features
    (batch, channels, *positions) normalized by the run's three norms."""
    return {"flat_bn_values_at_2": batch,  # one column of (N, C * positions): N rows
            "spatial_bn_values_at_2": batch * positions,  # a channel: N x positions
            "group_norm_values_at_2": channels // groups * positions}


def _statistic_size_slips():
    """{answer name: {wrong count: hint}} for the typical miscounts."""
    n, c, p, g = RUN_BATCH, RUN_CHANNELS, RUN_POSITIONS, RUN_GROUPS
    return {
        "flat_bn_values_at_2": {
            n * c * p: "on the flattened features (N, C * H * W) batch norm takes one mean "
                       "per column, a channel at one position, over the N rows",
            n * p: "flattened, a column is one channel at one position: its statistics "
                   "see no other position"},
        "spatial_bn_values_at_2": {
            n: "spatial batch norm averages each channel over the images AND their "
               "1024 x 2048 positions",
            p: "one channel's statistics cover its positions in every image of the batch",
            n * c * p: "one mean per channel, not one over all the channels"},
        "group_norm_values_at_2": {
            c // g: "a group's statistics cover its channels at every one of the "
                    "1024 x 2048 positions",
            n * c // g * p: "group norm never crosses from one image to another: the "
                            "batch size does not enter",
            g * p: "G = 32 is the number of groups; each holds C / G = 4 channels",
            c * p: "32 groups of 4 channels each, not one group of all 128"},
    }


def _judge_statistic_sizes_answer(case, output):
    problems = []
    for name, truth in values_per_statistic().items():
        label = name.upper()
        given = number_from_answer(output.get(name))
        if given is None:
            problems.append(f"{label} (you gave {output.get(name)}) is not a number")
        elif given != truth:
            hint = _statistic_size_slips()[name].get(
                given, "count the values that share one mean: which axes does this norm "
                       "average over, for features (2, 128, 1024, 2048)?")
            problems.append(f"{label}: {output.get(name)} is not right. Hint: {hint}")
    return "; ".join(problems) or None


# Question 2 asks for figures of the run with its seeds fixed (convolution seed 0,
# head and batch order seed 0), as counts of the 360 held-out images. Every correct
# implementation, numpy float64 or torch float32, gives these counts
# (tests/normref/test_rows_spatial_run.py); one image is 1/360 = 0.0028, and a figure
# is judged within RUN_TOLERANCE, two images and the rounding of a printed "94.7%".
# The lines at batch 8 and 4 and with 1 and 16 groups are those of the ungraded runs
# after question 1: the tests hold what their folded answers say to these figures.
RUN_HELD_OUT = 360
RUN_TOLERANCE = 0.007
# the run's printed lines, batch_norm_train in training mode at each batch size
BN_TRAIN_ACCURACY = {32: Fraction(345, 360), 16: Fraction(340, 360),
                     8: Fraction(328, 360), 4: Fraction(305, 360), 2: Fraction(271, 360)}
# group_norm at batch 2 (any batch: it does not see the batch), by number of groups
GROUP_NORM_ACCURACY = {1: Fraction(342, 360), 4: Fraction(343, 360),
                       16: Fraction(348, 360)}
# Question 4: the batch-2 pass of batch_norm_train, its running statistics carried,
# the held-out images through batch_norm_eval
EVAL_MODE_ACCURACY = Fraction(341, 360)
# and feature 21's mean over the held-out images as batch_norm_eval returns it (before
# the ReLU), which the usual wrong procedures do not reproduce though their accuracy
# lands within an image (tests/normref/test_rows_spatial_run.py recomputes each)
EVAL_MODE_FEATURE = 21
EVAL_MODE_FEATURE_MEAN = -0.18859
EVAL_MODE_MEAN_TOLERANCE = 0.005
EVAL_MODE_MEAN_SLIPS = {
    0.0: "that is what a training-mode batch of the 360 held-out images gives (its own "
         "mean centers every feature at exactly 0): put them through batch_norm_eval with "
         "the running statistics of the batch-2 pass instead",
    -0.04455: "that is what the training images' own mean and variance give: eval mode "
              "uses the running mean and variance carried through the batch-2 pass",
    -0.26666: "that is what a running variance of the batches' biased variance gives "
              "(CS231n's convention): PyTorch's convention, asked for here, updates it "
              "with the unbiased variance, n / (n - 1) = 2 times larger at batch 2",
    0.56580: "that is the mean after the ReLU: take batch_norm_eval's output before it",
    0.28563: "that is what running statistics never updated (momentum 0) give: pass the "
             "running mean and variance batch_norm_train returns on to the next batch",
    -3.20859: "that is what momentum 0.9 under PyTorch's convention gives: the new batch "
              "has weight momentum = 0.1",
}


def as_fraction_answer(answer):
    """A student's accuracy as a fraction of 1, or None: a number above 1 and at most
    100 is read as a percentage."""
    given = number_from_answer(answer)
    if given is None:
        return None
    return given / 100 if 1 < given <= 100 else given


def _near(value, figure):
    return value is not None and abs(value - float(figure)) <= RUN_TOLERANCE


def _figure_verdict(label, answer, truth, lines, fallback):
    """None when answer is within RUN_TOLERANCE of truth; else a sentence naming the
    nearest of the run's other lines it matches (lines: {figure: what that line is}),
    or fallback."""
    value = as_fraction_answer(answer)
    if value is None:
        return (f"{label} (you answered {answer}) is not a number: give the held-out "
                "accuracy as a fraction, like 0.75")
    if _near(value, truth):
        return None
    near = [(abs(value - float(figure)), text) for figure, text in lines.items()
            if _near(value, figure)]
    hint = min(near)[1] if near else fallback  # the nearest of the run's other lines
    return (f"{label} (you answered {answer}) is not within {RUN_TOLERANCE} of what this "
            f"run gives: {hint}")


def _eval_mode_mean_verdict(answer):
    """None when feature 21's mean is within EVAL_MODE_MEAN_TOLERANCE of the run's;
    else a sentence naming the wrong procedure it matches, if any."""
    value = number_from_answer(answer)
    if value is None:
        return f"EVAL_MODE_FEATURE_21_MEAN (you answered {answer}) is not a number"
    if abs(value - EVAL_MODE_FEATURE_MEAN) <= EVAL_MODE_MEAN_TOLERANCE:
        return None
    hints = [hint for figure, hint in EVAL_MODE_MEAN_SLIPS.items()
             if abs(value - figure) <= EVAL_MODE_MEAN_TOLERANCE]
    return (f"EVAL_MODE_FEATURE_21_MEAN (you answered {answer}) is not within "
            f"{EVAL_MODE_MEAN_TOLERANCE} of what this run gives: " + (
                hints[0] if hints else "print as_array(batch_norm_eval(flat[held_out], ...))"
                "[:, 21].mean() with the final running statistics of the batch-2 pass"))


def _judge_eval_mode_accuracy(case, output):
    return "; ".join(filter(None, (_judge_eval_mode_figure(output), _eval_mode_mean_verdict(
        output.get("eval_mode_feature_21_mean"))))) or None


def _judge_eval_mode_figure(output):
    return _figure_verdict(
        "EVAL_MODE_ACCURACY", output.get("eval_mode_accuracy"), EVAL_MODE_ACCURACY,
        {BN_TRAIN_ACCURACY[32]: "that is the run's batch-32 line: the head must be the one "
                                "trained at batch 2 on batch_norm_train's features, the "
                                "held-out images normalized with the running statistics of "
                                "that batch-2 pass",
         BN_TRAIN_ACCURACY[2]: "that is the run's batch-2 line, with the held-out images "
                               "normalized in pairs in training mode: put them through your "
                               "batch_norm_eval with the final running statistics instead"},
        "check that the running mean and variance your batch_norm_train returns are "
        "passed on to the next batch (momentum 0.1, starting at 0 and 1), that the head is "
        "trained on that pass's features of the 1,408 training images in the run's order "
        "(seed 0), and that the 360 held-out images go through your batch_norm_eval with "
        "the final running statistics")


# ---------------------------------------------------------------- the precision rule

PRECISION_FUNCTIONS = ("group_norm", "channel_layer_norm", "batch_norm_train",
                       "spatial_batch_norm_forward", "batch_norm_eval", "fold_batch_norm",
                       "rms_norm")


def _precision_cases(rng):
    """One float64 call of each function: (N, C, L) for the channel norms, an image
    batch for spatial batch norm, (N, C) for the rest."""
    def args(name):
        c = 4
        x = rng.normal(1.0, 2.0, size=(4, c, 3, 3) if name == "spatial_batch_norm_forward"
                       else (3, c, 5) if name in ("group_norm", "channel_layer_norm")
                       else (6, c))
        return {"function": np.array(name), "x": x, "gamma": rng.uniform(0.5, 2.0, c),
                "beta": rng.normal(size=c), "running_mean": rng.normal(size=c),
                "running_var": rng.uniform(0.5, 2.0, c), "weight": rng.normal(size=(c, 3)),
                "bias": rng.normal(size=c)}
    return [(f"your {name} on float64 input", args(name)) for name in PRECISION_FUNCTIONS]


def _judge_precision_kept(case, output):
    name = str(case["function"])
    given = [str(dtype) for dtype in np.atleast_1d(output["dtypes"])]
    lower = [dtype for dtype in given if dtype != "float64"]
    if not lower:
        return None
    return (f"your {name} returned {lower[0]} for float64 input: keep the input's "
            "precision (compute in float64 and return float64, as torch's norms keep "
            "their input's dtype; torch.as_tensor(x).float() or torch.tensor(x) of a "
            "list computes in float32, which loses about 1e-7 of every value)")


CHECKS = {
    "rows_group_norm": Check(_group_cases, _judge_group_norm),
    "rows_channel_layer_norm": Check(_channel_cases, _judge_channel_layer_norm),
    "rows_batch_norm_train_pytorch": Check(_train_cases_of("pytorch"),
                                           _judge_batch_norm_train),
    "rows_batch_norm_train_cs231n": Check(_train_cases_of("cs231n"), _judge_batch_norm_train),
    "rows_batch_norm_train_one_example": Check(_train_cases_of("one_example"),
                                               _judge_batch_norm_train),
    "rows_nudge_answer": Check(lambda rng: [("your answer", {})], _judge_nudge_answer),
    "rows_running_var_answers": Check(lambda rng: [("your two answers", {})],
                                      _judge_running_var_answers),
    "rows_spatial_batch_norm": Check(_spatial_bn_cases, _judge_spatial),
    "rows_batch_norm_eval": Check(_eval_cases, _judge_batch_norm_eval),
    "rows_fold_batch_norm": Check(_fold_cases, _judge_fold_batch_norm),
    "rows_fold_conv_batch_norm": Check(_conv_fold_cases, _judge_fold_conv_batch_norm),
    "rows_rms_norm": Check(_rms_cases, _judge_rms_norm),
    "rows_rms_offset_answer": Check(lambda rng: [("your answer", {})], _judge_rms_offset_answer),
    "rows_pair_output_answer": Check(lambda rng: [("your answer", {})],
                                     _judge_pair_output_answer),
    "rows_sign_only_gap_answer": Check(lambda rng: [("your answer", {})],
                                       _judge_sign_only_gap_answer),
    "rows_pair_information_answers": Check(lambda rng: [("your answer", {})],
                                           _judge_pair_information_answers),
    "rows_precision_kept": Check(_precision_cases, _judge_precision_kept),
    "rows_statistic_sizes_answer": Check(lambda rng: [("your three answers", {})],
                                         _judge_statistic_sizes_answer),
    "rows_eval_mode_accuracy": Check(lambda rng: [("your answer", {})],
                                     _judge_eval_mode_accuracy),
}
