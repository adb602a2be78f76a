"""Unit 01 checks, the student-facing half: how each exercise is called."""

import contextlib
import inspect
import numbers
import sys
import types

import numpy as np

from normref.checks._runner import answer_text, run_check, to_array


def _plain(value):
    """A Python number of any exact type (Fraction, Decimal) as a float; anything
    else (arrays, tensors, numpy scalars, int, float) as it is."""
    if (not hasattr(value, "__array__") and not isinstance(value, (int, float, list, tuple))
            and isinstance(value, numbers.Number)):
        return float(value)
    return value


def _call_on_x(fn, case):
    return {"y": _plain(fn(case["x"].copy()))}


# Where numpy and the standard library compute a variance: np.var, np.std and
# the ndarray methods all end in numpy's _methods._var; nanvar, nanstd, cov,
# masked arrays (np.ma.var, np.ma.std) and the statistics module have their
# own. token_var must compute it itself.
_LIBRARY_VARIANCE = {"_methods": ("_var", "_std"),
                     "nanfunctions": ("nanvar", "nanstd"),
                     "function_base": ("cov", "corrcoef"),
                     "statistics": ("pvariance", "pstdev", "variance", "stdev",
                                    "covariance", "correlation")}
# Masked arrays and torch.masked, whose files' names say less: by their path.
_MASKED_VARIANCE = {"numpy/ma/core.py": ("var", "std"),
                    "torch/masked/_ops.py": ("var", "std", "_std_var")}


def _is_library_variance(code):
    module = code.co_filename.rsplit("/", 1)[-1]
    if any(code.co_filename.endswith(path) and code.co_name in names
           for path, names in _MASKED_VARIANCE.items()):
        return True
    return any(part in module and code.co_name in names
               for part, names in _LIBRARY_VARIANCE.items())


def _call_var_watched(token_var, case):
    """Call token_var, noting whether a library variance ran during the call."""
    seen = []

    def watch(frame, event, arg):
        if event == "call" and _is_library_variance(frame.f_code):
            seen.append(frame.f_code.co_name)

    before = sys.getprofile()
    sys.setprofile(watch)
    try:
        # converted while watched: a lazy result (an object whose __array__ does the
        # work) runs its code here, not after the watch
        y = to_array(_plain(token_var(case["x"].copy())))
    finally:
        replaced = sys.getprofile() is not watch
        sys.setprofile(before)
    return {"y": y, "library_variance": np.array(bool(seen) or replaced)}


def _count(n):
    """A count a student handed to merge_stats (an int, a numpy or torch scalar, an
    array of equal counts) as an int; -1 when it is not one."""
    try:
        return int(np.max(to_array(n)))
    except (TypeError, ValueError):
        return -1


def _merge_exactly(a, b):
    """Chan's merge, in float64: what chunked_var is graded with, so that a slip in
    the student's own merge_stats costs merge_stats_correct alone."""
    n_a, mean_a, m2_a = (to_array(part).astype(np.float64) for part in a)
    n_b, mean_b, m2_b = (to_array(part).astype(np.float64) for part in b)
    n = n_a + n_b
    delta = mean_b - mean_a
    with np.errstate(all="ignore"):  # two empty chunks: NaN, judged as any result is
        mean, m2 = mean_a + delta * (n_b / n), m2_a + m2_b + delta**2 * (n_a * n_b / n)
    return a[0] + b[0], _like_given(mean, a[1], b[1]), _like_given(m2, a[2], b[2])


def _like_given(merged, *given):
    """`merged` as a torch tensor of the given statistics' dtype when they were
    torch tensors, so that torch code goes on working with what it gets back."""
    torch = sys.modules.get("torch")
    tensors = [part for part in given if torch is not None and isinstance(part, torch.Tensor)]
    if not tensors:
        return merged
    return torch.as_tensor(merged, device=tensors[0].device).to(tensors[0].dtype)


# The names under which the grader's own functions sit in the student's namespace
# while the student's code runs; the _forward_to_* functions look them up there.
_GRADED_MERGE = "__graded_merge_stats__"
_GRADED_VAR = "__graded_token_var__"
_GRADED_MEAN = "__graded_token_mean__"


def _forward_to_graded_merge(*args, **kwargs):
    return __graded_merge_stats__(*args, **kwargs)  # noqa: F821 (the student's globals)


def _forward_to_graded_var(*args, **kwargs):
    return __graded_token_var__(*args, **kwargs)  # noqa: F821 (the student's globals)


def _forward_to_graded_mean(*args, **kwargs):
    return __graded_token_mean__(*args, **kwargs)  # noqa: F821 (the student's globals)


@contextlib.contextmanager
def _rewired(own, graded, slot, forward, arity):
    """While inside, every call of the student's function `own` whose arguments
    are its first `arity` ones runs graded(*those): the function object itself is
    rewired (its code forwards to `slot` in its globals), so a call under another
    name (combine = merge_stats, a default argument, a closure) counts too. A call
    with more arguments runs the student's own code. Yields False, changing
    nothing, for what is no plain function (a callable object, a closure)."""
    code = getattr(own, "__code__", None)
    found = getattr(own, "__globals__", None)
    if code is None or code.co_freevars or not isinstance(found, dict):
        yield False
        return
    try:
        signature = inspect.signature(own)
    except (TypeError, ValueError):
        signature = None
    original = types.FunctionType(code, found, own.__name__, own.__defaults__)
    original.__kwdefaults__ = own.__kwdefaults__

    def forwarded(*args, **kwargs):
        try:
            given = list(signature.bind(*args, **kwargs).arguments.values())
        except (AttributeError, TypeError, ValueError):
            given = list(args) + list(kwargs.values())
        if len(given) != arity:
            return original(*args, **kwargs)
        return graded(*given)

    saved = code, own.__defaults__, own.__kwdefaults__
    found[slot] = forwarded
    own.__defaults__ = own.__kwdefaults__ = None
    own.__code__ = forward.__code__
    try:
        yield True
    finally:
        own.__code__, own.__defaults__, own.__kwdefaults__ = saved
        found.pop(slot, None)


@contextlib.contextmanager
def _replaced(fn, name, graded, slot, forward, arity):
    """While inside, the notebook's function `name` (found in fn's globals) runs
    graded(...) instead: rewired where it can be, swapped by its notebook name
    where not."""
    found = getattr(fn, "__globals__", None)
    own = found.get(name) if isinstance(found, dict) else None
    with _rewired(own, graded, slot, forward, arity) as rewired:
        if own is not None and not rewired:
            found[name] = graded
        try:
            yield
        finally:
            if own is not None and not rewired:
                found[name] = own


def _like_input(result, x):
    """A float64 statistic of x handed back in x's float dtype: a numpy array of
    it, or a torch tensor for a torch tensor."""
    given = getattr(x, "dtype", None)
    if isinstance(given, np.dtype) and np.issubdtype(given, np.floating):
        result = result.astype(given)
    return _like_given(result, x)


def _exact_token_var(x):
    """The grader's token_var, what chunked_var and layer_norm are graded with, so
    that a slip in the student's own token_var costs token_var_correct alone.
    Two-pass in float64, handed back in the input's float dtype (a torch tensor
    for a torch tensor). x: (..., d) -> (...)"""
    x64 = to_array(x).astype(np.float64)  # ..., d
    centred = x64 - x64.sum(axis=-1, keepdims=True) / x64.shape[-1]  # ..., d
    var = (centred * centred).sum(axis=-1) / x64.shape[-1]  # ...
    return _like_input(var, x)


def _exact_token_mean(x):
    """The grader's token_mean, what token_var, chunked_var and layer_norm are graded
    with, so that a slip in the student's own token_mean costs token_mean_correct
    alone. Summed in float64, handed back in the input's float dtype (a torch tensor
    for a torch tensor). x: (..., d) -> (...)"""
    x64 = to_array(x).astype(np.float64)  # ..., d
    mean = x64.sum(axis=-1) / x64.shape[-1]  # ...
    return _like_input(mean, x)


def _token_mean_replaced(fn):
    """While inside, the notebook's token_mean, called by fn, is the grader's."""
    return _replaced(fn, "token_mean", _exact_token_mean, _GRADED_MEAN,
                     _forward_to_graded_mean, 1)


@contextlib.contextmanager
def _token_var_replaced(fn):
    """While inside, the notebook's token_var and token_mean, called by fn, are
    the grader's."""
    with _replaced(fn, "token_var", _exact_token_var, _GRADED_VAR,
                   _forward_to_graded_var, 1), _token_mean_replaced(fn):
        yield


def _call_token_var_watched(token_var, case):
    """Call token_var with the notebook's token_mean made the grader's, noting
    whether a library variance ran."""
    with _token_mean_replaced(token_var):
        return _call_var_watched(token_var, case)


def _side_values(n, mean):
    """(counts, means) of one side of a merge, one entry per statistic it holds,
    as flat float64 arrays; empty when they cannot be read (then nothing is checked
    about that side)."""
    try:
        mean = to_array(mean).astype(np.float64)
        counts = to_array(n).astype(np.float64)
        if counts.ndim and counts.ndim < mean.ndim and counts.shape != mean.shape[-counts.ndim:]:
            counts = counts.reshape(counts.shape + (1,) * (mean.ndim - counts.ndim))
        counts = np.broadcast_to(counts, mean.shape)
        return counts.ravel(), mean.ravel()
    except Exception:  # noqa: BLE001 (a side the grader cannot read is not checked)
        return np.zeros(0), np.zeros(0)


def _call_chunked_var_watched(chunked_var, case):
    """Call chunked_var(x, chunk) with the notebook's merge_stats made an exact
    merge that notes the counts and means of the two sides of each merge. Notes
    too whether a library variance ran. Then calls it once more with a merge that
    doubles every merged M2 (y_tainted): a variance built from the merges follows."""
    chunk = int(case["chunk"])
    merges, counts, means, sizes = [], [], [], []
    taint = []

    def graded_merge(a, b):
        merged = _merge_exactly(a, b)
        if taint:
            return merged[0], merged[1], merged[2] * 2
        merges.append((_count(a[0]), _count(b[0])))
        for side in (a, b):
            side_counts, side_means = _side_values(side[0], side[1])
            counts.append(side_counts)
            means.append(side_means)
            sizes.append(len(side_counts))
        return merged

    def watched():
        with _replaced(chunked_var, "merge_stats", graded_merge, _GRADED_MERGE,
                       _forward_to_graded_merge, 2), _token_var_replaced(chunked_var):
            return _call_var_watched(lambda x: chunked_var(x, chunk), case)

    outputs = watched()
    taint.append(True)
    try:
        tainted = watched()
        outputs["y_tainted"] = tainted["y"]
        outputs["library_variance"] = np.array(
            bool(outputs["library_variance"]) or bool(tainted["library_variance"]))
    except Exception:  # noqa: BLE001 (judged: the variance did not follow the merges)
        outputs["y_tainted"] = np.array(np.nan)
    outputs["merge_counts"] = np.array(merges, dtype=np.int64).reshape(-1, 2)
    outputs["side_counts"] = np.concatenate(counts) if counts else np.zeros(0)
    outputs["side_means"] = np.concatenate(means) if means else np.zeros(0)
    outputs["side_sizes"] = np.array(sizes, dtype=np.int64)
    return outputs


def _call_merge_stats(merge_stats, case):
    """Call merge_stats((n_a, mean_a, m2_a), (n_b, mean_b, m2_b)) with int
    counts; send back the three parts of what it returns."""
    a = (int(case["n_a"]), case["mean_a"].copy(), case["m2_a"].copy())
    b = (int(case["n_b"]), case["mean_b"].copy(), case["m2_b"].copy())
    merged = merge_stats(a, b)
    if isinstance(merged, (str, bytes, dict)) or not hasattr(merged, "__len__"):
        raise TypeError("merge_stats returns (n, mean, m2), a tuple of three, "
                        f"not a {type(merged).__name__}")
    if len(merged) != 3:
        raise TypeError("merge_stats returns (n, mean, m2), a tuple of three, "
                        f"not of {len(merged)}")
    n, mean, m2 = merged
    return {"n": _plain(n), "mean": _plain(mean), "m2": _plain(m2)}


def _call_layer_norm(layer_norm, case):
    """Call layer_norm with the notebook's token_var and token_mean made the
    grader's; without eps where the case grades the default."""
    x, gamma, beta = case["x"].copy(), case["gamma"].copy(), case["beta"].copy()
    with _token_var_replaced(layer_norm):
        if bool(case.get("eps_default", False)):  # the default eps is graded too
            return {"y": _plain(layer_norm(x, gamma, beta))}
        return {"y": _plain(layer_norm(x, gamma, beta, float(case["eps"])))}


def _ranking_as_text(answers, case):
    """A ranking (a list, a tuple, an array of names or one string) as one string,
    its names in the order given."""
    value = answers["float32_ranking"]
    if isinstance(value, (str, bytes)):
        return {"float32_ranking": np.array(str(value))}
    try:
        items = [str(answer_text(item)) for item in value]
    except Exception:  # not a sequence, or one that fails as it is read
        items = [str(answer_text(value))]
    return {"float32_ranking": np.array(", ".join(items))}


def _answers_as_text(answers, case):
    return {name: np.array(answer_text(value)) for name, value in answers.items()}


def check_token_mean(token_mean):
    """Check token_mean(x) -> the mean of each token (last axis)."""
    run_check("token_mean", token_mean, _call_on_x)


def check_token_var(token_var):
    """Check token_var(x) -> the biased variance of each token (last axis),
    accurate at large offsets and computed without a library variance."""
    run_check("token_var", token_var, _call_token_var_watched)


def check_merge_stats(merge_stats):
    """Check merge_stats(a, b) -> (n, mean, m2) of two chunks taken together."""
    run_check("merge_stats", merge_stats, _call_merge_stats)


def check_chunked_var(chunked_var):
    """Check chunked_var(x, chunk) -> each token's biased variance, accurate at
    large offsets and without a library variance (how it merges the chunks is
    check_chunked_var_merges's)."""
    run_check("chunked_var", chunked_var, _call_chunked_var_watched)


def check_chunked_var_merges(chunked_var):
    """Check that chunked_var(x, chunk) reaches the right variance by merging the
    statistics of chunks of at most `chunk` features with the notebook's
    merge_stats."""
    run_check("chunked_var_merges", chunked_var, _call_chunked_var_watched)


def check_tiled_method(answer):
    """Check inline question 3.1: which variance a one-read tiled kernel can use."""
    run_check("recipe_tiled_method", {"tiled_method": answer}, _answers_as_text)


def check_float32_ranking(answer):
    """Check inline question 3.2: two-pass, Chan and Welford ranked by their
    float32 error far from zero, most accurate first."""
    run_check("recipe_float32_ranking", {"float32_ranking": answer}, _ranking_as_text)


def check_one_read_cost(answer):
    """Check inline question 3.3: where a one-read method's float32 error comes from."""
    run_check("recipe_one_read_cost", {"one_read_cost": answer}, _answers_as_text)


def check_tile_sweep(answer):
    """Check inline question 3.4: what the tile-size sweep of the merge and of
    one-pass shows."""
    run_check("recipe_tile_sweep", {"tile_sweep": answer}, _answers_as_text)


def check_safe_spread(answer):
    """Check inline question 1.2: the smallest spread the float32 shortcut survives
    at an offset of 10 000."""
    run_check("recipe_safe_spread", {"safe_spread": answer}, _answers_as_text)


def check_spacing_estimate(answer):
    """Check inline question 1.1: the spread an error of one float32 gap near
    1e8 allows."""
    run_check("recipe_spacing_estimate", {"spacing_estimate": answer}, _answers_as_text)


def check_spread_gap_reason(answer):
    """Check inline question 1.3: why the measured spread exceeds the estimate."""
    run_check("recipe_spread_gap_reason", {"spread_gap_reason": answer}, _answers_as_text)


def check_breaking_offset(answer):
    """Check inline question 2: the offset at which the float64 shortcut fails."""
    run_check("recipe_breaking_offset", {"breaking_offset": answer}, _answers_as_text)


def check_s_for_half_output(answer):
    """Check inline question 4: the s at which eps halves layer norm's output of
    s * [0, 0, 0, 1]."""
    run_check("recipe_s_for_half_output", {"s_for_half_output": answer},
              _answers_as_text)


def check_rms_shift_halving(answer):
    """Check inline question 5: the shift c at which RMSNorm's output of
    [-1, 1, -1, 1] + c keeps half its spread."""
    run_check("recipe_rms_shift_halving", {"rms_shift_halving": answer}, _answers_as_text)


def check_layer_norm_token(layer_norm):
    """Check layer_norm(x, gamma, beta, eps) on single tokens (1-D x)."""
    run_check("layer_norm_token", layer_norm, _call_layer_norm)


def check_layer_norm_batches(layer_norm):
    """Check layer_norm(x, gamma, beta, eps) on 2-D and 3-D batches of tokens."""
    run_check("layer_norm_batches", layer_norm, _call_layer_norm)
