"""Unit 06 checks, the student-facing half: how each exercise is called.

torch is imported inside the probes, not at the top, so that importing
normref.checks stays quick for the units that do not use it.
"""

import numpy as np

from normref.checks._runner import run_check

FLOAT8_HINT = ("arithmetic on float8 tensors is not implemented on the CPU; "
               "cast back with .float() first, then unscale in float32")


def _torch_dtype(name):
    import torch

    return getattr(torch, str(name))


def _dtype_name(value):
    return np.array(str(getattr(value, "dtype", type(value).__name__)))


def _tensor(array):
    import torch

    return torch.from_numpy(np.array(array, copy=True))


def _call_fp8_max(fp8_max, case):
    return {"fmax": np.array(float(fp8_max(_torch_dtype(case["dtype"]))))}


def _call_round_trip(fp8_round_trip, case):
    x, dtype = _tensor(case["x"]), _torch_dtype(case["dtype"])
    try:
        if "scale" in case:
            y = fp8_round_trip(x, dtype, scale=float(case["scale"]))
        else:
            y = fp8_round_trip(x, dtype)
    except (NotImplementedError, RuntimeError) as exc:
        if "Float8" in str(exc):
            raise type(exc)(f"{exc} (hint: {FLOAT8_HINT})") from None
        raise
    return {"y": y, "dtype": _dtype_name(y)}


def _call_rmse_over_std(rmse_over_std, case):
    value = rmse_over_std(_tensor(case["x"]), _tensor(case["x_rt"]))
    return {"value": np.array(float(value))}


def grid_quantizer(step):
    """A stand-in quantizer for the checks: round to multiples of `step`
    (step 0 leaves the tensor as it is). Returns a function of a tensor."""
    import torch

    def round_trip(t):
        t = t.float()
        return t.clone() if step == 0 else torch.round(t / step) * step

    return round_trip


def _call_norm_output_errors(norm_output_errors, case):
    x = _tensor(case["x"])
    ln_error, rms_error = norm_output_errors(x, grid_quantizer(float(case["step"])))
    return {"ln": np.array(float(ln_error)), "rms": np.array(float(rms_error))}


def _table_as_arrays(table):
    if not hasattr(table, "items"):
        raise TypeError(f"the table is {type(table).__name__}, not a dict "
                        "{mu: (ln_error, rms_error)}")
    mus = sorted(table)
    rows = [tuple(float(v) for v in table[mu]) for mu in mus]
    if any(len(row) != 2 for row in rows):
        raise ValueError("each value of the table must be a pair (ln_error, rms_error)")
    return {"mus": np.array(mus, dtype=np.float64),
            "ln": np.array([row[0] for row in rows]),
            "rms": np.array([row[1] for row in rows])}


def _probe_offset_table(subject, case):
    """The student's table as it stands, and the same measurement redone by the
    student's norm_output_errors and fp8_round_trip (e4m3, amax scaling) on
    tokens the grader drew, one batch per mu: the grader recomputes those."""
    import torch

    table, norm_output_errors, fp8_round_trip = subject
    report = _table_as_arrays(table)
    e4m3 = torch.float8_e4m3fn

    def round_trip(t):
        return fp8_round_trip(t, e4m3)

    measured = []
    for tokens in case["tokens"]:  # one (n_tokens, d) batch per mu
        try:
            ln_error, rms_error = norm_output_errors(_tensor(tokens), round_trip)
        except (NotImplementedError, RuntimeError) as exc:
            if "Float8" in str(exc):
                raise type(exc)(f"{exc} (hint: {FLOAT8_HINT})") from None
            raise
        measured.append((float(ln_error), float(rms_error)))
    report["measured"] = np.array(measured, dtype=np.float64)  # mus, 2
    return report


def check_fp8_max(fp8_max):
    """Check fp8_max(dtype) -> the largest finite value of each fp8 format."""
    run_check("quant_fp8_max", fp8_max, _call_fp8_max)


def check_fp8_round_trip_e4m3(fp8_round_trip):
    """Check fp8_round_trip(x, torch.float8_e4m3fn) with amax scaling."""
    run_check("quant_round_trip_e4m3", fp8_round_trip, _call_round_trip)


def check_fp8_round_trip_e5m2(fp8_round_trip):
    """Check fp8_round_trip(x, torch.float8_e5m2) with amax scaling."""
    run_check("quant_round_trip_e5m2", fp8_round_trip, _call_round_trip)


def check_fp8_round_trip_clamps(fp8_round_trip):
    """Check fp8_round_trip(x, dtype, scale=s) with a given scale, where
    some scaled values lie beyond the format's largest value."""
    run_check("quant_round_trip_clamp", fp8_round_trip, _call_round_trip)


def check_rmse_over_std(rmse_over_std):
    """Check rmse_over_std(x, x_rt) -> RMSE of x_rt against x over std(x)."""
    run_check("quant_rmse_over_std", rmse_over_std, _call_rmse_over_std)


def check_norm_output_errors(norm_output_errors):
    """Check norm_output_errors(x, round_trip) -> (ln_error, rms_error),
    called with simple rounding quantizers."""
    run_check("quant_norm_output_errors", norm_output_errors, _call_norm_output_errors)


def check_offset_table(table, norm_output_errors, fp8_round_trip):
    """Check the measured table {mu: (ln_error, rms_error)} for e4m3, and that
    your norm_output_errors and fp8_round_trip measure the same thing on
    tokens N(mu, 1) that the grader draws."""
    run_check("quant_offset_table", (table, norm_output_errors, fp8_round_trip),
              _probe_offset_table)
