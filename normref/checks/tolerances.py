"""The one tolerance table every check compares with, the comparison, and the one
reading of a numeric answer.

Tolerances are keyed by the dtype of the *input*: a student's float32 code is
held to float32 accuracy against a float64 reference computed from the same
input.
"""

import math
import re
from fractions import Fraction

import numpy as np

TOLERANCES = {  # dtype name -> (rtol, atol)
    "float64": (1e-6, 1e-8),
    "float32": (1e-4, 1e-5),
    "bfloat16": (2e-2, 2e-2),
    "float16": (5e-3, 5e-3),
}


def tolerance_for(dtype):
    return TOLERANCES.get(np.dtype(dtype).name if not isinstance(dtype, str) else dtype,
                          TOLERANCES["float64"])


def _show(array, limit=8):
    flat = np.asarray(array, dtype=np.float64).ravel()
    text = np.array2string(flat[:limit], precision=4, separator=", ", suppress_small=True)
    return text[:-1] + ", ...]" if flat.size > limit else text


def mismatch(actual, expected, *, dtype, what="your result"):
    """None when `actual` matches `expected` within the table's tolerance for
    `dtype`; otherwise a sentence saying how it differs."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    if actual.shape != expected.shape:
        return f"{what} has shape {actual.shape}; expected shape {expected.shape}"
    if not np.issubdtype(actual.dtype, np.number) and actual.dtype != bool:
        return f"{what} holds {actual.dtype} values, not numbers"
    rtol, atol = tolerance_for(dtype)
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    if np.any(np.isnan(a) & ~np.isnan(e)):
        return f"{what} contains NaN where the answer is a number: {_show(a)}"
    if not np.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True):
        gap = np.abs(a - e) - (atol + rtol * np.abs(e))  # > 0 where out of tolerance
        at = np.unravel_index(int(np.nanargmax(np.where(np.isnan(gap), -np.inf, gap))),
                              a.shape) if a.ndim else ()
        worst = np.nanmax(np.abs(a - e)) if a.size else 0.0
        shown_alike = _show(a) == _show(e)
        where = f" at index {tuple(int(i) for i in at)}" if a.ndim else ""
        detail = (f"; they look alike at the 4 decimals shown, but{where} yours is "
                  f"{float(a[at]):.12g} and the answer {float(e[at]):.12g}" if shown_alike
                  else "")
        return (f"{what} is {_show(a)}; expected {_show(e)}{detail} "
                f"(largest difference {worst:.3g}, tolerance rtol={rtol:g}, atol={atol:g})")
    return None


def matches(actual, expected, *, dtype):
    return mismatch(actual, expected, dtype=dtype) is None


# What str() prints for a number held in a numpy scalar, a tensor, a Decimal or a
# Fraction: np.int64(16), tensor(3.5000), tensor(16, dtype=torch.int32), Decimal('3.5'),
# and a tensor's other keywords: tensor(0.6910, device='cuda:0'),
# tensor(0.85, requires_grad=True), tensor(2., grad_fn=<MulBackward0>).
_WRAPPED = re.compile(r"(?:np\.|numpy\.)?(?:tensor|u?int\d*|float\d*|Decimal|Fraction)"
                      r"\(\s*'?([^',()]*?)'?\s*"
                      r"(?:,\s*\w+=(?:'[^']*'|<\w+>|[\w.:]+))*\)")


def number_from_answer(answer):
    """A student's numeric answer, sent as its str(), as a finite float; None if it
    is not one. Every exact numeric type an answer may have is read: 16, 16.0,
    1e-3, 7/2 (a Fraction), Decimal, numpy scalars, 0-d tensors. True and
    False are not numbers here."""
    text = str(answer).strip()
    wrapped = _WRAPPED.fullmatch(text)
    if wrapped:
        text = wrapped.group(1).strip()
    try:
        value = float(Fraction(text))
    except (ValueError, ZeroDivisionError):
        return None
    return value if math.isfinite(value) else None
