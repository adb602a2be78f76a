"""Unit 07 checks, the grader-facing half: inputs, float64 references, diagnoses.

Every case is one launch of the student's layer-norm forward kernel (see
kernels_probes.py for the memory layout). The reference is float64 numpy; y
is held to the tolerance of the input's dtype, the saved mean and rstd
(float32 buffers) to float32's. The inputs are chosen so that a correct
float32 kernel is exact or nearly so: the large-offset rows are multiples of
1/8 placed symmetrically around the offset, so their sums are exact and any
error comes from the formula, not from rounding a correct one.
"""

import numpy as np

from normref.checks._registry import Check
from normref.checks.tolerances import matches, mismatch

EXAMPLE_A = np.array([[2.0, 4.0, 6.0, 8.0]])
UNWRITTEN = -1024.0  # what the probe fills output buffers with (see kernels_probes.py)
FLOAT16_MAX = 65504.0


def _case(x, gamma=None, beta=None, eps=1e-5, dtype="float32", pad=0):
    n = x.shape[-1]
    return {
        "x": np.asarray(x, dtype=np.float16 if dtype == "float16" else np.float32),
        "gamma": np.ones(n, np.float32) if gamma is None else np.asarray(gamma, np.float32),
        "beta": np.zeros(n, np.float32) if beta is None else np.asarray(beta, np.float32),
        "eps": np.array(eps),
        "dtype": np.array(dtype),
        "pad": np.array(pad),
    }


def _affine(rng, n):
    return rng.normal(1.0, 0.5, n), rng.normal(0.0, 0.5, n)


def _bfloat16_values(values):
    """Round float32 values to the nearest bfloat16 (kept as float32)."""
    bits = np.asarray(values, np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.view(np.float32)


def _offset_rows(rng, rows, n, offset):
    """Rows of offset + k/8 with the k in +/- pairs: exact sums, mean exactly `offset`."""
    half = rng.integers(1, 33, size=(rows, n // 2))
    k = np.concatenate([half, -half], axis=1)
    return offset + rng.permuted(k, axis=1) / 8.0


def _rows_cases(rng):
    constant = rng.normal(1.0, 2.0, (3, 32))
    constant[1] = 5.0
    return [
        ("x = [2, 4, 6, 8] (one row, N = 4)", _case(EXAMPLE_A)),
        ("4 rows of 64 features with random gamma and beta",
         _case(rng.normal(1.0, 2.0, (4, 64)), *_affine(rng, 64))),
        ("3 rows of 32 features, the second constant (y = beta there)",
         _case(constant, beta=rng.normal(0.0, 0.5, 32))),
        ("2 rows of 16 features with eps = 0.1", _case(rng.normal(0.0, 0.3, (2, 16)), eps=0.1)),
        ("6 rows of 256 features, rows 259 elements apart in memory",
         _case(rng.normal(-1.0, 3.0, (6, 256)), *_affine(rng, 256), pad=3)),
    ]


def _ragged_cases(rng):
    return [
        ("3 rows of 100 features (BLOCK_SIZE 128)",
         _case(rng.normal(2.0, 2.0, (3, 100)), *_affine(rng, 100), pad=5)),
        ("one row of 37 features", _case(rng.normal(-3.0, 1.5, (1, 37)), *_affine(rng, 37))),
        ("5 rows of 3 features", _case(rng.normal(1.5, 1.0, (5, 3)), pad=1)),
        ("2 rows of 1000 features (BLOCK_SIZE 1024)",
         _case(rng.normal(1.0, 1.0, (2, 1000)), *_affine(rng, 1000), pad=8)),
        ("4 rows of 48 features with mean near 8",
         _case(rng.normal(8.0, 2.0, (4, 48)), *_affine(rng, 48))),
    ]


def _statistics_cases(rng):
    constant = rng.normal(0.0, 1.0, (2, 16))
    constant[0] = -2.0
    return [
        ("4 rows of 64 features", _case(rng.normal(3.0, 2.0, (4, 64)))),
        ("2 rows of 64 features around 1000 (a large offset)",
         _case(_offset_rows(rng, 2, 64, 1000.0), *_affine(rng, 64))),
        ("2 rows of 16, the first constant (variance 0, rstd = 1/sqrt(eps))", _case(constant)),
        ("3 rows of 32 features with eps = 0.5",
         _case(rng.normal(0.0, 0.5, (3, 32)), eps=0.5, pad=2)),
    ]


def _half_cases(rng):
    return [
        ("float16, 4 rows of 256 features",
         _case(rng.normal(1.0, 2.0, (4, 256)), *_affine(rng, 256), dtype="float16")),
        ("bfloat16, 3 rows of 128 features",
         _case(_bfloat16_values(rng.normal(-1.0, 2.0, (3, 128))),
               *[_bfloat16_values(p) for p in _affine(rng, 128)], dtype="bfloat16", pad=4)),
        ("float16, 2 rows of 256 features around 1000 (their sum, 256 000, is past "
         "float16's largest number, 65 504)",
         _case(np.round(rng.normal(1000.0, 2.0, (2, 256)) * 2) / 2, dtype="float16")),
        ("float16, one row of 512 features", _case(rng.normal(0.0, 1.0, (1, 512)),
                                                   dtype="float16", pad=16)),
    ]


def _reference(case):
    """float64 mean, variance, rstd per row and y."""
    x = case["x"].astype(np.float64)
    eps = float(case["eps"])
    mean = x.mean(-1)
    var = x.var(-1)
    rstd = 1 / np.sqrt(var + eps)
    y = (x - mean[:, None]) * rstd[:, None] * case["gamma"] + case["beta"]
    return mean, var, rstd, y


def _statistic_mistakes(case):
    """[(what went wrong, the mean and rstd that mistake would save)]."""
    x = case["x"].astype(np.float64)
    n = x.shape[-1]
    block = 1 << (n - 1).bit_length()
    eps = float(case["eps"])
    mean, var, _, _ = _reference(case)
    padding = block - n
    mistakes = [
        ("the standard deviation was saved; rstd is its reciprocal, 1 / sqrt(var + eps)",
         mean, np.sqrt(var + eps)),
        ("the variance was saved; rstd = 1 / sqrt(var + eps)", mean, var),
        ("eps goes inside the square root: 1 / sqrt(var + eps), not 1 / (sqrt(var) + eps)",
         mean, 1 / (np.sqrt(var) + eps)),
        ("eps is missing: rstd = 1 / sqrt(var + eps)", mean, 1 / np.sqrt(var)),
    ]
    if padding:
        count_padding = (
            "the masked lanes were counted in the variance: they hold 0 (other=0.0), so "
            "x - mean there is -mean and each adds mean**2. Zero them before squaring: "
            "tl.where(mask, x - mean, 0.0)")
        divide_by_block = (
            "divide by N, the number of real features, not by BLOCK_SIZE (which also "
            "counts the masked lanes)")
        for mean_divisor in (n, block):
            wrong_mean = x.sum(-1) / mean_divisor
            squares = ((x - wrong_mean[:, None]) ** 2).sum(-1)
            for var_divisor in (n, block):
                for padded in (False, True):
                    if (mean_divisor, var_divisor, padded) == (n, n, False):
                        continue  # that one is right
                    total = squares + padding * wrong_mean**2 if padded else squares
                    slips = [divide_by_block] if block in (mean_divisor, var_divisor) else []
                    slips += [count_padding] if padded else []
                    mistakes.append(("; and ".join(slips), wrong_mean,
                                     1 / np.sqrt(total / var_divisor + eps)))
    return mistakes


def _diagnose(case, output):
    """A hint naming the likely mistake, or None."""
    x = case["x"].astype(np.float64)
    n = x.shape[-1]
    dtype = str(case["dtype"])
    mean, var, rstd, y_ref = _reference(case)
    y = np.asarray(output["y"], dtype=np.float64)
    saved_mean = np.asarray(output["mean"], dtype=np.float64)
    saved_rstd = np.asarray(output["rstd"], dtype=np.float64)
    if y.shape[0] > 1 and int(case["pad"]) and matches(y[:1], y_ref[:1], dtype=dtype) \
            and not matches(y[1:], y_ref[1:], dtype=dtype):
        return ("the first row is right and later ones are not: row r starts at "
                "X + r * row_stride (here rows are padded in memory), not at X + r * N")
    if int(output["padding_written"]):
        return (f"the store wrote {int(output['padding_written'])} numbers into the lanes "
                "past N, which belong to someone else: store with mask=cols < N")
    if (y == UNWRITTEN).all():
        return "nothing was stored in Y: y still holds what was there before"
    if (saved_mean == UNWRITTEN).all() or (saved_rstd == UNWRITTEN).all():
        return ("store the row's mean and rstd for the backward pass: "
                "tl.store(Mean + row, mean) and tl.store(Rstd + row, rstd)")
    if dtype == "float16" and np.abs(x.sum(-1)).max() > FLOAT16_MAX and not np.isfinite(
            saved_mean).all():
        return ("the row's sum overflowed float16 (largest number 65 504): convert x to "
                "float32 right after loading it, x = tl.load(...).to(tl.float32), so the "
                "sums and the statistics are float32")
    if np.isnan(y).any() or np.isnan(saved_mean).any():
        if n != 1 << (n - 1).bit_length():
            return ("NaN came out of NaN going in: the lanes past N of this test's memory "
                    "hold NaN (real padding holds anything), so some load read past the "
                    "row. Load x, w and b with mask=cols < N and other=0.0")
        return None
    with np.errstate(all="ignore"):
        y_from_saved = ((x - saved_mean[:, None]) * saved_rstd[:, None] * case["gamma"]
                        + case["beta"])
    if not matches(y, y_ref, dtype=dtype) and not matches(y, y_from_saved, dtype=dtype):
        x_hat = (x - mean[:, None]) * rstd[:, None]
        if matches(y, x_hat, dtype=dtype):
            return "the statistics are right; apply gamma and beta: y = x_hat * w + b"
        if matches(saved_mean, mean, dtype="float32") and \
                matches(saved_rstd, rstd, dtype="float32"):
            return ("the saved mean and rstd are right, so the slip is in the last step: "
                    "y = (x - mean) * rstd * w + b")
    with np.errstate(all="ignore"):
        for hint, wrong_mean, wrong_rstd in _statistic_mistakes(case):
            if matches(saved_mean, wrong_mean, dtype="float32") and \
                    matches(saved_rstd, wrong_rstd, dtype="float32"):
                return hint
    if matches(saved_mean, mean, dtype="float32") and np.abs(mean).max() > 100 * np.sqrt(
            var.max()):
        return ("compute the variance from x - mean (x is already in registers), not as "
                "mean(x**2) - mean**2: for rows far from zero the two big numbers cancel "
                "and float32 loses the difference")
    if dtype in ("float16", "bfloat16"):
        return ("the statistics carry low-precision rounding: convert x to float32 right "
                "after loading it (.to(tl.float32)) and keep mean, var and rstd in float32")
    return None


def _judge(case, output, *, statistics):
    """y (and, when `statistics`, the saved mean and rstd) against float64."""
    mean, _, rstd, y_ref = _reference(case)
    dtype = str(case["dtype"])
    problem = mismatch(output["y"], y_ref, dtype=dtype, what="y")
    if problem is None and statistics:
        problem = (mismatch(output["mean"], mean, dtype="float32", what="the saved mean")
                   or mismatch(output["rstd"], rstd, dtype="float32", what="the saved rstd"))
    if problem is None and int(output["padding_written"]):
        problem = "y is right, but the kernel also wrote past the end of each row"
    if problem is None:
        return None
    hint = _diagnose(case, output)
    return problem + (f". Hint: {hint}" if hint else "")


def _judge_y(case, output):
    return _judge(case, output, statistics=False)


def _judge_with_statistics(case, output):
    return _judge(case, output, statistics=True)


CHECKS = {
    "kernel_ln_rows": Check(_rows_cases, _judge_y),
    "kernel_ln_ragged": Check(_ragged_cases, _judge_y),
    "kernel_ln_statistics": Check(_statistics_cases, _judge_with_statistics),
    "kernel_ln_half": Check(_half_cases, _judge_y),
}
