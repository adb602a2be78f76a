"""Unit 06 checks, the grader-facing half: inputs, references, diagnoses."""

import functools

import numpy as np
import torch

from normref import quant
from normref.checks._registry import Check
from normref.checks.quant_probes import grid_quantizer
from normref.checks.tolerances import matches, mismatch

SMALL_EXAMPLE = np.array([0.5, -1.0, 3.0, 7.0], dtype=np.float32)
TABLE_MUS = (0.0, 1.0, 5.0, 20.0)
TABLE_RTOL = 0.25  # the student's own seed and sizes move the figures by ~5%
ERROR_RTOL = 1e-3  # norm errors: float32 arithmetic may differ, rounding may not


def _f32(array):
    return np.asarray(array, dtype=np.float32)


def _listed(values):
    return "[" + ", ".join(f"{v:.3g}" for v in np.ravel(values)) + "]"


# -- fp8_max -----------------------------------------------------------------

def _fp8_max_cases(rng):
    return [(f"dtype = torch.{name}", {"dtype": np.array(name)})
            for name in ("float8_e4m3fn", "float8_e5m2")]


def _judge_fp8_max(case, output):
    dtype = getattr(torch, str(case["dtype"]))
    expected = quant.fp8_max(dtype)
    got = float(output["fmax"])
    if got == expected:
        return None
    if got == float(torch.finfo(dtype).tiny):
        return f"you returned {got:g}, the smallest normal value; use torch.finfo(dtype).max"
    return f"you returned {got:g}; the largest finite value is torch.finfo(dtype).max"


# -- fp8_round_trip ----------------------------------------------------------

def _round_trip_cases(dtype_name, big):
    def cases(rng):
        dtype = np.array(dtype_name)
        with_zeros = rng.normal(size=(8, 16))
        with_zeros[rng.random((8, 16)) < 0.3] = 0.0
        return [
            ("x = [0.5, -1, 3, 7]", {"x": SMALL_EXAMPLE, "dtype": dtype}),
            ("N(0, 1), shape (64, 128)", {"x": _f32(rng.normal(size=(64, 128))), "dtype": dtype}),
            ("tokens with an offset, N(5, 1), shape (32, 64)",
             {"x": _f32(rng.normal(5.0, 1.0, size=(32, 64))), "dtype": dtype}),
            ("small values, N(0, 0.001^2), shape (16, 64)",
             {"x": _f32(rng.normal(0.0, 1e-3, size=(16, 64))), "dtype": dtype}),
            (f"large values, N(0, {big:g}^2), shape (16, 64)",
             {"x": _f32(rng.normal(0.0, big, size=(16, 64))), "dtype": dtype}),
            ("a tensor with many exact zeros", {"x": _f32(with_zeros), "dtype": dtype}),
            ("an all-zero tensor", {"x": np.zeros((4, 8), np.float32), "dtype": dtype}),
            ("a 3-D tensor (2, 3, 16)",
             {"x": _f32(rng.normal(1.0, 3.0, size=(2, 3, 16))), "dtype": dtype}),
        ]

    return cases


def _clamp_cases(rng):
    e4m3, e5m2 = np.array("float8_e4m3fn"), np.array("float8_e5m2")
    beyond = np.array([1.0, 1e5, -1e5, 3e4, 7e4, -2.5], np.float32)
    small = _f32(rng.normal(size=(16, 32)))
    return [
        ("e5m2, scale = 1, values up to 1e5 (fmax is 57344)",
         {"x": beyond, "dtype": e5m2, "scale": np.array(1.0)}),
        ("e5m2, a stale scale 57344 / 1.5 while |x| reaches about 4",
         {"x": _f32(4 * small / np.abs(small).max()), "dtype": e5m2,
          "scale": np.array(57344 / 1.5)}),
        ("e4m3, a stale scale 448 / 2 for N(0, 3^2) values",
         {"x": 3 * small, "dtype": e4m3, "scale": np.array(448 / 2)}),
        ("e4m3, scale = 1, values up to 1000 (fmax is 448)",
         {"x": np.array([1000.0, -1000.0, 460.0, 3.0], np.float32), "dtype": e4m3,
          "scale": np.array(1.0)}),
        ("e4m3, a scale that leaves room: no value reaches fmax",
         {"x": small, "dtype": e4m3, "scale": np.array(100.0 / np.abs(small).max())}),
    ]


def _reference_round_trip(case):
    """(reference output, the scale it used, the torch dtype)."""
    x = torch.from_numpy(case["x"].copy())
    dtype = getattr(torch, str(case["dtype"]))
    scale = float(case["scale"]) if "scale" in case else float(quant.amax_scale(x, dtype))
    return quant.fp8_round_trip(x, dtype, scale).numpy(), scale, dtype


def _fp8_step(value, scale, dtype):
    """The gap between neighbouring fp8 values at `value`, in x's units."""
    info = torch.finfo(dtype)
    q = np.maximum(np.abs(np.asarray(value, np.float64)) * scale, info.tiny)
    return 2.0 ** np.floor(np.log2(q)) * info.eps / scale


def _same_rounding(y, ref, scale, dtype):
    """True when y is ref up to float32 noise, except for at most 1% of the
    elements, which may sit one fp8 step away: a scale computed another way
    (x / (amax / fmax), say) can tip a value lying on a rounding boundary."""
    y = np.asarray(y, np.float64)
    if y.shape != ref.shape or not np.all(np.isfinite(y)):
        return False
    off = ~np.isclose(y, ref, rtol=1e-5, atol=1e-12)
    if not off.any():
        return True
    near = np.abs(y - ref) <= 1.001 * _fp8_step(ref, scale, dtype)
    return bool(np.all(near[off])) and off.sum() <= 1 + ref.size // 100


def _round_trip_mistake(case, y, ref, scale, dtype):
    """Name the mistake whose output `y` reproduces, if any."""
    x = torch.from_numpy(case["x"].copy())
    fmax = quant.fp8_max(dtype)
    candidates = {
        "you returned the scaled values: divide by the scale after casting back":
            ref * scale,
        "the values were cast without scaling: multiply by the scale "
        "(fmax / amax) before the cast and divide by it after":
            quant.fp8_round_trip(x, dtype, 1.0).numpy(),
        "the scale is inverted: it is fmax / amax, so that the largest |x| "
        "lands on fmax":
            quant.fp8_round_trip(x, dtype, 1.0 / scale).numpy(),
        "the unscaled result was rounded to fp8 a second time: fp8 is only "
        "for storage here, so cast back to float32 and do the arithmetic there":
            torch.from_numpy(ref).clamp(-fmax, fmax).to(dtype).float().numpy(),
    }
    for hint, wrong in candidates.items():
        if _same_rounding(y, wrong, scale, dtype) and not _same_rounding(ref, wrong, scale, dtype):
            return hint
    return None


def _judge_round_trip(case, output):
    y = np.asarray(output["y"])
    ref, scale, dtype = _reference_round_trip(case)
    if "float8" in str(output.get("dtype", "")):
        return ("your result is a float8 tensor; " + "cast it back with .float() and "
                "unscale in float32 (fp8 stores numbers here, it does not compute)")
    problem = mismatch(y, ref, dtype="float32")
    if problem is None or _same_rounding(y, ref, scale, dtype):
        return None
    if y.shape != ref.shape or not np.issubdtype(y.dtype, np.number):
        return problem
    y64 = y.astype(np.float64)
    if not np.all(np.isfinite(y64)):
        if not np.any(case["x"]):
            return (f"{problem}. An all-zero tensor has amax 0: use a scale of 1 "
                    "there instead of dividing by zero")
        return (f"{problem}. Values beyond the format's largest value became inf or "
                "NaN: clamp the scaled values to [-fmax, fmax] before the cast")
    hint = _round_trip_mistake(case, y64, ref, scale, dtype)
    if hint:
        return f"{problem}. Hint: {hint}"
    off = ~np.isclose(y64, ref, rtol=1e-5, atol=1e-12)
    return (f"{problem}. {int(off.sum())} of {ref.size} values differ from a "
            "scale, clamp, cast, cast back, unscale round trip")


# -- rmse_over_std -----------------------------------------------------------

def _rmse_cases(rng):
    x = rng.normal(size=100)
    rows = rng.normal(2.0, 1.5, size=(8, 32))
    offset = 1000 + rng.normal(size=64)
    return [
        ("x = [1, 2, 3, 4], x_rt = [1, 2, 3, 5]",
         {"x": _f32([1, 2, 3, 4]), "x_rt": _f32([1, 2, 3, 5])}),
        ("100 values with noise of 0.1",
         {"x": _f32(x), "x_rt": _f32(x + 0.1 * rng.normal(size=100))}),
        ("a 2-D tensor (8, 32): one number for the whole tensor",
         {"x": _f32(rows), "x_rt": _f32(rows + rng.uniform(-0.2, 0.2, size=rows.shape))}),
        ("a perfect round trip (x_rt = x)", {"x": _f32(x), "x_rt": _f32(x)}),
        ("values 1000 + N(0, 1), off by 0.05",
         {"x": _f32(offset), "x_rt": _f32(offset) + np.float32(0.05)}),
        ("x = [0, 0, 1, 1], x_rt = [0, 0.5, 1, 1]",
         {"x": _f32([0, 0, 1, 1]), "x_rt": _f32([0, 0.5, 1, 1])}),
    ]


def _judge_rmse(case, output):
    x = case["x"].astype(np.float64)
    x_rt = case["x_rt"].astype(np.float64)
    expected = quant.rmse_over_std(x, x_rt)
    value = np.asarray(output["value"])
    problem = mismatch(value, expected, dtype="float32", what="your value")
    if problem is None:
        return None
    err = x_rt - x
    rmse = np.sqrt(np.mean(err**2))
    n = x.size
    candidates = {
        "use the biased std (divide by n): torch.std needs correction=0, "
        "or take np.std's default":
            rmse / x.std(ddof=1) if n > 1 else np.nan,
        "divide by the std of the original x, not of the round trip x_rt":
            rmse / x_rt.std(),
        "take the square root of the mean squared error (RMSE), then divide":
            np.mean(err**2) / x.std(),
        "divide by the standard deviation, not the variance":
            rmse / x.var(),
        "use the root-mean-square error, not the mean absolute error":
            np.mean(np.abs(err)) / x.std(),
        "you returned the RMSE itself: divide it by the std of x":
            rmse,
    }
    if x.ndim > 1:
        candidates["one number for the whole tensor: average over every element, "
                   "not per row"] = np.mean(np.sqrt(np.mean(err**2, -1)) / x.std(-1))
    with np.errstate(all="ignore"):
        for hint, wrong in candidates.items():
            if matches(value, wrong, dtype="float32") and not matches(wrong, expected,
                                                                      dtype="float32"):
                return f"{problem}. Hint: {hint}"
    return problem


# -- norm_output_errors ------------------------------------------------------

def _norm_error_cases(rng):
    def tokens(mu, sigma, shape):
        return _f32(rng.normal(mu, sigma, size=shape))

    return [
        ("tokens N(0, 1), shape (64, 256), a rounding grid of step 0.125",
         {"x": tokens(0, 1, (64, 256)), "step": np.array(0.125)}),
        ("tokens N(5, 1), shape (64, 256), a rounding grid of step 0.125",
         {"x": tokens(5, 1, (64, 256)), "step": np.array(0.125)}),
        ("tokens N(20, 1), shape (32, 512), a rounding grid of step 1/32",
         {"x": tokens(20, 1, (32, 512)), "step": np.array(1 / 32)}),
        ("a 3-D batch (4, 16, 128) of N(3, 2^2) tokens, a grid of step 0.25",
         {"x": tokens(3, 2, (4, 16, 128)), "step": np.array(0.25)}),
        ("tokens N(1, 1), shape (16, 64), no rounding at all (both errors 0)",
         {"x": tokens(1, 1, (16, 64)), "step": np.array(0.0)}),
    ]


def _norm_errors_close(got, expected):
    return all(np.isclose(g, e, rtol=ERROR_RTOL, atol=1e-7) for g, e in zip(got, expected))


def _judge_norm_errors(case, output):
    x = torch.from_numpy(case["x"].copy())
    round_trip = grid_quantizer(float(case["step"]))
    expected = quant.norm_output_errors(x, round_trip)
    got = (float(output["ln"]), float(output["rms"]))
    if _norm_errors_close(got, expected):
        return None
    problem = (f"you returned (ln_error, rms_error) = ({got[0]:.5g}, {got[1]:.5g}); "
               f"expected ({expected[0]:.5g}, {expected[1]:.5g})")
    ln_out, rms_out = quant.layer_norm_output(x), quant.rms_norm_output(x)

    def over_std_of_x(out):
        rmse = (round_trip(out).double() - out.double()).pow(2).mean().sqrt()
        return float(rmse / x.double().std(correction=0))

    candidates = {
        "the pair is the wrong way round: return (layer-norm error, RMSNorm error)":
            expected[::-1],
        "divide by the std of the norm's output (the tensor you quantized), "
        "not of the input tokens":
            (over_std_of_x(ln_out), over_std_of_x(rms_out)),
        "quantize the norms' outputs, not the input tokens":
            (quant.rmse_over_std(x, round_trip(x)),) * 2,
        "layer norm subtracts each token's mean before dividing; RMSNorm does not":
            (expected[1],) * 2,
    }
    for hint, wrong in candidates.items():
        if _norm_errors_close(got, wrong) and not _norm_errors_close(wrong, expected):
            return f"{problem}. Hint: {hint}"
    return problem


# -- the measured table ------------------------------------------------------

TABLE_SHAPE = (256, 1024)  # the tokens of the exercise: (n_tokens, d)


def _table_cases(rng):
    """Fresh tokens N(mu, 1) for every mu, which the student's own functions
    measure again: the table's figures are only trusted once the code that
    made them is seen to measure them."""
    tokens = np.stack([_f32(mu + rng.normal(size=TABLE_SHAPE)) for mu in TABLE_MUS])
    return [(f"your table, and your norm_output_errors with your fp8_round_trip (e4m3) on "
             f"new tokens N(mu, 1) of shape {TABLE_SHAPE} for mu = "
             f"{', '.join(f'{mu:g}' for mu in TABLE_MUS)}", {"tokens": tokens})]


@functools.cache
def _table_reference(dtype_name="float8_e4m3fn"):
    """{mu: (layer-norm error, RMSNorm error)} measured on tokens N(mu, 1)."""
    dtype = getattr(torch, dtype_name)
    table = {}
    for mu in TABLE_MUS:
        errors = quant.norm_errors_for_offset(mu, dtype)
        table[mu] = (errors["layer_norm"], errors["rms_norm"])
    return table


def _measured_reference(tokens, dtype=torch.float8_e4m3fn):
    """(mus, 2): the reference's (ln_error, rms_error) on the same tokens."""
    def round_trip(t):
        return quant.fp8_round_trip(t, dtype)

    return np.array([quant.norm_output_errors(torch.from_numpy(batch.copy()), round_trip)
                     for batch in tokens], dtype=np.float64)


def _within(got, expected):
    return np.allclose(got, expected, rtol=TABLE_RTOL, atol=0)


def _judge_table_figures(ln, rms):
    """The student's table against the reference figures (seed 0), or None."""
    reference = _table_reference()
    ln_ref = np.array([reference[mu][0] for mu in TABLE_MUS])
    rms_ref = np.array([reference[mu][1] for mu in TABLE_MUS])
    if _within(ln, ln_ref) and _within(rms, rms_ref):
        return None
    problem = (f"your layer-norm column is {_listed(ln)} and your RMSNorm column "
               f"{_listed(rms)}; measured on tokens N(mu, 1) in e4m3 they are about "
               f"{_listed(ln_ref)} and {_listed(rms_ref)} (within {TABLE_RTOL:.0%})")
    e5m2 = _table_reference("float8_e5m2")
    if _within(ln, rms_ref) and _within(rms, ln_ref):
        return f"{problem}. Hint: the two columns are swapped"
    if _within(ln, [e5m2[mu][0] for mu in TABLE_MUS]):
        return f"{problem}. Hint: these look like float8_e5m2 figures; use float8_e4m3fn"
    if not np.all(np.diff(rms) > 0):
        return (f"{problem}. Hint: RMSNorm keeps each token's offset, so its error "
                "should grow with mu")
    return problem


def _judge_table(case, output):
    mus = tuple(float(mu) for mu in np.atleast_1d(output["mus"]))
    if mus != TABLE_MUS:
        return f"the table's keys are {list(mus)}; it needs exactly mu = 0, 1, 5 and 20"
    ln, rms = np.asarray(output["ln"], np.float64), np.asarray(output["rms"], np.float64)
    problem = _judge_table_figures(ln, rms)
    if problem:
        return problem
    measured = np.asarray(output["measured"], np.float64)
    expected = _measured_reference(case["tokens"])
    if measured.shape != expected.shape:
        return (f"the new measurement gave an array of shape {measured.shape}; expected "
                f"{expected.shape} (one (ln_error, rms_error) pair per mu)")
    if not (np.all(np.isfinite(measured)) and _within(measured, expected)):
        problem = (f"on new tokens N(mu, 1), your norm_output_errors with your fp8_round_trip "
                   f"(e4m3) measures layer norm {_listed(measured[:, 0])} and RMSNorm "
                   f"{_listed(measured[:, 1])}; the same measurement with the reference "
                   f"gives {_listed(expected[:, 0])} and {_listed(expected[:, 1])} (within "
                   f"{TABLE_RTOL:.0%}). The table's figures count only when your own code "
                   "measures them")
        if _within(measured[:, ::-1], expected):
            return f"{problem}. Hint: return the pair as (layer-norm error, RMSNorm error)"
        return (f"{problem}. Hint: make norm_output_errors and fp8_round_trip pass their own "
                "checks first")
    if not (_within(ln, measured[:, 0]) and _within(rms, measured[:, 1])):
        return (f"your table says {_listed(ln)} and {_listed(rms)}, but your own "
                f"norm_output_errors measures {_listed(measured[:, 0])} and "
                f"{_listed(measured[:, 1])} on tokens N(mu, 1): fill the table from your "
                "measurement, do not type the figures in")
    return None


CHECKS = {
    "quant_fp8_max": Check(_fp8_max_cases, _judge_fp8_max),
    "quant_round_trip_e4m3": Check(_round_trip_cases("float8_e4m3fn", 1e4), _judge_round_trip),
    "quant_round_trip_e5m2": Check(_round_trip_cases("float8_e5m2", 1e6), _judge_round_trip),
    "quant_round_trip_clamp": Check(_clamp_cases, _judge_round_trip),
    "quant_rmse_over_std": Check(_rmse_cases, _judge_rmse),
    "quant_norm_output_errors": Check(_norm_error_cases, _judge_norm_errors),
    "quant_offset_table": Check(_table_cases, _judge_table),
}
