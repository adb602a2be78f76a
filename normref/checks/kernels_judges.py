"""Unit 07 checks, the grader-facing half: inputs, float64 references, diagnoses.

Each kernel case is one launch of the student's RMSNorm kernel (see
kernels_probes.py for the memory layout). The reference is float64 numpy on
the very values the kernel sees (half-precision inputs are rounded first); y
and dx are held to the tolerance of the input's dtype, the saved rstd and the
float32 partial sums of dW to float32's.

The backward's dW is judged by what the assignment prescribes: every program
wrote its row of PartialDW (and nothing past them), and each row is the sum of
that program's own rows (p * rows_per_program up to the smaller of
(p + 1) * rows_per_program and M, or the same work dealt out like cards: rows
p, p + programs, ...), added in float32. A float16 case with 256
rows in one program makes a half-precision accumulator drift past float32's
tolerance.
"""

import numpy as np

from normref.checks._registry import Check
from normref.checks.tolerances import matches, mismatch, number_from_answer, tolerance_for

EXAMPLE_A = np.array([[2.0, 4.0, 6.0, 8.0]])
UNWRITTEN = -1024.0  # what the probe fills output buffers with (see kernels_probes.py)
FLOAT16_MAX = 65504.0


def _bfloat16_values(values):
    """Round float32 values to the nearest bfloat16 (kept as float32)."""
    bits = np.asarray(values, np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.view(np.float32)


def _rounded(values, dtype):
    """The values as the kernel will see them once stored in `dtype` (float32 arrays)."""
    values = np.asarray(values, np.float32)
    if dtype == "float16":
        return values.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return _bfloat16_values(values)
    return values


def _forward_case(x, gamma=None, eps=1e-5, dtype="float32", pad=0):
    n = np.asarray(x).shape[-1]
    return {
        "x": _rounded(x, dtype),
        "gamma": _rounded(np.ones(n) if gamma is None else gamma, dtype),
        "eps": np.array(eps),
        "dtype": np.array(dtype),
        "pad": np.array(pad),
    }


def _backward_case(rng, m, n, rows_per_program, dtype="float32", pad=0, offset=0.0,
                   eps=1e-5, scale=1.5, dy_offset=0.0):
    x = _rounded(rng.normal(offset, scale, (m, n)), dtype)
    rstd = 1 / np.sqrt((x.astype(np.float64) ** 2).mean(-1) + eps)
    return {
        "x": x,
        "dy": _rounded(rng.normal(dy_offset, 1.0, (m, n)), dtype),
        "gamma": _rounded(rng.normal(1.0, 0.5, n), dtype),
        "rstd": rstd.astype(np.float32),
        "rows_per_program": np.array(rows_per_program),
        "dtype": np.array(dtype),
        "pad": np.array(pad),
    }


def _weight(rng, n):
    return rng.normal(1.0, 0.5, n)


# --- the forward ------------------------------------------------------------------------

def _rows_cases(rng):
    zero_row = rng.normal(1.0, 2.0, (3, 32))
    zero_row[1] = 0.0
    return [
        ("x = [2, 4, 6, 8] (one row, N = 4)", _forward_case(EXAMPLE_A)),
        ("4 rows of 64 features with a random weight",
         _forward_case(rng.normal(1.0, 2.0, (4, 64)), _weight(rng, 64))),
        ("3 rows of 32 features, the second all zeros (y = 0 there)",
         _forward_case(zero_row, _weight(rng, 32))),
        ("2 rows of 16 features with eps = 0.1",
         _forward_case(rng.normal(0.0, 0.3, (2, 16)), eps=0.1)),
        ("6 rows of 256 features, rows 259 elements apart in memory",
         _forward_case(rng.normal(-1.0, 3.0, (6, 256)), _weight(rng, 256), pad=3)),
    ]


def _ragged_cases(rng):
    return [
        ("3 rows of 100 features (BLOCK_SIZE 128)",
         _forward_case(rng.normal(2.0, 2.0, (3, 100)), _weight(rng, 100), pad=5)),
        ("one row of 37 features", _forward_case(rng.normal(-3.0, 1.5, (1, 37)),
                                                 _weight(rng, 37))),
        ("5 rows of 3 features", _forward_case(rng.normal(1.5, 1.0, (5, 3)), pad=1)),
        ("2 rows of 1000 features (BLOCK_SIZE 1024)",
         _forward_case(rng.normal(1.0, 1.0, (2, 1000)), _weight(rng, 1000), pad=8)),
    ]


def _rstd_cases(rng):
    zero_row = rng.normal(0.0, 1.0, (2, 16))
    zero_row[0] = 0.0
    return [
        ("4 rows of 64 features", _forward_case(rng.normal(3.0, 2.0, (4, 64)))),
        ("2 rows of 16, the first all zeros (rstd = 1/sqrt(eps) there)",
         _forward_case(zero_row)),
        ("3 rows of 32 features with eps = 0.5",
         _forward_case(rng.normal(0.0, 0.5, (3, 32)), eps=0.5, pad=2)),
        ("3 rows of 128 features, rows 133 elements apart in memory",
         _forward_case(rng.normal(1.0, 1.0, (3, 128)), _weight(rng, 128), pad=5)),
    ]


def _half_cases(rng):
    return [
        ("float16, 4 rows of 256 features",
         _forward_case(rng.normal(1.0, 2.0, (4, 256)), _weight(rng, 256), dtype="float16")),
        ("bfloat16, 3 rows of 128 features",
         _forward_case(rng.normal(-1.0, 2.0, (3, 128)), _weight(rng, 128), dtype="bfloat16",
                       pad=4)),
        ("float16, 2 rows of 256 features near 300 (their squares add up to about "
         "23 000 000, far past float16's largest number, 65 504)",
         _forward_case(rng.normal(300.0, 2.0, (2, 256)), dtype="float16")),
        ("float16, one row of 64 features, rows 80 elements apart in memory",
         _forward_case(rng.normal(0.0, 1.0, (1, 64)), dtype="float16", pad=16)),
    ]


def _forward_reference(case):
    """float64 rstd per row, and y."""
    x = case["x"].astype(np.float64)
    rstd = 1 / np.sqrt((x * x).mean(-1) + float(case["eps"]))
    return rstd, x * rstd[:, None] * case["gamma"]


def _rstd_mistakes(case):
    """[(what went wrong, the rstd that mistake would save)]."""
    x = case["x"].astype(np.float64)
    n = x.shape[-1]
    block = 1 << (n - 1).bit_length()
    eps = float(case["eps"])
    mean_square = (x * x).mean(-1)
    mistakes = [
        ("the root mean square was saved; rstd is its reciprocal, 1 / sqrt(mean(x**2) + eps)",
         np.sqrt(mean_square + eps)),
        ("mean(x**2) was saved; rstd = 1 / sqrt(mean(x**2) + eps)", mean_square),
        ("eps goes inside the square root: 1 / sqrt(mean(x**2) + eps)",
         1 / (np.sqrt(mean_square) + eps)),
        ("eps is missing: rstd = 1 / sqrt(mean(x**2) + eps)", 1 / np.sqrt(mean_square)),
        ("the mean was subtracted: RMSNorm divides x itself by its root mean square, "
         "without centring it", 1 / np.sqrt(x.var(-1) + eps)),
    ]
    if block != n:
        mistakes.append(("divide by N, the number of real features, not by BLOCK_SIZE "
                         "(which also counts the masked lanes)",
                         1 / np.sqrt((x * x).sum(-1) / block + eps)))
    return mistakes


def _rows_hint(case, actual, expected, dtype):
    """The stride hint when the first row is right and later ones are not."""
    if actual.shape[0] > 1 and int(case["pad"]) and matches(actual[:1], expected[:1],
                                                            dtype=dtype) \
            and not matches(actual[1:], expected[1:], dtype=dtype):
        return ("the first row is right and later ones are not: row r starts at "
                "X + r * row_stride (here rows are padded in memory), not at X + r * N")
    return None


def _nan_hint(case, *arrays):
    n = case["x"].shape[-1]
    if any(np.isnan(np.asarray(a, np.float64)).any() for a in arrays) \
            and n != 1 << (n - 1).bit_length():
        return ("NaN came out of NaN going in: the lanes past N of this test's memory hold "
                "NaN (real padding holds anything), so some load read past the row. Load "
                "every row (and w) with mask=cols < N and other=0.0")
    return None


def _diagnose_forward(case, output):
    """A hint naming the likely mistake in the forward kernel, or None."""
    x = case["x"].astype(np.float64)
    dtype = str(case["dtype"])
    rstd, y_ref = _forward_reference(case)
    y = np.asarray(output["y"], dtype=np.float64)
    saved = np.asarray(output["rstd"], dtype=np.float64)
    hint = _rows_hint(case, y, y_ref, dtype)
    if hint:
        return hint
    if int(output["padding_written"]):
        return (f"the store wrote {int(output['padding_written'])} numbers into the lanes "
                "past N, which belong to someone else: store with mask=cols < N")
    if (y == UNWRITTEN).all():
        return "nothing was stored in Y: y still holds what was there before"
    if (saved == UNWRITTEN).all():
        return "store the row's rstd for the backward pass: tl.store(Rstd + row, rstd)"
    hint = _nan_hint(case, y, saved)
    if hint:
        return hint
    # rstd is small (1/300 here): float16's atol alone would accept any rstd, even 0
    if dtype == "float16" and (x * x).sum(-1).max() > FLOAT16_MAX and \
            not np.allclose(saved, rstd, rtol=tolerance_for("float16")[0], atol=0):
        return ("the sum of squares overflowed float16 (largest number 65 504): convert x "
                "to float32 right after loading it, x = tl.load(...).to(tl.float32)")
    if matches(saved, rstd, dtype="float32") and not matches(y, y_ref, dtype=dtype):
        if matches(y, x * rstd[:, None], dtype=dtype):
            return "rstd is right; multiply by the weight too: y = x * rstd * w"
        return "the saved rstd is right, so the slip is in the last step: y = x * rstd * w"
    with np.errstate(all="ignore"):
        for hint, wrong in _rstd_mistakes(case):
            if matches(saved, wrong, dtype="float32"):
                return hint
    if dtype in ("float16", "bfloat16"):
        return ("rstd carries low-precision rounding: convert x to float32 right after "
                "loading it (.to(tl.float32)) and keep the sum and rstd in float32")
    return None


def _judge_forward(case, output, *, with_rstd):
    rstd, y_ref = _forward_reference(case)
    dtype = str(case["dtype"])
    problem = mismatch(output["y"], y_ref, dtype=dtype, what="y")
    if problem is None and with_rstd:
        problem = mismatch(output["rstd"], rstd, dtype="float32", what="the saved rstd")
    if problem is None and int(output["padding_written"]):
        problem = "y is right, but the kernel also wrote past the end of each row"
    if problem is None:
        return None
    hint = _diagnose_forward(case, output)
    return problem + (f". Hint: {hint}" if hint else "")


def _judge_y(case, output):
    return _judge_forward(case, output, with_rstd=False)


def _judge_y_and_rstd(case, output):
    return _judge_forward(case, output, with_rstd=True)


# --- the backward -----------------------------------------------------------------------

def _dx_cases(rng):
    return [
        ("5 rows of 100 features, 2 rows a program (the last program gets one)",
         _backward_case(rng, 5, 100, 2, pad=3)),
        ("4 rows of 64 features, all 4 in one program", _backward_case(rng, 4, 64, 4)),
        ("3 rows of 37 features, one row a program", _backward_case(rng, 3, 37, 1, pad=1)),
        ("4 rows of 48 features near 5, 3 rows a program",
         _backward_case(rng, 4, 48, 3, offset=5.0)),
        ("float16, 4 rows of 96 features, 3 rows a program",
         _backward_case(rng, 4, 96, 3, dtype="float16")),
        ("bfloat16, 2 rows of 128 features, 2 rows a program",
         _backward_case(rng, 2, 128, 2, dtype="bfloat16", pad=2)),
        ("3 rows of 32 features near 0 (mean square about 0.0001), the rstd saved "
         "with eps = 0.1, so eps matters",
         _backward_case(rng, 3, 32, 2, scale=0.01, eps=0.1)),
    ]


def _partial_cases(rng):
    return [
        ("7 rows of 48 features, 3 rows a program (3, 3 and 1)",
         _backward_case(rng, 7, 48, 3)),
        ("4 rows of 64 features, 2 rows a program", _backward_case(rng, 4, 64, 2, pad=5)),
        ("6 rows of 20 features, all in one program", _backward_case(rng, 6, 20, 6)),
        ("5 rows of 100 features, one row a program", _backward_case(rng, 5, 100, 1, pad=2)),
        ("float16, 256 rows of 32 features near 1 with dy near 1, all in one program "
         "(dW's sums reach about 256, where float16's numbers are 0.25 apart)",
         _backward_case(rng, 256, 32, 256, dtype="float16", offset=1.0, scale=0.1,
                        dy_offset=1.0)),
    ]


def _backward_terms(case):
    """float64 x_hat, g = dy * w and rstd (the saved float32 one)."""
    x = case["x"].astype(np.float64)
    rstd = case["rstd"].astype(np.float64)[:, None]  # M,1
    return x * rstd, case["dy"].astype(np.float64) * case["gamma"], rstd


def _dx_reference(case):
    x_hat, g, rstd = _backward_terms(case)
    return rstd * (g - x_hat * (g * x_hat).mean(-1, keepdims=True))


def _dw_reference(case):
    x_hat, _, _ = _backward_terms(case)
    return (case["dy"].astype(np.float64) * x_hat).sum(0)


def _dx_mistakes(case):
    """[(what went wrong, the dx that mistake would give)]."""
    x_hat, g, rstd = _backward_terms(case)
    dy = case["dy"].astype(np.float64)
    n = x_hat.shape[-1]
    block = 1 << (n - 1).bit_length()
    mean_gx = (g * x_hat).mean(-1, keepdims=True)
    mistakes = [
        ("only the path through x itself is there: rstd depends on x too, and that "
         "dependence adds a second term (the one your assignment-04 derivation gets "
         "through rstd)", rstd * g),
        ("the weight is missing from dx: the gradient that reaches the normalized row "
         "has passed through w",
         rstd * (dy - x_hat * (dy * x_hat).mean(-1, keepdims=True))),
        ("dx carries a term that only layer norm has: RMSNorm subtracts no mean from x, "
         "so nothing in its dx comes from a mean of the incoming gradient",
         rstd * (g - g.mean(-1, keepdims=True) - x_hat * mean_gx)),
        ("the term that comes through rstd has the wrong sign (check it against your "
         "assignment-04 derivation)", rstd * (g + x_hat * mean_gx)),
        ("each row of dx is off by one factor, the same for all its lanes: look at the "
         "overall scale", g - x_hat * mean_gx),
    ]
    if block != n:
        mistakes.append(("a mean over the row divides by N, the number of real features, "
                         "not by BLOCK_SIZE",
                         rstd * (g - x_hat * (g * x_hat).sum(-1, keepdims=True) / block)))
    mean_square = (case["x"].astype(np.float64) ** 2).mean(-1, keepdims=True)
    for eps, how in ((0.0, "without eps"), (1e-5, "with eps = 1e-5")):
        with np.errstate(all="ignore"):
            own = 1 / np.sqrt(mean_square + eps)
            own_hat = case["x"].astype(np.float64) * own
            own_dx = own * (g - own_hat * (g * own_hat).mean(-1, keepdims=True))
        mistakes.append((f"dx uses an rstd recomputed from x {how}, not the one the "
                         "forward saved: load it from Rstd + row (the forward's eps is not "
                         "the backward's to guess)", own_dx))
    return mistakes


PAST_M_HINT = ("the last program ran past row M - 1, the last of x (the rows past it hold "
               "NaN here; in real memory they hold anything, or nothing at all): program p "
               "handles rows p * rows_per_program up to, not including, the smaller of "
               "(p + 1) * rows_per_program and M, so end its loop at "
               "tl.minimum(first + rows_per_program, M)")


def _ran_past_m(output):
    return int(output.get("rows_past_m_written", 0)) > 0


def _diagnose_dx(case, output):
    dtype = str(case["dtype"])
    expected = _dx_reference(case)
    dx = np.asarray(output["dx"], dtype=np.float64)
    unwritten = (dx == UNWRITTEN).all(-1)
    if unwritten.all():
        return "nothing was stored in DX: dx still holds what was there before"
    if unwritten.any():
        rows = ", ".join(str(r) for r in np.flatnonzero(unwritten))
        return (f"rows {rows} of dx were never written: program p handles rows "
                "p * rows_per_program up to (not including) the smaller of "
                "(p + 1) * rows_per_program and M; loop over every one of its rows")
    if _ran_past_m(output):
        return PAST_M_HINT
    hint = _rows_hint(case, dx, expected, dtype)
    if hint:
        return hint
    if int(output["padding_written"]):
        return (f"the store wrote {int(output['padding_written'])} numbers into the lanes "
                "past N of dx, which belong to someone else: store with mask=cols < N")
    hint = _nan_hint(case, dx)
    if hint:
        return hint
    with np.errstate(all="ignore"):
        for hint, wrong in _dx_mistakes(case):
            if matches(dx, wrong, dtype=dtype):
                return hint
    if dtype in ("float16", "bfloat16"):
        return ("dx carries low-precision rounding: convert x, dy and w to float32 after "
                "loading them, and round only when you store dx")
    return None


def _judge_dx(case, output):
    dtype = str(case["dtype"])
    problem = mismatch(output["dx"], _dx_reference(case), dtype=dtype, what="dx")
    if problem is None and int(output["padding_written"]):
        problem = "dx is right, but the kernel also wrote past the end of each row"
    if problem is None and _ran_past_m(output):
        problem = (f"dx is right, but the kernel also stored "
                   f"{int(output['rows_past_m_written'])} numbers past the last row of x")
    if problem is None:
        return None
    hint = _diagnose_dx(case, output)
    return problem + (f". Hint: {hint}" if hint else "")


def _partial_mistakes(case):
    """[(what went wrong, the dW the rows of PartialDW would add up to)]."""
    x_hat, g, _ = _backward_terms(case)
    dy = case["dy"].astype(np.float64)
    m = dy.shape[0]
    rows_per_program = int(case["rows_per_program"])
    starts = range(0, m, rows_per_program)
    last_rows = [min(s + rows_per_program, m) - 1 for s in starts]
    return [
        ("dW carries the weight once too often: w scales y, so it is not part of its "
         "own gradient", (g * x_hat).sum(0)),
        ("each row of dW is off by its row's rstd: dW is made of the normalized rows, "
         "not of x itself",
         (dy * case["x"].astype(np.float64)).sum(0)),
        ("that is the sum of dy over the rows (a bias's gradient): the weight multiplies "
         "the normalized row, which belongs in its gradient", dy.sum(0)),
        ("each program kept only its last row's share: add every row's share into one "
         "float32 accumulator (acc += ...), started with tl.zeros",
         (dy * x_hat)[last_rows].sum(0)),
        ("each program kept only its first row's share: add every row of the program "
         "into the accumulator", (dy * x_hat)[list(starts)].sum(0)),
        ("the last row of each program is missing from the sum: program p adds every one of "
         "its rows, from p * rows_per_program up to (not including) the smaller of "
         "(p + 1) * rows_per_program and M",
         np.delete(dy * x_hat, last_rows, axis=0).sum(0)),
    ]


def _program_rows(case):
    """[(first, last)] the rows of each program, as the assignment splits them."""
    m = case["dy"].shape[0]
    step = int(case["rows_per_program"])
    return [(s, min(s + step, m)) for s in range(0, m, step)]


def _partial_reference(case, dealt=False):
    """Each program's row of PartialDW: the sum of dy * x_hat over its own rows (with
    dealt=True, over rows p, p + programs, p + 2 * programs, ...: the same work dealt
    out like cards, as parallel as the assignment's split and accepted too)."""
    x_hat, _, _ = _backward_terms(case)
    terms = case["dy"].astype(np.float64) * x_hat
    if dealt:
        programs = len(_program_rows(case))
        return np.stack([terms[p::programs].sum(0) for p in range(programs)])
    return np.stack([terms[a:b].sum(0) for a, b in _program_rows(case)])


def _rows_match(partial, expected):
    return all(matches(partial[p], expected[p], dtype="float32") for p in range(len(expected)))


def _split_problem(case, partial):
    """None when each row of PartialDW is its own program's sum; else what went wrong
    (called once the rows already add up to dW)."""
    expected = _partial_reference(case)
    if partial.shape != expected.shape:
        return f"PartialDW has {partial.shape[0]} rows; there are {len(expected)} programs"
    if _rows_match(partial, expected) or _rows_match(partial, _partial_reference(case, True)):
        return None
    wrong = [p for p in range(len(expected))
             if not matches(partial[p], expected[p], dtype="float32")]
    if not wrong:
        return None
    first, last = _program_rows(case)[wrong[0]]
    problem = (f"the rows of PartialDW add up to dW, but row {wrong[0]} is not the sum of "
               f"program {wrong[0]}'s own rows ({first} to {last - 1}): "
               + mismatch(partial[wrong[0]], expected[wrong[0]], dtype="float32",
                          what=f"row {wrong[0]}"))
    idle = [p for p in range(1, len(expected)) if not partial[p].any()]
    if len(expected) > 1 and len(idle) == len(expected) - 1:
        hint = ("program 0 did every row and the others stored zeros, so nothing ran in "
                "parallel: program p handles only rows p * rows_per_program up to, not "
                "including, the smaller of (p + 1) * rows_per_program and M")
    else:
        hint = ("program p adds only its own rows, p * rows_per_program up to, not "
                "including, the smaller of (p + 1) * rows_per_program and M, and stores "
                "their sum at PartialDW + p * N + cols")
    return f"{problem}. Hint: {hint}"


def _judge_partial_dw(case, output):
    partial = np.asarray(output["partial_dw"], dtype=np.float64)  # programs, N
    expected = _dw_reference(case)
    if int(output["partial_overrun"]):
        return (f"{int(output['partial_overrun'])} numbers were stored past the last row of "
                "PartialDW: program p writes one row of N numbers, at PartialDW + p * N + "
                "cols, with mask=cols < N (write it once, after the loop over its rows)")
    unwritten = (partial == UNWRITTEN).all(-1)
    if unwritten.all():
        return ("nothing was stored in PartialDW: each program stores its float32 sum "
                "at PartialDW + p * N + cols")
    if unwritten.any():
        return (f"the rows {', '.join(str(p) for p in np.flatnonzero(unwritten))} of "
                "PartialDW were never written: every program p stores its sum (zeros if it "
                "had no rows) at PartialDW + p * N + cols")
    if (partial == UNWRITTEN).any():
        return ("part of a row of PartialDW was never written: store all N lanes "
                "(mask=cols < N)")
    dw = partial.sum(0)
    problem = mismatch(dw, expected, dtype="float32", what="the rows of PartialDW added up")
    if problem is None:
        return _split_problem(case, partial)
    hint = PAST_M_HINT if _ran_past_m(output) else _nan_hint(case, partial)
    with np.errstate(all="ignore"):
        for text, wrong in _partial_mistakes(case):
            if hint is None and matches(dw, wrong, dtype="float32"):
                hint = text
    if hint is None and str(case["dtype"]) != "float32" and matches(
            dw, expected, dtype=str(case["dtype"])):
        hint = ("the sums drifted by rounding: with half-precision inputs the accumulator "
                "must still be float32 (tl.zeros([BLOCK_SIZE], dtype=tl.float32)), and "
                "each row's share converted to float32 before it is added")
    return problem + (f". Hint: {hint}" if hint else "")


# --- the inline questions ---------------------------------------------------------------

LLAMA_M, LLAMA_N = 4096, 2048  # question 1's shape, bfloat16
BF16, F32 = 2, 4  # bytes a number


def llama_rms_norm_bytes(m, n, weight_bytes=BF16):
    """Bytes of the eight eager kernels of Hugging Face's LlamaRMSNorm on bfloat16
    x (M, N) with a bfloat16 weight: x.to(float32), pow(2), mean(-1), + eps,
    rsqrt, x * rstd, .to(bfloat16), weight * it. Each reads its tensor inputs
    and writes its result, in the dtype it holds. weight_bytes=F32 counts a
    float32 weight (as Liger-Kernel's benchmark script leaves it): the last
    multiply then reads it in float32 and writes y promoted to float32."""
    if weight_bytes != BF16:
        return (llama_rms_norm_bytes(m, n) - (n * BF16 + 2 * m * n * BF16)
                + n * weight_bytes + m * n * BF16 + m * n * weight_bytes)
    big, row = m * n, m
    per_kernel = [big * BF16 + big * F32,  # to(float32)
                  2 * big * F32,  # pow: read x, write x**2
                  big * F32 + row * F32,  # mean: read x**2, write one number a row
                  2 * row * F32, 2 * row * F32,  # + eps, rsqrt: (M, 1) in and out
                  2 * big * F32 + row * F32,  # x * rstd: read x and rstd, write
                  big * F32 + big * BF16,  # to(bfloat16)
                  n * BF16 + 2 * big * BF16]  # weight * it: read both, write y
    return sum(per_kernel)


def _true_llama_bytes():
    return llama_rms_norm_bytes(LLAMA_M, LLAMA_N)


LLAMA_RTOL = 1e-3  # the per-row terms are 0.03% of the total: leaving them out is fine


def _llama_slips():
    """{hint: bytes} of the usual miscounts."""
    big = LLAMA_M * LLAMA_N
    truth = _true_llama_bytes()
    return {
        "the two .to() conversions are kernels too: each reads the whole tensor in one "
        "dtype and writes it in the other": truth - 12 * big,
        "between the two conversions the tensors are float32, 4 bytes a number, not "
        "bfloat16's 2": 22 * big,
        "this is the bytes of a fused RMSNorm (read x once, write y once); the question "
        "asks for the eight eager kernels together": 2 * big * BF16,
        "x is bfloat16, 2 bytes a number, until it is converted: count each tensor in "
        "the dtype it holds": 44 * big,
        "that is the count in bits; a byte is 8 bits": 8 * truth,
    }


def _judge_llama_bytes(case, output):
    answer = str(output.get("answer", "None")).strip()
    value = number_from_answer(answer)
    if value is None:
        return f"give one number, the bytes the eight kernels move in all (you gave {answer!r})"
    truth = _true_llama_bytes()
    if abs(value / truth - 1) <= LLAMA_RTOL:
        return None
    for hint, wrong in _llama_slips().items():
        if abs(value / wrong - 1) <= LLAMA_RTOL:
            return f"not yet right: you answered {answer}. Hint: {hint}"
    if abs(value * 2 * LLAMA_M * LLAMA_N * BF16 / truth - 1) <= 0.02:
        return (f"not yet right: you answered {answer}, a ratio; give the bytes themselves")
    return (f"not yet right: you answered {answer}. List the eight kernels, and for each "
            "the tensors it reads and the one it writes, each in its own dtype, as the "
            "lesson counts; then add them up")


# Question 2: the whole two-stage backward of Part 4 (kernel and the launcher's sum of
# the partial sums), bfloat16 rows, w loaded once per program, PartialDW float32.
BACKWARD_M, BACKWARD_N, BACKWARD_PROGRAMS = 4096, 4096, 64  # rows_per_program = 64
BACKWARD_RTOL = 1e-3  # rstd, dW and its conversion to the weight's dtype: 0.05% in all


def rms_backward_bytes(m, n, programs, *, w_loads=None, partial_bytes=F32,
                       partial_reads=1, partial_writes=1):
    """Bytes the backward moves: the kernel reads x and dy (bfloat16) and the M
    float32 rstd, writes dx, loads w `w_loads` times (once per program unless told)
    and writes each program's float32 row of partial sums; the launcher's sum reads
    those rows back and writes dW, N float32. The keywords give the usual miscounts."""
    w_loads = programs if w_loads is None else w_loads
    rows = 3 * m * n * BF16 + m * F32  # x, dy in; dx out; rstd in
    weight = w_loads * n * BF16
    partial = programs * n * partial_bytes * (partial_writes + partial_reads)
    return rows + weight + partial + n * F32  # + dW written by the sum


def _true_backward_bytes():
    return rms_backward_bytes(BACKWARD_M, BACKWARD_N, BACKWARD_PROGRAMS)


def _backward_slips():
    """{hint: bytes} of the usual miscounts, each well outside the tolerance."""
    m, n, p = BACKWARD_M, BACKWARD_N, BACKWARD_PROGRAMS
    truth = _true_backward_bytes()
    return {
        "w is loaded once per program, before its loop, not once per row (a kernel "
        "that loads it in its loop finds it in cache after the first row)":
            rms_backward_bytes(m, n, p, w_loads=m),
        "that is x, dy and dx alone; the backward has a second stage: each program "
        "writes its row of partial sums of dW, and the launcher's sum reads them "
        "back (and each program loads w)": 3 * m * n * BF16,
        "the partial sums of dW are part of the traffic: each program writes its row, "
        "and the launcher's sum reads every row back": rms_backward_bytes(
            m, n, p, partial_reads=0, partial_writes=0),
        "the partial sums are float32 (4 bytes a number) whatever the input's dtype, "
        "and they cross memory twice: the kernel writes them, the launcher's sum reads "
        "them back": rms_backward_bytes(m, n, p, partial_reads=0),
        "each of the 64 programs loads w for itself, not one load for them all":
            rms_backward_bytes(m, n, p, w_loads=1),
        "x, dy and dx are bfloat16, 2 bytes a number: count each tensor in its own "
        "dtype": truth + 3 * m * n * (F32 - BF16),
        "that is the count in bits; a byte is 8 bits": 8 * truth,
    }


def _judge_backward_bytes(case, output):
    answer = str(output.get("answer", "None")).strip()
    value = number_from_answer(answer)
    if value is None:
        return f"give one number, the bytes of the whole backward (you gave {answer!r})"
    if _near(value, _true_backward_bytes(), BACKWARD_RTOL):
        return None
    for hint, wrong in _backward_slips().items():
        if _near(value, wrong, BACKWARD_RTOL / 2):
            return f"not yet right: you answered {answer}. Hint: {hint}"
    return (f"not yet right: you answered {answer}. List what the kernel reads and "
            "writes (each tensor in its own dtype, w once per program), then what the "
            "launcher's sum of the partial-sum rows reads and writes, and add them up")


# Question 3: quoted timings (Liger-Kernel's benchmark data, linkedin/Liger-Kernel,
# benchmark/data/all_benchmark_data.csv: RMSNorm, speed, y_value_50, on an
# A100-SXM4-80GB in bfloat16, Liger-Kernel 0.2.1) and NVIDIA's A100 datasheet (A100 80GB
# SXM: 2,039 GB/s). (a) the backward row; (b) the forward row.
QUOTED_M, QUOTED_N = 2048, 16384
QUOTED_FUSED_MS = 0.09526  # Liger's Triton RMSNorm forward, as the question quotes it
QUOTED_BACKWARD_MS = 0.3205  # its backward, the same file (0.32051199674606323)
QUOTED_EAGER_MS = 0.9856320023536682  # Hugging Face's LlamaRMSNorm, the same file
A100_PEAK = 2039e9  # bytes a second
FRACTION_RTOL, PREDICTION_RTOL = 0.01, 0.02


def _fused_rate():
    """Bytes a second the fused forward reached, counting 2 * M * N * bytes."""
    return 2 * QUOTED_M * QUOTED_N * BF16 / (QUOTED_FUSED_MS * 1e-3)


def liger_021_backward_bytes(m, n, *, dw_bytes=F32, dw_crossings=2, w_loads=1):
    """Bytes of Liger-Kernel 0.2.1's RMSNorm backward (the version that measured the
    quoted row): one program per row reads x and dy and writes dx (bfloat16), reads its
    rstd (float32), and stores its row's share of dW as one row of an (M, N) buffer in
    the weight's dtype (float32 in the benchmark); torch.sum reads those M rows back and
    writes dW. w (float32) stays in cache after the first program: counted once. The
    keywords give the usual miscounts."""
    rows = 3 * m * n * BF16 + m * F32
    return rows + dw_crossings * m * n * dw_bytes + w_loads * n * F32 + n * F32


def _backward_rate(**miscount):
    return (liger_021_backward_bytes(QUOTED_M, QUOTED_N, **miscount)
            / (QUOTED_BACKWARD_MS * 1e-3))


def _true_fraction_of_peak():
    return _backward_rate() / A100_PEAK


def _true_eager_ms(weight_bytes=BF16):
    """The prediction with the question's bfloat16 weight; weight_bytes=F32 gives
    the one with the float32 weight of Liger-Kernel's benchmark script (also right)."""
    return llama_rms_norm_bytes(QUOTED_M, QUOTED_N, weight_bytes) / _fused_rate() * 1e3


def _near(value, target, rtol):
    return target != 0 and abs(value / target - 1) <= rtol


def _judge_fraction_of_peak(case, output):
    answer = str(output.get("answer", "None")).strip()
    value = number_from_answer(answer)
    if value is None:
        return f"give one number, a fraction between 0 and 1 (you gave {answer!r})"
    truth = _true_fraction_of_peak()
    if _near(value, truth, FRACTION_RTOL):
        return None
    m, n, seconds = QUOTED_M, QUOTED_N, QUOTED_BACKWARD_MS * 1e-3
    slips = [
        (truth * 100, "a fraction, not a percentage: 0.5 is 50%"),
        (3 * m * n * BF16 / seconds / A100_PEAK,
         "that is the lesson's count, x and dy read and dx written; this backward also "
         "writes a float32 row of dW for every row, which the sum reads back"),
        (_backward_rate(dw_crossings=1) / A100_PEAK,
         "the float32 rows of dW cross memory twice: the kernel writes them and "
         "torch.sum reads them back, 4 bytes a number each time"),
        (_backward_rate(w_loads=m) / A100_PEAK,
         "w (64 KiB) stays in the cache after the first program reads it: count it once, "
         "not once a row"),
        (rms_backward_bytes(m, n, 108) / seconds / A100_PEAK,
         "that is Part 4's design, one program per streaming multiprocessor; the version "
         "that measured this row had one program per row, so its buffer of dW has M rows"),
        (truth * 1e9 / 2**30, "a datasheet's GB is 10**9 bytes, not 2**30"),
        (truth * 2**30 / 1e9, "a datasheet's GB is 10**9 bytes, not 2**30"),
        (truth * 1e3, "the quoted time is in milliseconds: 1 ms is 1e-3 s"),
        (truth / 1e3, "the quoted time is in milliseconds: 1 ms is 1e-3 s"),
    ]
    for wrong, hint in slips:
        if _near(value, wrong, FRACTION_RTOL):
            return f"not yet right: you answered {answer}. Hint: {hint}"
    return (f"not yet right: you answered {answer}. Add up the bytes this backward "
            "moves (x, dy, dx in bfloat16; the M float32 rows of dW, written and read "
            "back; w once), divide by the quoted time in seconds: that is the rate it "
            "reached; then divide by the peak, in bytes a second")


def _judge_eager_prediction(case, output):
    answer = str(output.get("answer", "None")).strip()
    value = number_from_answer(answer)
    if value is None:
        return f"give one number, in milliseconds (you gave {answer!r})"
    truth = _true_eager_ms()
    if any(_near(value, right, PREDICTION_RTOL) for right in (truth, _true_eager_ms(F32))):
        return None  # a bfloat16 weight, or the benchmark script's float32 one
    at_peak = llama_rms_norm_bytes(QUOTED_M, QUOTED_N) / A100_PEAK * 1e3
    slips = [
        (QUOTED_EAGER_MS, "that is the time Liger-Kernel's benchmark measured for the eager "
                          "module; the question asks what the bytes predict from the fused "
                          "kernel's rate (it comes within 15% of the measured time)"),
        (at_peak, "that is the time at the datasheet's peak, which no kernel reaches; the "
                  "question supposes the rate the fused forward reached"),
        (llama_rms_norm_bytes(LLAMA_M, LLAMA_N) / _fused_rate() * 1e3,
         "count the eight kernels' bytes at this question's shape, M = 2048 and N = 16384, "
         "not at Question 1's"),
        (truth * 1e-3, "give milliseconds, not seconds"),
        (truth * 1e3, "give milliseconds, not microseconds"),
    ]
    for wrong, hint in slips:
        if _near(value, wrong, PREDICTION_RTOL):
            return f"not yet right: you answered {answer}. Hint: {hint}"
    return (f"not yet right: you answered {answer}. Count the eight kernels' bytes at "
            "M = 2048, N = 16384 as in Question 1, and divide them by the rate the fused "
            "kernel reached (its bytes over its time)")


def _no_inputs(rng):
    return [("your answer", {})]


# --- the autograd.Function --------------------------------------------------------------

def _function_case(rng, shape, dtype="float32", x_width=None, dy_width=None, eps=1e-5):
    n = shape[-1]
    return {
        "x": _rounded(rng.normal(0.5, 1.5, shape), dtype),
        "dy": _rounded(rng.normal(0.0, 1.0, shape), dtype),
        "gamma": _rounded(rng.normal(1.0, 0.5, n), dtype),
        "shape": np.array(shape),
        "eps": np.array(eps),
        "dtype": np.array(dtype),
        "x_width": np.array(x_width or n),
        "dy_width": np.array(dy_width or n),
    }


def _function_cases(rng):
    return [
        ("x of shape (2, 3, 40): a batch of 2 sequences of 3 tokens",
         _function_case(rng, (2, 3, 40))),
        ("4 rows of 48 features, x and dy slices of tensors 64 wide",
         _function_case(rng, (4, 48), x_width=64, dy_width=64)),
        ("float16, x of shape (3, 2, 64)", _function_case(rng, (3, 2, 64), "float16")),
        ("one row of 100 features with eps = 0.1, dy a slice of a tensor 128 wide",
         _function_case(rng, (1, 100), dy_width=128, eps=0.1)),
    ]


def _function_reference(case):
    """float64 y, dx and dW for the case's x (..., N), w and dy."""
    n = case["x"].shape[-1]
    x = case["x"].astype(np.float64).reshape(-1, n)  # M,N
    rstd = 1 / np.sqrt((x * x).mean(-1) + float(case["eps"]))  # M
    rows = {"x": x, "dy": case["dy"].reshape(-1, n), "gamma": case["gamma"], "rstd": rstd}
    y = x * rstd[:, None] * case["gamma"]
    return (y.reshape(case["x"].shape), _dx_reference(rows).reshape(case["x"].shape),
            _dw_reference(rows))


def _judge_function(case, output):
    dtype = str(case["dtype"])
    if not int(output["forward_calls"]) or not int(output["backward_calls"]):
        return ("the launchers were not called (launch_rms_forward: "
                f"{int(output['forward_calls'])} calls, launch_rms_backward: "
                f"{int(output['backward_calls'])}): forward must run the kernel through "
                "launch_rms_forward and backward through launch_rms_backward, not recompute "
                "RMSNorm with torch operations")
    if int(output.get("rstd_not_saved", 0)) or int(output["forward_calls"]) > 1:
        return ("backward recomputes rstd: it handed launch_rms_backward an rstd other than "
                "the one launch_rms_forward returned (launch_rms_forward ran "
                f"{int(output['forward_calls'])} times for one forward and one backward). "
                "Save the rstd of forward with ctx.save_for_backward and hand that tensor on: "
                "recomputing it costs another pass over x")
    if int(output["dx_missing"]) or int(output["dw_missing"]):
        which = " and ".join(name for name, key in (("x.grad", "dx_missing"),
                                                     ("weight.grad", "dw_missing"))
                             if int(output[key]))
        return (f"{which} stayed None: backward returns one gradient per input of forward, "
                "in order: dx (shaped like x), dW, and None for eps")
    y_ref, dx_ref, dw_ref = _function_reference(case)
    problem = mismatch(output["y"], y_ref, dtype=dtype, what="y")
    if problem:
        return problem + (". Hint: this test runs eager stand-ins for the launchers in your "
                          "Function, so look at how forward turns x into rows of N and y "
                          "back into x's shape")
    problem = mismatch(output["dx"], dx_ref, dtype=dtype, what="x.grad")
    if problem is None:
        problem = mismatch(output["dw"], dw_ref, dtype=dtype, what="weight.grad")
    if problem is None:
        return None
    return problem + (". Hint: this test runs eager stand-ins for the launchers in your "
                      "Function, so look at what backward hands launch_rms_backward: dy as "
                      "rows of N laid out like the saved x, and the rstd that forward saved")


CHECKS = {
    "rms_forward_rows": Check(_rows_cases, _judge_y),
    "rms_forward_ragged": Check(_ragged_cases, _judge_y),
    "rms_forward_rstd": Check(_rstd_cases, _judge_y_and_rstd),
    "rms_forward_half": Check(_half_cases, _judge_y),
    "rms_backward_dx": Check(_dx_cases, _judge_dx),
    "rms_backward_partial_dw": Check(_partial_cases, _judge_partial_dw),
    "rms_llama_bytes": Check(_no_inputs, _judge_llama_bytes),
    "rms_backward_bytes": Check(_no_inputs, _judge_backward_bytes),
    "rms_fused_fraction_of_peak": Check(_no_inputs, _judge_fraction_of_peak),
    "rms_eager_time_prediction": Check(_no_inputs, _judge_eager_prediction),
    "rms_autograd_function": Check(_function_cases, _judge_function),
}
