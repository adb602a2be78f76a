"""Unit 06 checks, the grader-facing half: inputs, references, diagnoses."""

import functools

import numpy as np
import torch

from normref import quant
from normref.checks._registry import Check
from normref.checks.quant_probes import (
    MATMUL_SCHEMES,
    as_choice,
    experiment_token_sets,
    loud_token_layer,
)
from normref.checks.tolerances import mismatch, number_from_answer

SMALL_EXAMPLE = np.array([[0.5, -1.0, 3.0, 7.0], [0.01, 0.02, -0.04, 0.0]], np.float32)
TABLE_RTOL = 1e-3  # the table against the student's own measurement: same numbers
ANSWER_RTOL = 0.01  # a measured answer (a ratio, a scaled value) against the truth


def _f32(array):
    return np.asarray(array, dtype=np.float32)


def _listed(values):
    return "[" + ", ".join(f"{v:.3g}" for v in np.ravel(values)) + "]"


def _fp8_step(value, scale, dtype):
    """The gap between neighbouring fp8 values at `value`, in x's units;
    `scale` broadcasts against `value` (one scale per token, say)."""
    info = torch.finfo(dtype)
    q = np.maximum(np.abs(np.asarray(value, np.float64)) * scale, info.tiny)
    return 2.0 ** np.floor(np.log2(q)) * info.eps / scale


def _same_rounding(y, ref, scale, dtype, atol=1e-12):
    """True when y is ref up to float32 noise, except for at most 1% of the
    elements, which may sit one fp8 step away: a scale computed another way
    (x / (amax / fmax), say) can tip a value lying on a rounding boundary.
    atol (a number, or an array that broadcasts against y) widens the noise
    allowed where a float32 zero-point was added back."""
    y = np.asarray(y, np.float64)
    if y.shape != ref.shape or not np.all(np.isfinite(y)):
        return False
    off = ~np.isclose(y, ref, rtol=1e-5, atol=atol)
    if not off.any():
        return True
    near = np.abs(y - ref) <= 1.001 * _fp8_step(ref, scale, dtype)
    return bool(np.all(near[off])) and off.sum() <= 1 + ref.size // 100


def _first_difference(y, ref):
    """Where y first differs from ref (flattened): its index and a few values
    from there on, as got and as expected."""
    y, ref = np.ravel(y), np.ravel(ref)
    off = np.flatnonzero(~np.isclose(y, ref, rtol=1e-5, atol=1e-12))
    start = int(off[0]) if off.size else 0
    return (f"from element {start} on, the round trip is {_listed(y[start:start + 4])}...; "
            f"expected {_listed(ref[start:start + 4])}...")


def _row_scales(x, dtype):
    amax = np.abs(x.astype(np.float64)).max(axis=-1, keepdims=True)
    return np.where(amax > 0, quant.fp8_max(dtype) / np.where(amax > 0, amax, 1), 1.0)


# -- per-token round trip ----------------------------------------------------

def _per_token_cases(rng):
    e4m3, e5m2 = np.array("float8_e4m3fn"), np.array("float8_e5m2")
    sizes = 10.0 ** rng.uniform(-3, 3, size=(32, 1))
    with_zero_row = rng.normal(size=(6, 16))
    with_zero_row[2] = 0.0
    loud = rng.normal(size=(16, 64))
    loud[3] *= 1e4
    return [
        ("x = [[0.5, -1, 3, 7], [0.01, 0.02, -0.04, 0]], e4m3",
         {"x": SMALL_EXAMPLE, "dtype": e4m3}),
        ("N(0, 1) tokens, shape (32, 64), e4m3", {"x": _f32(rng.normal(size=(32, 64))),
                                                  "dtype": e4m3}),
        ("tokens whose sizes range from 0.001 to 1000, shape (32, 64), e4m3",
         {"x": _f32(sizes * rng.normal(size=(32, 64))), "dtype": e4m3}),
        ("token 3 is 10^4 times louder, shape (16, 64), e4m3", {"x": _f32(loud),
                                                                "dtype": e4m3}),
        ("token 2 is all zeros, shape (6, 16), e4m3", {"x": _f32(with_zero_row),
                                                       "dtype": e4m3}),
        ("a 3-D batch (2, 3, 16) of tokens of different sizes, e5m2",
         {"x": _f32(rng.normal(size=(2, 3, 16)) * 10.0 ** rng.uniform(-2, 2, (2, 3, 1))),
          "dtype": e5m2}),
        ("one token, shape (64,), e5m2", {"x": _f32(rng.normal(2.0, 1.0, size=64)),
                                          "dtype": e5m2}),
        # a range of 10^8 within each token: scaled onto 448 instead of e5m2's own
        # fmax, its small entries fall into e5m2's subnormals or to zero
        ("tokens whose entries range from 0.01 to 10^6 within each token, shape "
         "(8, 32), e5m2",
         {"x": _f32(np.where(rng.normal(size=(8, 32)) < 0, -1.0, 1.0)
                    * 10.0 ** rng.uniform(-2, 6, size=(8, 32))), "dtype": e5m2}),
    ]


def _per_token_mistake(x, dtype, y, ref, scale):
    xt = torch.from_numpy(x.copy())
    fmax = quant.fp8_max(dtype)
    columns = np.abs(x.astype(np.float64)).max(axis=-2, keepdims=True) if x.ndim > 1 else None
    candidates = {
        "this is one scale for the whole tensor; each token (row, the last axis) "
        "needs its own amax and scale":
            quant.fp8_round_trip(xt, dtype).numpy(),
        "you returned the scaled values: divide by each token's scale after "
        "casting back": ref * scale,
        "each token is scaled onto 448, e4m3's largest value; scale onto the "
        "largest value of the format asked for, torch.finfo(dtype).max":
            quant.fp8_round_trip(xt, dtype, torch.from_numpy(
                _row_scales(x, torch.float8_e4m3fn).astype(np.float32))).numpy(),
    }
    if columns is not None:
        column_scale = np.where(columns > 0, fmax / np.where(columns > 0, columns, 1), 1.0)
        candidates["the amax was taken over tokens (a scale per feature); take it over "
                   "the last axis, within each token"] = quant.fp8_round_trip(
            xt, dtype, torch.from_numpy(column_scale.astype(np.float32))).numpy()
    for hint, wrong in candidates.items():
        if _same_rounding(y, wrong, scale, dtype) and not _same_rounding(ref, wrong, scale,
                                                                          dtype):
            return hint
    return None


def _judge_per_token(case, output):
    if "float8" in str(output.get("dtype", "")):
        return ("your result is a float8 tensor; cast it back with .float() and unscale "
                "in float32 (fp8 stores numbers here, it does not compute)")
    x, dtype = case["x"], getattr(torch, str(case["dtype"]))
    ref = quant.per_token_round_trip(torch.from_numpy(x.copy()), dtype).numpy()
    scale = _row_scales(x, dtype)
    y = np.asarray(output["y"])
    problem = mismatch(y, ref, dtype="float32")
    if problem is None:
        return None
    if y.shape != ref.shape or not np.issubdtype(y.dtype, np.number):
        return problem
    if _same_rounding(y, ref, scale, dtype):
        return None
    y64 = y.astype(np.float64)
    if not np.all(np.isfinite(y64)):
        if not np.all(np.any(x != 0, axis=-1)):
            return (f"{problem}. A token of zeros has amax 0: give it a scale of 1 "
                    "instead of dividing by zero")
        return f"{problem}. Clamp the scaled values to [-fmax, fmax] before the cast"
    hint = _per_token_mistake(x, dtype, y64, ref, scale)
    return f"{problem}. Hint: {hint}" if hint else problem


# -- delayed scaling ---------------------------------------------------------

def _stream(rng, n_steps, shape, sizes):
    return _f32(np.stack([size * rng.normal(size=shape) for size in sizes[:n_steps]]))


def _delayed_cases(rng):
    e4m3, e5m2 = np.array("float8_e4m3fn"), np.array("float8_e5m2")
    growing = _stream(rng, 10, (8, 16), [0.5, 1, 2, 4, 8, 4, 2, 1, 0.5, 0.25])
    spike = _stream(rng, 24, (4, 32), [1.0] * 3 + [50.0] + [1.0] * 20)
    # shrinking by 4 each call: nothing passes fmax, so this case needs no clamp
    shrinking = _stream(rng, 6, (4, 8), 64.0 * 0.25 ** np.arange(6))
    zeros_first = _stream(rng, 6, (4, 8), [0.0, 0.0, 3.0, 1.0, 1.0, 2.0])
    return [
        ("e4m3, history_len = 4, ten tensors whose size grows, then shrinks",
         {"stream": growing, "dtype": e4m3, "history_len": np.array(4)}),
        ("e4m3, history_len = 16, a spike of 50 at call 4 of 24",
         {"stream": spike, "dtype": e4m3, "history_len": np.array(16)}),
        ("e4m3, history_len = 1 (only the previous tensor counts)",
         {"stream": growing, "dtype": e4m3, "history_len": np.array(1)}),
        ("e5m2, history_len = 3, sizes shrinking from 64 to 1/16",
         {"stream": shrinking, "dtype": e5m2, "history_len": np.array(3)}),
        ("e4m3, history_len = 2, the first two tensors all zeros",
         {"stream": zeros_first, "dtype": e4m3, "history_len": np.array(2)}),
    ]


def _saturation_cases(rng):
    e4m3, e5m2 = np.array("float8_e4m3fn"), np.array("float8_e5m2")
    return [
        ("e5m2, history_len = 4, a spike 1000 times larger at call 6 of 8",
         {"stream": _stream(rng, 8, (8, 16), [1.0] * 5 + [1000.0] + [1.0] * 2),
          "dtype": e5m2, "history_len": np.array(4)}),
        ("e5m2, history_len = 2, the first tensor reaches 10^5 (scale 1, fmax 57344)",
         {"stream": _f32(np.stack([[1.0, 1e5, -1e5, 7e4], [1.0, 2.0, -3.0, 4.0],
                                   [1e5, -2.0, 5.0, 0.5]])),
          "dtype": e5m2, "history_len": np.array(2)}),
        ("e4m3, history_len = 3, a spike 100 times larger at call 4 of 6",
         {"stream": _stream(rng, 6, (8, 16), [1.0] * 3 + [100.0] + [1.0] * 2),
          "dtype": e4m3, "history_len": np.array(3)}),
    ]


def _reference_delayed(case):
    """(outputs, scale used at each call, scale after each call, history
    lengths, final history) of the reference on the case's stream."""
    dtype = getattr(torch, str(case["dtype"]))
    scaler = quant.DelayedScaler(dtype, int(case["history_len"]))
    outputs, used, after, lengths = [], [], [], []
    for x in case["stream"]:
        used.append(scaler.scale)
        outputs.append(scaler(torch.from_numpy(x.copy())).numpy())
        after.append(scaler.scale)
        lengths.append(len(scaler.history))
    return (np.stack(outputs), np.array(used), np.array(after), np.array(lengths),
            np.array(scaler.history))


def _judge_delayed(case, output):
    if "float8" in str(output.get("dtype", "")):
        return ("your scaler returns a float8 tensor; cast it back with .float() and "
                "unscale in float32")
    dtype = getattr(torch, str(case["dtype"]))
    fmax = quant.fp8_max(dtype)
    history_len = int(case["history_len"])
    outputs, used, after, lengths, history = _reference_delayed(case)
    got_lengths = np.asarray(output["lengths"])
    if not np.array_equal(got_lengths, lengths):
        hint = ""
        if got_lengths.max(initial=0) == history_len + 1:
            hint = (f". Hint: the history holds {history_len + 1} amaxes, one too many: "
                    f"keep the last history_len = {history_len}")
        elif got_lengths.max(initial=0) == history_len - 1:
            hint = (f". Hint: the history holds {history_len - 1} amaxes, one too few: "
                    f"keep the last history_len = {history_len}")
        return (f"after each call your history has {_listed(got_lengths)} entries; "
                f"expected {_listed(lengths)}{hint}")
    got_history = np.asarray(output["history"], np.float64)
    if got_history.shape != history.shape or not np.allclose(got_history, history,
                                                             rtol=1e-6):
        return (f"after the last call your history is {_listed(got_history)}; expected "
                f"the amaxes of the last {history_len} tensors, oldest first: "
                f"{_listed(history)}")
    got_after = np.asarray(output["scales"], np.float64)
    if not np.allclose(got_after, after, rtol=1e-5):
        problem = (f"your scale after each call is {_listed(got_after)}; expected "
                   f"{_listed(after)}")
        means = [np.mean(case_history) for case_history in _histories(case)]
        with np.errstate(all="ignore"):
            if np.allclose(got_after, [fmax / m if m > 0 else 1.0 for m in means], rtol=1e-5):
                return f"{problem}. Hint: use the largest amax in the history, not the mean"
        return problem
    y = np.asarray(output["y"], np.float64)
    stream = case["stream"].astype(np.float64)
    if y.shape != outputs.shape:
        return f"your outputs have shape {y.shape}; expected {outputs.shape}"
    for step, (y_t, ref_t, scale) in enumerate(zip(y, outputs, used)):
        if _same_rounding(y_t, ref_t, scale, dtype):
            continue
        problem = (f"call {step + 1}: {_first_difference(y_t, ref_t)}, with the scale "
                   f"{scale:.4g} chosen before this tensor was seen")
        if not np.all(np.isfinite(y_t)):
            return (f"{problem}. Hint: values beyond the remembered amax overflow; "
                    "clamp the scaled values to [-fmax, fmax] before the cast, so they "
                    "saturate")
        own = quant.fp8_round_trip(torch.from_numpy(case["stream"][step].copy()),
                                   dtype).numpy()
        if _same_rounding(y_t, own, _row_scales(stream[step].reshape(1, -1), dtype)[0, 0],
                          dtype):
            return (f"{problem}. Hint: this is scaled by the tensor's own amax; delayed "
                    "scaling uses the scale from the history of earlier calls, then "
                    "records this tensor's amax")
        return problem
    return None


def _histories(case):
    """The history after each call, as lists of amaxes."""
    amaxes = [float(np.abs(x).max()) for x in case["stream"]]
    n = int(case["history_len"])
    return [amaxes[max(0, i + 1 - n):i + 1] for i in range(len(amaxes))]


# -- the table and the answers about it ------------------------------------

@functools.cache
def _reference_table():
    """(rows, 2): (per-tensor error, per-token error) for each batch, e4m3."""
    return np.array([quant.scaling_errors(x, keep)
                     for x, keep in experiment_token_sets().values()], np.float64)


def _judge_table(case, output):
    table = np.asarray(output["table"], np.float64)
    measured = np.asarray(output["measured"], np.float64)
    reference = _reference_table()
    if not np.allclose(measured[:, 0], reference[:, 0], rtol=1e-6):
        return "the lesson's per-tensor round trip gave other figures here"
    if not np.allclose(table, measured, rtol=TABLE_RTOL):
        if np.allclose(table[:, ::-1], measured, rtol=TABLE_RTOL):
            return "each row is the wrong way round: (per-tensor error, per-token error)"
        return (f"your table says {_listed(table[:, 0])} (per-tensor) and "
                f"{_listed(table[:, 1])} (per-token), but your functions measure "
                f"{_listed(measured[:, 0])} and {_listed(measured[:, 1])} on those "
                "batches (error over the kept entries only): fill the table from your "
                "measurement, do not type the figures in")
    return None


def _judge_spike(case, output):
    answer = str(output.get("steps", "None")).strip()
    steps = number_from_answer(answer)
    if steps is None:
        return f"give the number of calls as a number (you gave {answer!r})"
    if steps != quant.steps_scaled_by_spike(16):
        return (f"not yet right: you answered {answer}. Count the calls after the spike "
                "whose scale still comes from it, with history_len = 16")
    return None


def _close(value, truth):
    return value is not None and abs(value - truth) <= ANSWER_RTOL * abs(truth)


def _read_number(output, key, name):
    """(the answer as a float or None, a complaint or None)."""
    answer = str(output.get(key, "None")).strip()
    value = number_from_answer(answer)
    if value is None:
        return None, f"give {name} as a number (you gave {answer!r})"
    return value, None


@functools.cache
def _true_scaling_answers():
    """The two scales, worked out in float64 from the experiment's batches."""
    sets = experiment_token_sets()
    rms_out = sets["RMSNorm, mu = 20"][0]
    loud_channel, quiet = sets["loud channel"]
    return {"rms_scale_spread": quant.token_scale_spread(rms_out),
            "quiet_stored_max": quant.largest_stored_kept(loud_channel, quiet),
            "quiet_unscaled_max": float(loud_channel[quiet].abs().max())}


def _judge_scaling_answers(case, output):
    truths = _true_scaling_answers()
    spread, bad_spread = _read_number(output, "rms_scale_spread", "ANSWER_RMS_SCALE_SPREAD")
    stored, bad_stored = _read_number(output, "quiet_stored_max", "ANSWER_QUIET_STORED_MAX")
    problems = [p for p in (bad_spread, bad_stored) if p]
    if spread is not None and not _close(spread, truths["rms_scale_spread"]):
        if _close(spread, 1 / truths["rms_scale_spread"]):
            problems.append("ANSWER_RMS_SCALE_SPREAD is the smallest scale over the "
                            "largest; the question asks for the largest over the smallest")
        else:
            problems.append(f"ANSWER_RMS_SCALE_SPREAD is not yet right (you answered "
                            f"{spread:.4g}): each token's scale is fmax / max|x| over its "
                            "own features; divide the largest of the 64 by the smallest")
    if stored is not None and not _close(stored, truths["quiet_stored_max"]):
        if _close(stored, truths["quiet_unscaled_max"]):
            hint = ("that is the largest quiet value before scaling; multiply each value "
                    "by its own token's scale first")
        elif _close(stored, quant.fp8_max(torch.float8_e4m3fn)):
            hint = ("that is the loud feature itself, which lands on fmax; take only "
                    "the measured entries (keep)")
        else:
            hint = ("scale each token by fmax / max|x| over its own features, then take "
                    "the largest |value| among the measured entries (keep)")
        problems.append(f"ANSWER_QUIET_STORED_MAX is not yet right (you answered "
                        f"{stored:.4g}): {hint}")
    return "; ".join(problems) or None


# -- per-channel and MX block scaling ----------------------------------------



def _dtype_of(case):
    return getattr(torch, str(case["dtype"]))


def _stored_as(output, dtype):
    """None when q was stored in `dtype`; otherwise a sentence."""
    stored = str(output.get("q_dtype", ""))
    if stored.replace("torch.", "") == str(dtype).replace("torch.", ""):
        return None
    return (f"q is stored as {stored}; store it in the fp8 format asked for, "
            f"{str(dtype).replace('torch.', '')} (.to(dtype)): dequantize casts "
            "it back")


def _per_channel_cases(rng):
    e4m3, e5m2 = np.array("float8_e4m3fn"), np.array("float8_e5m2")
    zero_channel = rng.normal(size=(12, 20))
    zero_channel[:, 7] = 0.0
    loud = rng.normal(size=(48, 16))
    loud[:, 3] += 1e4
    sizes = 10.0 ** rng.uniform(-3, 3, size=(1, 24))
    square = rng.normal(size=(16, 16)) * 10.0 ** rng.uniform(-2, 2, size=(1, 16))
    return [
        ("x = [[0.5, -1, 0.03], [7, 0.02, -0.04]] (2 tokens, 3 channels), e4m3",
         {"x": _f32([[0.5, -1.0, 0.03], [7.0, 0.02, -0.04]]), "dtype": e4m3}),
        ("N(0, 1), 64 tokens x 32 channels, e4m3",
         {"x": _f32(rng.normal(size=(64, 32))), "dtype": e4m3}),
        ("channels whose sizes range from 0.001 to 1000, (40, 24), e4m3",
         {"x": _f32(sizes * rng.normal(size=(40, 24))), "dtype": e4m3}),
        ("channel 3 sits near 10^4 in every token, (48, 16), e4m3",
         {"x": _f32(loud), "dtype": e4m3}),
        ("channel 7 is all zeros, (12, 20), e4m3", {"x": _f32(zero_channel), "dtype": e4m3}),
        ("16 tokens x 16 channels of different sizes, e5m2", {"x": _f32(square), "dtype": e5m2}),
    ]


def _reference_per_channel(x, dtype):
    """(q as float64, scales, dequantized), from float64 inputs."""
    q, scale = quant.per_channel_quantize(torch.from_numpy(x.astype(np.float64)), dtype)
    q64, scale64 = q.double().numpy(), scale.double().numpy()
    return q64, scale64, q64 / scale64


def _judge_per_channel(case, output):
    x, dtype = case["x"], _dtype_of(case)
    problem = _stored_as(output, dtype)
    if problem:
        return problem
    ref_q, ref_scale, ref_y = _reference_per_channel(x, dtype)
    scales = np.asarray(output["scales"], np.float64)
    n_tokens, n_channels = x.shape
    row_scales = _row_scales(x, dtype).ravel()
    if scales.size != n_channels:
        if scales.size == n_tokens:
            return (f"your scales hold {scales.size} numbers, one per token (row); "
                    f"expected one per channel (column), {n_channels}. Take the amax "
                    "over the tokens, dim=0")
        return f"your scales have shape {scales.shape}; expected ({n_channels},)"
    scales = scales.ravel()
    if not np.allclose(scales, ref_scale, rtol=1e-5):
        shown = (f"your scales are {_listed(scales[:6])}...; expected fmax / (each "
                 f"channel's amax), {_listed(ref_scale[:6])}...")
        if not np.all(np.isfinite(scales)):
            return (f"{shown}. Hint: an all-zero channel has amax 0: give it a scale "
                    "of 1 instead of dividing by zero")
        if n_tokens == n_channels and np.allclose(scales, row_scales, rtol=1e-5):
            return (f"{shown}. Hint: these are the scales of the rows (tokens); "
                    "per-channel scaling takes the amax down each column")
        with np.errstate(divide="ignore"):
            if np.allclose(scales, 1.0 / ref_scale, rtol=1e-5):
                return (f"{shown}. Hint: these are amax / fmax, the reciprocal; q = x * "
                        "scale must put each channel's amax on fmax")
        return shown
    q = np.asarray(output["q"], np.float64)
    if not _same_rounding(q, ref_q, 1.0, dtype):
        if q.shape == ref_q.shape and np.allclose(q, ref_y, rtol=1e-5):
            return ("q holds the values after the round trip; q is what is stored: "
                    "cast(clamp(x * scale)), in fp8 units")
        return f"q, cast back to float: {_listed(q.ravel()[:6])}...; expected " \
               f"{_listed(ref_q.ravel()[:6])}..."
    y = np.asarray(output["y"], np.float64)
    if _same_rounding(y, ref_y, ref_scale, dtype):
        return None
    problem = (f"per_channel_dequantize(q, scale) gives {_listed(y.ravel()[:6])}...; "
               f"expected {_listed(ref_y.ravel()[:6])}...")
    if y.shape == ref_y.shape and np.allclose(y, ref_q * ref_scale, rtol=1e-5):
        return f"{problem}. Hint: divide by each channel's scale, do not multiply"
    if y.shape == ref_y.shape and np.allclose(y, ref_q, rtol=1e-5):
        return f"{problem}. Hint: those are q's values; divide them by the scales"
    return problem


def _mx_cases(rng):
    e4m3, e5m2 = np.array("float8_e4m3fn"), np.array("float8_e5m2")
    block_sizes = np.repeat(10.0 ** rng.uniform(-3, 3, size=(4, 3)), 32, axis=1)
    saturating = rng.uniform(-1.0, 1.0, size=(3, 64))
    saturating[:, 5] = 1.95  # block 0: amax / X = 1.95 * 2**emax, past fmax
    saturating[:, 40] = -1.9  # block 1 as well, negative
    zero_block = rng.normal(size=(4, 64))
    zero_block[1, 32:] = 0.0
    outlier = rng.normal(size=(48, 64))
    outlier[:, 5] *= 1e4
    below_powers = rng.uniform(-0.5, 0.5, size=(4, 64))
    for row, k in enumerate((3, -2, 0, 7)):
        below_powers[row] *= 2.0**k
        # the float32 just below 2**k: float32's log2 rounds it up to k
        below_powers[row, [9, 40]] = np.nextafter(np.float32(2.0**k), np.float32(0))
    return [
        ("N(0, 1), 8 tokens x 64 features (two blocks a row), e4m3",
         {"x": _f32(rng.normal(size=(8, 64))), "dtype": e4m3}),
        ("40 features a row: the last block holds 8, (6, 40), e4m3",
         {"x": _f32(rng.normal(size=(6, 40))), "dtype": e4m3}),
        ("blocks whose sizes range from 0.001 to 1000, (4, 96), e4m3",
         {"x": _f32(block_sizes * rng.normal(size=(4, 96))), "dtype": e4m3}),
        ("blocks whose amax is 1.9 or 1.95 times a power of two, (3, 64), e5m2: "
         "x / X passes fmax and must saturate",
         {"x": _f32(saturating), "dtype": e5m2}),
        ("the same blocks in e4m3, (3, 64)", {"x": _f32(saturating), "dtype": e4m3}),
        ("the second block of token 1 is all zeros, (4, 64), e4m3",
         {"x": _f32(zero_block), "dtype": e4m3}),
        ("feature 5 is 10^4 times louder in every token, (48, 64), e4m3",
         {"x": _f32(outlier), "dtype": e4m3}),
        ("a 3-D batch (2, 3, 50), e5m2", {"x": _f32(rng.normal(size=(2, 3, 50))),
                                          "dtype": e5m2}),
        ("every block's amax is (1 - 2^-24) * 2^k, the float32 just below a power of "
         "two, k = 3, -2, 0 and 7, (4, 64), e4m3", {"x": _f32(below_powers),
                                                    "dtype": e4m3}),
    ]


def _reference_mx(x, dtype):
    """(q as float64, X, dequantized), from float64 inputs."""
    q, X = quant.mx_quantize(torch.from_numpy(x.astype(np.float64)), dtype)
    q64, X64 = q.double().numpy(), X.double().numpy()
    return q64, X64, q64 * _per_element(X64, x.shape[-1])


def _per_element(block_values, d):
    """(..., n_blocks) -> (..., d): each block's value repeated over its elements."""
    return np.repeat(block_values, quant.MX_BLOCK, axis=-1)[..., :d]


def _block_amax(x):
    d = x.shape[-1]
    padded = np.zeros(x.shape[:-1] + (-(-d // quant.MX_BLOCK) * quant.MX_BLOCK,))
    padded[..., :d] = np.abs(x.astype(np.float64))
    return padded.reshape(x.shape[:-1] + (-1, quant.MX_BLOCK)).max(axis=-1)


def _mx_scale_hint(X, x, dtype, ref_X):
    """A sentence naming how X was computed, or None."""
    amax = _block_amax(x)
    fmax = quant.fp8_max(dtype)
    emax = int(np.floor(np.log2(fmax)))
    live = amax > 0
    if not np.all(X[~live] == 1.0) and np.allclose(X[live], ref_X[live], rtol=0):
        return "an all-zero block has amax 0 (log2 gives -inf): give it X = 1"
    with np.errstate(divide="ignore", invalid="ignore"):
        mantissa = np.frexp(X[live])[0]
        if not np.all(mantissa == 0.5):
            if np.allclose(X[live], amax[live] / fmax, rtol=1e-5):
                return ("X = amax / fmax is not a power of two; the MX scale (E8M0) "
                        "has no mantissa bits: X = 2 ** (floor(log2 amax) - emax)")
            return "X must be a power of two in every block (E8M0 has no mantissa bits)"
        if np.allclose(X[live], 1.0 / ref_X[live], rtol=0):
            return ("these are 1 / X: X is what q is multiplied by to get x back, "
                    "2 ** (floor(log2 amax) - emax)")
        if np.allclose(X[live], 2.0 ** np.ceil(np.log2(amax[live] / fmax)), rtol=0):
            return ("these are 2 ** ceil(log2(amax / fmax)), which never saturates (a "
                    "choice some libraries make); the spec's rule asked for here is "
                    f"2 ** (floor(log2 amax) - emax), with emax = {emax}, and "
                    "saturates the values that pass fmax")
        ratio = X[live] / ref_X[live]
        if np.all(np.isin(ratio, [0.5, 1.0, 2.0])):
            return (f"X is off by a factor of two in some blocks: emax is floor(log2 "
                    f"fmax) = {emax} here, and X = 2 ** (floor(log2 amax) - emax)")
    return None


def _float32_log2_scales(x, dtype):
    """X as float32's log2 gives it: 2 ** (floor(log2 amax) - emax) with the log2
    rounded to float32, which lifts an amax just below a power of two (7.9999995,
    say) to the power itself, so X is twice the spec's there; 1 for a zero block."""
    amax = torch.from_numpy(_block_amax(x).astype(np.float32))
    emax = np.floor(np.log2(quant.fp8_max(dtype)))
    exponent = torch.log2(torch.where(amax > 0, amax, 1.0)).floor().double().numpy()
    return np.where(amax.numpy() > 0, 2.0 ** (exponent - emax), 1.0)


def _mx_stored(x, X, dtype):
    """(q as float64, dequantized) of x stored with the block scales X."""
    per_element = _per_element(X, x.shape[-1])
    fmax = quant.fp8_max(dtype)
    scaled = np.clip(x.astype(np.float64) / per_element, -fmax, fmax)
    q = torch.from_numpy(scaled).to(dtype).double().numpy()
    return q, q * per_element


def _judge_mx(case, output):
    x, dtype = case["x"], _dtype_of(case)
    problem = _stored_as(output, dtype)
    if problem:
        return problem
    ref_q, ref_X, ref_y = _reference_mx(x, dtype)
    X = np.asarray(output["scales"], np.float64)
    d = x.shape[-1]
    if X.shape == ref_X.shape and np.array_equal(X, _float32_log2_scales(x, dtype)):
        # float32's log2 rounds to the nearest float32, as it should: the scale
        # it gives is accepted, and q is judged against that scale
        ref_X = X
        ref_q, ref_y = _mx_stored(x, X, dtype)
    if X.shape != ref_X.shape:
        shown = f"X has shape {X.shape}; expected {ref_X.shape}, one scale per block"
        if x.ndim == 2 and X.shape == (-(-x.shape[0] // quant.MX_BLOCK), d):
            return (f"{shown}. Hint: these blocks run down the columns (across "
                    "tokens); MX blocks are 32 consecutive elements along the row, "
                    "the last axis")
        if d % quant.MX_BLOCK and X.shape == x.shape[:-1] + (d // quant.MX_BLOCK,):
            return (f"{shown}. Hint: {d} features make {d // quant.MX_BLOCK} whole "
                    f"blocks and a last, shorter one of {d % quant.MX_BLOCK}: it "
                    "needs its scale too")
        if X.size in (1, int(np.prod(x.shape[:-1]))):
            return f"{shown}. Hint: one scale per block of 32, not per row or tensor"
        return shown
    if not np.array_equal(X, ref_X):
        shown = (f"your X is {_listed(X.ravel()[:6])}...; expected "
                 f"{_listed(ref_X.ravel()[:6])}...")
        hint = _mx_scale_hint(X, x, dtype, ref_X)
        return f"{shown}. Hint: {hint}" if hint else shown
    q = np.asarray(output["q"], np.float64)
    if not _same_rounding(q, ref_q, 1.0, dtype):
        shown = (f"q, cast back to float: {_listed(q.ravel()[:6])}...; expected "
                 f"{_listed(ref_q.ravel()[:6])}...")
        if q.shape == ref_q.shape and not np.all(np.isfinite(q)):
            return (f"{shown}. Hint: x / X can pass fmax (amax / X lies between "
                    "2 ** emax and 2 ** (emax + 1)): clamp to [-fmax, fmax] before "
                    "the cast, so those values saturate")
        return shown
    y = np.asarray(output["y"], np.float64)
    if _same_rounding(y, ref_y, 1.0 / _per_element(ref_X, d), dtype):
        return None
    shown = (f"mx_dequantize(q, X) gives {_listed(y.ravel()[:6])}...; expected "
             f"{_listed(ref_y.ravel()[:6])}...")
    if y.shape == ref_y.shape and np.allclose(y, ref_q / _per_element(ref_X, d), rtol=1e-5):
        return f"{shown}. Hint: x comes back as q * X; multiply, do not divide"
    return shown



# -- four-bit elements: MXFP4 -------------------------------------------------

FP4_MISMATCH_FRACTION = 0.01  # values allowed one e2m1 step off (a tie met another way)


def _mxfp4_cases(rng):
    loud = rng.normal(size=(16, 64))
    loud[:, 3] *= 30.0  # one loud feature in block 0 of every token
    sizes = np.repeat(10.0 ** rng.uniform(-3, 3, size=(4, 3)), 32, axis=1)
    zero_block = rng.normal(size=(3, 64))
    zero_block[2, 32:] = 0.0
    exact = np.tile(np.array([6.0, -4.0, 3.0, 1.5, 0.5, -1.0, 2.0, 0.0] * 4), (2, 1))
    exact[1] *= 2.0**-5  # the same values in a block whose amax is 6 * 2**-5
    below = rng.uniform(-0.5, 0.5, size=(2, 64))
    below[:, [7, 39]] = np.nextafter(np.float32(4.0), np.float32(0))
    return [
        ("N(0, 1), 8 tokens x 64 features (two blocks a row)",
         {"x": _f32(rng.normal(size=(8, 64)))}),
        ("40 features a row: the last block holds 8, (6, 40)",
         {"x": _f32(rng.normal(size=(6, 40)))}),
        ("feature 3 is 30 times louder in every token, (16, 64)", {"x": _f32(loud)}),
        ("blocks whose sizes range from 0.001 to 1000, (4, 96)",
         {"x": _f32(sizes * rng.normal(size=(4, 96)))}),
        ("the second block of token 2 is all zeros, (3, 64)", {"x": _f32(zero_block)}),
        ("e2m1 values times a power of two, which come back exactly, (2, 32)",
         {"x": _f32(exact)}),
        ("a 3-D batch (2, 3, 50)", {"x": _f32(rng.normal(size=(2, 3, 50)))}),
        ("one token, shape (70,)", {"x": _f32(rng.normal(size=70))}),
        ("blocks whose amax is the float32 just below 4, (2, 64)", {"x": _f32(below)}),
    ]


def _mxfp4_with(x, scales_of, block=quant.MX_BLOCK):
    """The e2m1 round trip of x with the block scales scales_of(amax) (float64)."""
    d = x.shape[-1]
    n_blocks = -(-d // block)
    padded = np.zeros(x.shape[:-1] + (n_blocks * block,))
    padded[..., :d] = x.astype(np.float64)
    blocks = padded.reshape(x.shape[:-1] + (n_blocks, block))
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        X = np.where(amax > 0, scales_of(np.where(amax > 0, amax, 1.0)), 1.0)
    back = quant.e2m1_round(torch.from_numpy(blocks / X)).numpy() * X
    return back.reshape(x.shape[:-1] + (-1,))[..., :d]


def _mxfp4_floor(amax):
    return 2.0 ** (np.floor(np.log2(amax)) - quant.E2M1_EMAX)


def _mxfp4_float32_log2(amax):
    """The floor rule with float32's log2, which lifts an amax just below a
    power of two to that power."""
    exponent = torch.log2(torch.from_numpy(amax.astype(np.float32))).floor()
    return 2.0 ** (exponent.double().numpy() - quant.E2M1_EMAX)


def _mxfp4_slips(x):
    """{hint: the round trip that slip gives}."""
    slips = {
        "X = 2 ** (floor(log2 amax) - 8) takes e4m3's emax; e2m1's largest value is "
        "6 = 1.5 * 2 ** 2, so emax is 2 here":
            _mxfp4_with(x, lambda a: 2.0 ** (np.floor(np.log2(a)) - 8)),
        "that is the round-up rule, 2 ** ceil(log2(amax / 6)); the floor rule asked "
        "for here is 2 ** (floor(log2 amax) - 2), which saturates the values past 6":
            _mxfp4_with(x, lambda a: 2.0 ** np.ceil(np.log2(a / 6))),
        "X = amax / 6 is not a power of two; the MX scale (E8M0) has no mantissa "
        "bits": _mxfp4_with(x, lambda a: a / 6),
        "those are blocks of 16 (NVFP4's size); MXFP4's blocks hold 32":
            _mxfp4_with(x, _mxfp4_floor, block=16),
        "one scale per row (or for the whole tensor): MXFP4 gives each block of 32 "
        "its own scale":
            _mxfp4_with(x, _mxfp4_floor, block=max(x.shape[-1], 1)),
    }
    return slips


def _fp4_close(y, ref):
    """Equal but for at most FP4_MISMATCH_FRACTION of the values."""
    if y.shape != ref.shape:
        return False
    off = ~np.isclose(y, ref, rtol=1e-6, atol=0)
    return off.mean() <= FP4_MISMATCH_FRACTION


def _judge_mxfp4(case, output):
    if "float8" in str(output.get("dtype", "")):
        return "your result is a float8 tensor; return float32"
    x = case["x"]
    y = np.asarray(output["y"], np.float64)
    if y.shape != x.shape:
        return f"your result has shape {y.shape}; x has shape {x.shape}"
    if not np.all(np.isfinite(y)):
        return "your result holds inf or NaN (an all-zero block gets X = 1)"
    ref = _mxfp4_with(x, _mxfp4_floor)
    if _fp4_close(y, ref) or _fp4_close(y, _mxfp4_with(x, _mxfp4_float32_log2)):
        return None
    shown = _first_difference(y, ref)
    for hint, wrong in _mxfp4_slips(x).items():
        if _fp4_close(y, wrong):
            return f"{shown}. Hint: {hint}"
    grid = np.unique(np.abs(ref))
    if not np.isin(np.abs(y), grid).all() and np.allclose(y, x, rtol=0.2, atol=0.5):
        return (f"{shown}. Hint: each element is stored as e2m1_round(x / X), one of "
                "the 8 e2m1 magnitudes, and comes back as that value times X")
    return shown


# -- the MX matmul ------------------------------------------------------------

MX_SUM_RTOL = 1e-5  # float32 sums of up to 32 exact fp8 products, per block


def _mx_operands(rng, n_tokens, d, d_out, dtype, sizes=None, loud_channel=None):
    """One case: A and W quantized with the reference mx_quantize (A along
    its channels, W transposed so that its blocks run along d as well)."""
    a = rng.normal(size=(n_tokens, d))
    if sizes is not None:
        a *= np.repeat(sizes, quant.MX_BLOCK, axis=1)[:, :d]
    if loud_channel is not None:
        a[:, loud_channel] *= 1e4
    w = rng.normal(size=(d, d_out)) / np.sqrt(d)
    torch_dtype = getattr(torch, dtype)
    qa, Xa = quant.mx_quantize(torch.from_numpy(_f32(a)), torch_dtype)
    qw_t, Xw_t = quant.mx_quantize(torch.from_numpy(_f32(w.T.copy())), torch_dtype)
    return {"qa": _f32(qa.float().numpy()), "Xa": _f32(Xa.numpy()),
            "qw_t": _f32(qw_t.float().numpy()), "Xw_t": _f32(Xw_t.numpy()),
            "dtype": np.array(dtype)}


def _mx_matmul_cases(rng):
    e4m3 = "float8_e4m3fn"
    return [
        ("A (4, 64) and W (64, 3), N(0, 1): two blocks along d, e4m3",
         _mx_operands(rng, 4, 64, 3, e4m3)),
        ("d = 40, a whole block and a last one of 8: A (3, 40), W (40, 4), e4m3",
         _mx_operands(rng, 3, 40, 4, e4m3)),
        ("blocks of A whose sizes range from 0.001 to 1000, A (5, 96), W (96, 6), e4m3",
         _mx_operands(rng, 5, 96, 6, e4m3, sizes=10.0 ** rng.uniform(-3, 3, (5, 3)))),
        ("channel 5 of A is 10^4 times louder, A (8, 64), W (64, 8), e4m3",
         _mx_operands(rng, 8, 64, 8, e4m3, loud_channel=5)),
        ("A (2, 64), W (64, 2), e5m2", _mx_operands(rng, 2, 64, 2, "float8_e5m2")),
    ]


def _blocked64(q):
    """(rows, d) -> (rows, n_blocks, 32) in float64, the last block padded."""
    d = q.shape[-1]
    padded = np.zeros((q.shape[0], -(-d // quant.MX_BLOCK) * quant.MX_BLOCK))
    padded[:, :d] = q
    return padded.reshape(q.shape[0], -1, quant.MX_BLOCK)


def _judge_mx_matmul(case, output):
    a, w = _blocked64(case["qa"]), _blocked64(case["qw_t"])
    Xa, Xw = case["Xa"].astype(np.float64), case["Xw_t"].astype(np.float64)
    ref_p = np.einsum("tbk,jbk->tjb", a, w)
    size_p = np.einsum("tbk,jbk->tjb", np.abs(a), np.abs(w))  # what rounding scales with
    scales = Xa[:, None, :] * Xw[None, :, :]  # T, J, n_blocks
    ref_z, size_z = (ref_p * scales).sum(-1), (size_p * scales).sum(-1)
    partials = np.asarray(output["partials"], np.float64)
    z = np.asarray(output["z"], np.float64)

    def close(got, ref, size):
        return (got.shape == ref.shape and bool(np.all(np.isfinite(got)))
                and bool(np.all(np.abs(got - ref) <= MX_SUM_RTOL * size + 1e-300)))

    if not close(partials, ref_p, size_p):
        shown = (f"mx_block_partials gives shape {partials.shape} with "
                 f"{_listed(partials.ravel()[:4])}...; expected shape {ref_p.shape}, "
                 f"{_listed(ref_p.ravel()[:4])}...")
        if partials.shape == ref_p.shape[:2]:
            return (f"{shown}. Hint: one partial sum per block: keep the block axis, "
                    "(tokens, outputs, n_blocks)")
        if close(partials, ref_p * scales, size_p * scales):
            return (f"{shown}. Hint: these already carry the scales; the partial sums "
                    "are over the stored values q alone, and the scales come after, "
                    "once per block")
        if partials.shape == ref_p.transpose(1, 0, 2).shape and close(
                partials, ref_p.transpose(1, 0, 2), size_p.transpose(1, 0, 2)):
            return f"{shown}. Hint: the first axis is A's tokens, the second W's outputs"
        return shown
    if close(z, ref_z, size_z):
        return None
    shown = (f"mx_matmul gives {_listed(z.ravel()[:4])}...; expected "
             f"{_listed(ref_z.ravel()[:4])}... (shape {ref_z.shape})")
    slips = {
        "the scales are what q is multiplied by to get A and W back (A = q * X): "
        "multiply each partial sum by Xa[t, b] * Xw_t[j, b], do not divide":
            ((ref_p / scales).sum(-1), (size_p / scales).sum(-1)),
        "each block's partial sum needs its own two scales, Xa[t, b] * Xw_t[j, b], "
        "before the blocks are added":
            (ref_p.sum(-1), size_p.sum(-1)),
        "the blocks of one row have different scales: scale each block's partial "
        "sum by its own Xa[t, b] * Xw_t[j, b], then add, instead of adding first":
            (ref_p.sum(-1) * scales[..., 0], size_p.sum(-1) * scales[..., 0]),
    }
    for hint, (wrong, size) in slips.items():
        if close(z, wrong, size):
            return f"{shown}. Hint: {hint}"
    if z.shape == ref_z.T.shape and close(z, ref_z.T, size_z.T):
        return f"{shown}. Hint: z has shape (tokens, outputs): A's tokens come first"
    return shown

# -- SmoothQuant's fold -------------------------------------------------------

def _fold_case(rng, n_tokens, channels, d_out, loud=(), zero_channel=None,
               zero_row=None, alpha=0.5):
    x = rng.normal(size=(n_tokens, channels))
    x[:, list(loud)] *= 1e3
    w = rng.normal(size=(channels, d_out)) / np.sqrt(channels)
    if zero_channel is not None:
        x[:, zero_channel] = 0.0
    if zero_row is not None:
        w[zero_row] = 0.0
    return {"x": _f32(x), "w": _f32(w), "alpha": np.array(alpha)}


def _fold_cases(rng):
    return [
        ("X (16 tokens, 8 channels) with channels 2 and 5 a thousand times louder, "
         "W (8, 4), alpha = 0.5", _fold_case(rng, 16, 8, 4, loud=(2, 5))),
        ("the same shapes, alpha = 0.8 (more of each channel's size moved into W)",
         _fold_case(rng, 16, 8, 4, loud=(2, 5), alpha=0.8)),
        ("X (32, 64) with channel 7 loud, W (64, 64) square, alpha = 0.3",
         _fold_case(rng, 32, 64, 64, loud=(7,), alpha=0.3)),
        ("channel 3 of X all zeros, W (12, 6), alpha = 0.5",
         _fold_case(rng, 10, 12, 6, zero_channel=3)),
        ("row 4 of W all zeros (channel 4 feeds nothing), alpha = 0.5",
         _fold_case(rng, 10, 12, 6, loud=(1,), zero_row=4)),
    ]


def _fold_with(x, w, s):
    return x / s, s[:, None] * w


def _fold_mistakes(x, w, alpha):
    """{hint: (X_smooth, W_smooth)} of the usual slips, in float64."""
    x_max, w_max = np.abs(x).max(axis=0), np.abs(w).max(axis=1)
    with np.errstate(all="ignore"):
        right = x_max**alpha / w_max ** (1 - alpha)
        mistakes = {
            "the exponents are the wrong way round: alpha goes on the activation's "
            "max, 1 - alpha on the weight's":
                _fold_with(x, w, x_max ** (1 - alpha) / w_max**alpha),
            "the activation is multiplied by s and W divided by it; divide X's "
            "channel c by s_c and multiply W's row c by s_c":
                (x * right, w / right[:, None]),
        }
        if w.shape[0] == w.shape[1]:
            by_column = np.abs(w).max(axis=0)
            mistakes["W's max is taken down its columns; s_c needs the max of row c, "
                      "the weights channel c feeds (max over the last axis)"] = \
                _fold_with(x, w, x_max**alpha / by_column ** (1 - alpha))
            mistakes["W is scaled column by column; s_c multiplies W's row c "
                      "(s[:, None] * W)"] = (x / right, w * right[None, :])
    return mistakes


def _judge_fold(case, output):
    x, w = case["x"].astype(np.float64), case["w"].astype(np.float64)
    alpha = float(case["alpha"])
    ref_x, ref_w = (part.numpy() for part in quant.smoothquant_fold(
        torch.from_numpy(x), torch.from_numpy(w), alpha))
    got_x = np.asarray(output["x_smooth"], np.float64)
    got_w = np.asarray(output["w_smooth"], np.float64)
    problem = (mismatch(got_x, ref_x, dtype="float32", what="X_smooth")
               or mismatch(got_w, ref_w, dtype="float32", what="W_smooth"))
    if problem is None:
        return None
    if got_x.shape != ref_x.shape or got_w.shape != ref_w.shape:
        return problem
    if not (np.all(np.isfinite(got_x)) and np.all(np.isfinite(got_w))):
        return (f"{problem}. Hint: a channel whose activation or weight row is all "
                "zeros has a max of 0: give it s = 1, so that its fold changes nothing")
    for hint, (wrong_x, wrong_w) in _fold_mistakes(x, w, alpha).items():
        if (mismatch(got_x, wrong_x, dtype="float32") is None
                and mismatch(got_w, wrong_w, dtype="float32") is None):
            return f"{problem}. Hint: {hint}"
    if mismatch(got_x @ got_w, x @ w, dtype="float32") is not None:
        return (f"{problem}. Hint: X_smooth @ W_smooth must equal X @ W: whatever "
                "divides channel c of X must multiply row c of W")
    return problem


# -- the matmul --------------------------------------------------------------

@functools.cache
def _reference_matmul():
    """The matmul errors of the five schemes, in MATMUL_SCHEMES order."""
    errors = quant.matmul_errors()
    return np.array([errors[name] for name in MATMUL_SCHEMES], np.float64)


@functools.cache
def _reference_loud_tokens():
    """Question 3's errors on the quiet tokens, in MATMUL_SCHEMES order."""
    errors = quant.loud_token_errors()
    return np.array([errors[name] for name in MATMUL_SCHEMES], np.float64)


def _judge_measured(output, reference, name, layer, built_as=""):
    errors = np.asarray(output["errors"], np.float64)
    measured = np.asarray(output["measured"], np.float64)
    if not np.isclose(measured[0], reference[0], rtol=1e-6):
        return "the lesson's per-tensor round trip gave other figures here"
    if not np.allclose(errors, measured, rtol=TABLE_RTOL):
        return (f"your {name} say {_listed(errors)} ({', '.join(MATMUL_SCHEMES)}), "
                f"but your functions measure {_listed(measured)} {layer}: fill it "
                f"from your measurement, do not type the figures in{built_as}")
    return None


def _judge_matmul_errors(case, output):
    return _judge_measured(output, _reference_matmul(), "MATMUL_ERRORS",
                           "on the outlier layer")


def _judge_loud_token_errors(case, output):
    return _judge_measured(
        output, _reference_loud_tokens(), "LOUD_TOKEN_ERRORS",
        "on the quiet tokens of the loud-token batch",
        built_as=(". If you did measure them, check the batch: layer norm's output of "
                  "`tokens` with no gamma, the rows LOUD_TOKENS multiplied by 1e5, "
                  "W_PLAIN as the weight, and the error on rows=QUIET_TOKENS"))


@functools.cache
def _true_smooth_spread():
    """(after the fold, before it): the loud tokens' max over the quiet ones'."""
    A, W, quiet = loud_token_layer()
    X_smooth, _ = quant.smoothquant_fold(A.double(), W.double())
    return quant.loud_to_quiet_ratio(X_smooth, quiet), quant.loud_to_quiet_ratio(A, quiet)


def _judge_loud_token_answers(case, output):
    value, problem = _read_number(output, "answer", "ANSWER_SMOOTH_SPREAD")
    if problem:
        return problem
    truth, before = _true_smooth_spread()
    measured = float(output["measured"])
    if _close(value, truth) or (np.isfinite(measured) and _close(value, measured)):
        return None
    if _close(value, before):
        hint = ("that is A_LOUD_TOKENS before the fold; measure the smoothed activation "
                "that smoothquant_fold returns")
    elif _close(value, 1 / truth):
        hint = "that is the quiet tokens' max over the loud tokens'; turn it over"
    elif value < 10:
        hint = ("s_c divides a whole channel, the loud tokens' entries and the quiet "
                "ones' alike: measure it rather than reason it out")
    else:
        hint = ("fold A_LOUD_TOKENS and W_PLAIN (alpha 0.5), then divide the largest "
                "|entry| of the LOUD_TOKENS rows by the largest of the QUIET_TOKENS rows")
    return f"ANSWER_SMOOTH_SPREAD is not yet right (you answered {value:.4g}): {hint}"


# -- the conclusions ---------------------------------------------------------

@functools.cache
def _reference_rms_row():
    """(per-tensor, per-token) errors of the RMSNorm batch, e4m3."""
    return np.array(quant.scaling_errors(*experiment_token_sets()["RMSNorm, mu = 20"]))


def _own_or_reference(measured, reference):
    """The student's own figures; the reference where their code raised."""
    measured = np.asarray(measured, np.float64)
    return np.where(np.isfinite(measured), measured, reference)


_CASE_SLIPS = {
    ("loud channel", "per-token"):
        "a loud channel sits in every token, so it still sets every token's own scale",
    ("loud token", "per-channel"):
        "a loud token sits in every channel, so it still sets every channel's own scale",
    ("loud token", "smoothquant"):
        "SmoothQuant's fold divides whole channels, the loud tokens' entries and the "
        "quiet ones' alike (question 3's ratio)",
}


def _judge_scheme_case(name, answer, errors, table, reference):
    """None, or what is wrong with naming `answer` the best of {scheme: error}:
    right by the student's own figures, or by the reference's (true whatever
    slip an earlier exercise made), is right."""
    if answer not in errors:
        return (f"ANSWER_BEST_SCHEME[{name!r}] is {answer!r}, not one of the schemes "
                f"{list(errors)}")
    if answer in quant.fair_best_schemes(errors) | quant.fair_best_schemes(reference):
        return None
    if errors[answer] == max(errors.values()):
        hint = f"that is the largest error in your {table}, not the smallest"
    else:
        hint = _CASE_SLIPS.get((name, answer),
                               f"it is neither the smallest error in your {table} nor "
                               "within 25% of it")
    return f"ANSWER_BEST_SCHEME[{name!r}] is not yet right: {hint}"


def _judge_rms_case(answer, per_tensor, per_token, reference):
    """As _judge_scheme_case, for the RMSNorm batch's (per-tensor, per-token) row."""
    choices = quant.RMS_CASE_CHOICES
    if answer not in choices:
        return (f"ANSWER_BEST_SCHEME['RMSNorm, mu = 20'] is {answer!r}, not one of "
                f"{list(choices)}")
    verdict = quant.token_scaling_verdict(per_tensor, per_token)
    if answer in (verdict, quant.token_scaling_verdict(*reference)):
        return None
    if verdict == "about-the-same":
        hint = ("compare your two errors for this batch in SCALING_TABLE again, with "
                "the question's 25% rule")
    elif answer == "about-the-same":
        hint = ("your two errors for this batch in SCALING_TABLE differ by more than 25%")
    else:
        hint = "that is the larger of your two errors for this batch in SCALING_TABLE"
    return f"ANSWER_BEST_SCHEME['RMSNorm, mu = 20'] is not yet right: {hint}"


def _judge_best_scheme_case(name):
    """A judge for ANSWER_BEST_SCHEME[name] alone, read against the figures the
    student's functions measure for that case (the reference where they raised)."""

    def judge(case, output):
        answer = as_choice(np.ravel(output["answer"])[0])
        if name == "RMSNorm, mu = 20":
            reference = _reference_rms_row()
            return _judge_rms_case(answer, *_own_or_reference(output["rms_row"], reference),
                                   reference)
        reference, table = ((_reference_matmul(), "MATMUL_ERRORS") if name == "loud channel"
                            else (_reference_loud_tokens(), "LOUD_TOKEN_ERRORS"))
        errors = _own_or_reference(output["errors"], reference)
        return _judge_scheme_case(name, answer, dict(zip(MATMUL_SCHEMES, errors)), table,
                                  dict(zip(MATMUL_SCHEMES, reference)))

    return judge


# -- question 4: which scales a matmul can take -------------------------------

FACTOR_OUT_CHOICES = ("per-token", "per-output-column", "per-channel")
FACTORS_OUT = {"per-token", "per-output-column"}  # constant over the sum over c
_FACTOR_OUT_SLIPS = {
    "per-token": ("a scale per token, s_t, is one number for the whole of token t's "
                  "row: does it change as c runs over z_tj's sum?"),
    "per-output-column": ("W's scale per output column, r_j, is one number for the whole "
                          "of column j: does it change as c runs over z_tj's sum?"),
    "per-channel": ("A's scale per channel, s_c, is a different number in each term of "
                    "the sum over c"),
}


def _judge_factor_out(case, output):
    given = {as_choice(choice) for choice in np.ravel(output["choices"])} - {""}
    unknown = sorted(given - set(FACTOR_OUT_CHOICES))
    if unknown:
        return (f"ANSWER_FACTOR_OUT holds {unknown}: each entry is one of "
                f"{list(FACTOR_OUT_CHOICES)}")
    slips = [_FACTOR_OUT_SLIPS[name] for name in FACTOR_OUT_CHOICES
             if (name in given) != (name in FACTORS_OUT)]
    if slips:
        return "ANSWER_FACTOR_OUT is not yet right: " + "; ".join(slips)
    return None


def _per_channel_matmul_case(rng, tokens, channels, outputs, dtype, sizes=None):
    x = rng.normal(size=(tokens, channels)) * (1.0 if sizes is None else sizes)
    q, s = quant.per_channel_quantize(torch.from_numpy(_f32(x)), _torch(dtype))
    return {"q": _f32(q.float().numpy()), "s": _f32(s.float().numpy()),
            "W": _f32(rng.normal(size=(channels, outputs)) / channels**0.5),
            "dtype": np.array(dtype)}


def _torch(name):
    return getattr(torch, name)


def _per_channel_matmul_cases(rng):
    e4m3 = "float8_e4m3fn"
    loud = np.ones((1, 48))
    loud[0, 5] = 1e4
    return [
        ("q (6, 40), W (40, 5), N(0, 1) channels, e4m3",
         _per_channel_matmul_case(rng, 6, 40, 5, e4m3)),
        ("channels whose sizes range from 0.001 to 1000, q (8, 24), W (24, 3), e4m3",
         _per_channel_matmul_case(rng, 8, 24, 3, e4m3,
                                  10.0 ** rng.uniform(-3, 3, size=(1, 24)))),
        ("channel 5 is 10^4 times louder, q (16, 48), W (48, 7), e4m3",
         _per_channel_matmul_case(rng, 16, 48, 7, e4m3, loud)),
        ("q (4, 30), W (30, 9), e5m2",
         _per_channel_matmul_case(rng, 4, 30, 9, "float8_e5m2")),
    ]


PER_CHANNEL_MATMUL_RTOL = 1e-5  # float32 products and sums of up to 48 terms


def _judge_per_channel_matmul(case, output):
    if "z" not in output:
        return (f"per_channel_matmul returned {output['dtype']}; return float32: cast q "
                "to float32 first, torch has no fp8 matmul on the CPU")
    q, s, W = (case[name].astype(np.float64) for name in ("q", "s", "W"))
    z = np.asarray(output["z"], np.float64)
    ref, size = (q / s) @ W, np.abs(q / s) @ np.abs(W)

    def close(reference, scale):
        return (z.shape == reference.shape and bool(np.all(np.isfinite(z)))
                and bool(np.all(np.abs(z - reference)
                                <= PER_CHANNEL_MATMUL_RTOL * scale + 1e-300)))

    if close(ref, size):
        return None
    shown = (f"per_channel_matmul gives shape {z.shape} with {_listed(z.ravel()[:4])}...; "
             f"expected shape {ref.shape}, {_listed(ref.ravel()[:4])}...")
    slips = {
        "A = q / s: divide W's row c by s_c, do not multiply it":
            ((q * s) @ W, np.abs(q * s) @ np.abs(W)),
        "the scales are left out: fold 1 / s_c into W's row c before the product":
            (q @ W, np.abs(q) @ np.abs(W)),
    }
    for hint, (reference, scale) in slips.items():
        if close(reference, scale):
            return f"{shown}. Hint: {hint}"
    return shown


# -- exercise 5, continued: the scale rounded up ------------------------------

MX_RULE_RTOL = 0.01  # the three figures against the grader's own


def _mx_rule_reference():
    return quant.mx_rule_figures()


def _own_is_other_rule(output):
    return float(np.ravel(output["own"])[2]) == 0.0


def _own_if_floor_rule(output, index):
    """The student's own figure, read only where their X is the floor rule's:
    an X from another rule measures another rule; NaN otherwise."""
    own = np.ravel(output["own"])
    if len(own) < 3 or own[2] != 1.0:
        return float("nan")
    return float(own[index])


def _judge_mx_clipped(case, output):
    value, problem = _read_number(output, "clipped", "ANSWER_MX_CLIPPED_FRACTION")
    if problem:
        return problem
    truth = _mx_rule_reference()[0]
    own = _own_if_floor_rule(output, 0)
    if any(np.isclose(value, ref, rtol=MX_RULE_RTOL) for ref in (truth, own)):
        return None
    if _own_is_other_rule(output) and np.isclose(
            value, float(np.ravel(output["own"])[0]), rtol=MX_RULE_RTOL):
        return ("ANSWER_MX_CLIPPED_FRACTION is not yet right (you answered "
                f"{value:.4g}): that is what your mx_quantize's X clips, and that X "
                "is not the floor rule's, X = 2 ** (floor(log2(amax)) - 8); count "
                "the blocks that clip under the floor rule")
    if np.isclose(value, 100 * truth, rtol=MX_RULE_RTOL):
        hint = "that is a percentage; give the fraction, between 0 and 1"
    elif np.isclose(value, truth * quant.MX_RULE_SHAPE[0], rtol=MX_RULE_RTOL):
        hint = "that is the number of blocks; divide by how many blocks there are"
    elif value < truth / 4:
        hint = ("count blocks, not elements: a block clips when its largest |value| "
                "over X passes 448")
    else:
        hint = ("a block clips when its largest |value| divided by the floor rule's X "
                "passes 448, e4m3's fmax")
    return (f"ANSWER_MX_CLIPPED_FRACTION is not yet right (you answered {value:.4g}): "
            f"{hint}")


def _read_pair(output, keys, names, answer_name):
    """(first, second, a complaint or None) for an answer read as a pair of
    numbers: output[keys[0]] and output[keys[1]], named by names."""
    first, bad_first = _read_number(output, keys[0], names[0])
    second, bad_second = _read_number(output, keys[1], names[1])
    problem = bad_first or bad_second
    if problem:
        problem = (f"{answer_name} is a pair of numbers ({names[0]}, {names[1]}): "
                   f"{problem}")
    return first, second, problem


def _judge_mx_rule_errors(case, output):
    floor_error, round_up, problem = _read_pair(
        output, ("floor", "round_up"), ("the floor rule's error", "the round-up rule's error"),
        "ANSWER_MX_RULE_ERRORS")
    if problem:
        return problem
    _, true_floor, true_up = _mx_rule_reference()
    own_floor = _own_if_floor_rule(output, 1)
    problems = []
    if not any(np.isclose(floor_error, ref, rtol=MX_RULE_RTOL)
               for ref in (true_floor, own_floor)):
        problems.append("the floor rule's error is not yet right: round-trip the blocks "
                        "with mx_quantize and mx_dequantize and measure masked_error on "
                        "every entry")
    if not np.isclose(round_up, true_up, rtol=MX_RULE_RTOL):
        if np.isclose(round_up, true_floor, rtol=MX_RULE_RTOL):
            hint = "it equals the floor rule's: X must be rounded up, not down"
        else:
            hint = ("X = 2 ** ceil(log2(amax / 448)) per block, then the same clamp, "
                    "cast and q * X")
        problems.append(f"the round-up rule's error is not yet right: {hint}")
    if (np.isclose(floor_error, true_up, rtol=MX_RULE_RTOL)
            and np.isclose(round_up, true_floor, rtol=MX_RULE_RTOL)):
        problems = ["the pair is the wrong way round: (floor rule's, round-up rule's)"]
    if problems:
        return "ANSWER_MX_RULE_ERRORS: " + "; ".join(problems)
    return None


# -- exercise 9: the offset, and a zero-point per token ----------------------

OFFSET_TOLERANCE = 0.05  # the offset answer against the bisection's, in units of mu


@functools.cache
def _offset_crossings():
    """{format: the mu at which RMSNorm's per-tensor error passes 0.1}."""
    return {dtype: quant.offset_crossing(dtype) for dtype in quant.FP8_FORMATS}


def _judge_offset(case, output):
    mu, problem = _read_number(output, "mu", "ANSWER_OFFSET_MU")
    if problem:
        return problem
    crossings = _offset_crossings()
    if abs(mu - crossings[torch.float8_e4m3fn]) <= OFFSET_TOLERANCE:
        return None
    if abs(mu - crossings[torch.float8_e5m2]) <= OFFSET_TOLERANCE:
        hint = "that is where the error passes 0.1 in e5m2; the question is about e4m3"
    elif not 0 < mu < 20:
        hint = "the error passes 0.1 between mu = 0 and mu = 20"
    elif abs(quant.rms_offset_error(mu) - quant.OFFSET_ERROR_LIMIT) < 0.01:
        hint = (f"the error at your mu is within 0.01 of 0.1, but the answer must be "
                f"within {OFFSET_TOLERANCE} of the crossing in mu: refine your sweep "
                "or bisect further")
    else:
        hint = ("the error of F.rms_norm(mu + plain, (256,), eps=1e-5) after "
                "fp8_round_trip(., E4M3), measured with masked_error over every entry, "
                f"is not near 0.1 there (it is {quant.rms_offset_error(mu):.3g})")
    return f"ANSWER_OFFSET_MU is not yet right (you answered {mu:.4g}): {hint}"


# h / sqrt(12) = 0.1 with the step h at the offset between mu / 16 and mu / 8 (e4m3's
# 3 mantissa bits: the step is an eighth of the power of two at or below a value)
OFFSET_BRACKET = (0.1 * 12**0.5 * 8, 0.1 * 12**0.5 * 16)
OFFSET_BRACKET_RTOL = 0.02


def _judge_offset_bracket(case, output):
    if str(output.get("high", "None")).strip() == "None":
        return ("give ANSWER_OFFSET_BRACKET as a pair (lowest mu, highest mu), "
                f"not {str(output.get('low'))!r}")
    low, problem = _read_number(output, "low", "ANSWER_OFFSET_BRACKET's first value")
    if problem:
        return problem
    high, problem = _read_number(output, "high", "ANSWER_OFFSET_BRACKET's second value")
    if problem:
        return problem
    true_low, true_high = OFFSET_BRACKET
    if (abs(low - true_low) <= OFFSET_BRACKET_RTOL * true_low
            and abs(high - true_high) <= OFFSET_BRACKET_RTOL * true_high):
        return None
    shown = f"ANSWER_OFFSET_BRACKET is not yet right (you answered ({low:.4g}, {high:.4g}))"
    if (abs(high - true_low) <= OFFSET_BRACKET_RTOL * true_low
            and abs(low - true_high) <= OFFSET_BRACKET_RTOL * true_high):
        return f"{shown}: the pair is the wrong way round, (lowest mu, highest mu)"
    if abs(low * 2 - true_low) <= OFFSET_BRACKET_RTOL * true_low:
        return (f"{shown}: h / sqrt(12) = 0.1 gives h = 0.1 * sqrt(12); a step of mu / 8 "
                "reaches that at mu = 8 h, not 4 h")
    if abs(low - 0.8) <= 0.02 or abs(high - 1.6) <= 0.02:
        return (f"{shown}: rounding to a grid of step h leaves an RMSE of h / sqrt(12); "
                "the sqrt(12) is missing")
    return (f"{shown}: solve h / sqrt(12) = 0.1 for mu, once with the step h at mu "
            "as large as e4m3 makes it relative to mu, once as small")


def _zero_point_cases(rng):
    e4m3, e5m2 = np.array("float8_e4m3fn"), np.array("float8_e5m2")
    rms20 = quant.rms_norm_output(20 + quant.experiment_tokens())
    offsets = rng.uniform(-30, 30, size=(16, 1))
    spreads = 10.0 ** rng.uniform(-3, 1, size=(16, 1))
    with_constant = rng.normal(size=(4, 16))
    with_constant[2] = 3.0
    return [
        ("exercise 3's RMSNorm batch at mu = 20, e4m3", {"x": _f32(rms20), "dtype": e4m3}),
        ("tokens with offsets from -30 to 30 and spreads from 0.001 to 10, one of each "
         "per token, shape (16, 64), e4m3",
         {"x": _f32(offsets + spreads * rng.normal(size=(16, 64))), "dtype": e4m3}),
        ("skewed tokens (exponential draws, whose mean is not the middle of their "
         "range), shape (8, 64), e4m3",
         {"x": _f32(rng.exponential(size=(8, 64))), "dtype": e4m3}),
        ("a 3-D batch (2, 3, 32) offset by 5, e5m2",
         {"x": _f32(5 + rng.normal(size=(2, 3, 32))), "dtype": e5m2}),
        ("one token, shape (64,), offset by 10, e4m3",
         {"x": _f32(10 + rng.normal(size=64)), "dtype": e4m3}),
        ("token 2 is constant, 3.0 in every feature, shape (4, 16), e4m3",
         {"x": _f32(with_constant), "dtype": e4m3}),
    ]


def _range_scales(x, dtype):
    """fmax over half of each token's range, 1 for a constant token."""
    x64 = x.astype(np.float64)
    half = (x64.max(axis=-1, keepdims=True) - x64.min(axis=-1, keepdims=True)) / 2
    return np.where(half > 0, quant.fp8_max(dtype) / np.where(half > 0, half, 1), 1.0)


def _zero_point_slip(x, dtype, y):
    """A sentence naming the slip y matches, or None."""
    xt = torch.from_numpy(x.copy())
    fmax = quant.fp8_max(dtype)
    lo, hi = xt.amin(dim=-1, keepdim=True), xt.amax(dim=-1, keepdim=True)
    zero, half = (lo + hi) / 2, (hi - lo) / 2
    per_token = torch.where(half > 0, fmax / half, torch.ones_like(half))
    whole = (xt - zero).abs().max()
    middle = (xt.min() + xt.max()) / 2
    slips = {
        "you returned the stored values without the zero-point: add each token's "
        "midpoint back after the round trip": quant.fp8_round_trip(xt - zero, dtype,
                                                                   per_token),
        "nothing was stored in fp8: round-trip the shifted, scaled values through the "
        "fp8 dtype": xt,
        "that is each token's mean as its zero-point; the contract's zero-point is the "
        "midpoint of the token's range, (min + max) / 2, which puts its smallest value "
        "at -fmax and its largest at +fmax": quant.zero_point_round_trip(
            xt, dtype, per_token_scale=True),
        "that is each token's mean as its zero-point and one scale for the whole "
        "tensor: the contract asks for the midpoint of each token's range, "
        "(min + max) / 2, and a scale per token": quant.zero_point_round_trip(xt, dtype),
        "that is one scale for the whole tensor; each token needs its own scale, "
        "fmax over half its range": quant.fp8_round_trip(xt - zero, dtype,
                                                         fmax / whole) + zero,
        "that is one zero-point and one scale for the whole tensor; each token (row, "
        "the last axis) needs its own midpoint and its own scale":
            quant.fp8_round_trip(xt - middle, dtype) + middle,
        "the whole range max - min was mapped onto fmax, so the values reach only "
        "+-fmax / 2; map half the range, (max - min) / 2, onto fmax":
            quant.fp8_round_trip(xt - zero, dtype, per_token / 2) + zero,
        "that is the per-token round trip without a zero-point: subtract each token's "
        "midpoint before scaling": quant.per_token_round_trip(xt, dtype),
    }
    for hint, wrong in slips.items():
        if np.allclose(y, wrong.double().numpy(), rtol=1e-5, atol=1e-6):
            return hint
    return None


def _judge_zero_point(case, output):
    if "float8" in str(output.get("dtype", "")):
        return ("your result is a float8 tensor; cast back with .float() and add the "
                "zero-point in float32")
    x, dtype = case["x"], getattr(torch, str(case["dtype"]))
    y = np.asarray(output["y"], np.float64)
    if y.shape != x.shape:
        return f"your result has shape {y.shape}; x has shape {x.shape}"
    if not np.all(np.isfinite(y)):
        constant = np.any(np.ptp(x, axis=-1) == 0)
        return "your result holds inf or NaN" + (
            ": a constant token has max = min; give it a scale of 1" if constant else "")
    ref = quant.range_round_trip(torch.from_numpy(x.copy()), dtype).double().numpy()
    x64 = x.astype(np.float64)
    zero = (x64.max(axis=-1, keepdims=True) + x64.min(axis=-1, keepdims=True)) / 2
    # adding the zero-point back in float32 leaves noise of a few ulps of it
    noise = 4 * np.finfo(np.float32).eps * np.abs(zero) + 1e-12
    if _same_rounding(y, ref, _range_scales(x, dtype), dtype, atol=noise):
        return None
    slip = _zero_point_slip(x, dtype, y)
    return slip or ("your values are not each token's range mapped onto [-fmax, fmax] "
                    "and back: " + _first_difference(y, ref))


# -- what one loud entry costs its MX block ----------------------------------

def _whole_number(output, key, name):
    """(the answer as an int or None, a complaint or None)."""
    value, problem = _read_number(output, key, name)
    if problem is None and value != int(value):
        return None, f"{name} is a whole number of binades, k (you gave {value:g})"
    return (None if value is None else int(value)), problem


def _judge_mx_last_exact(case, output):
    last_exact = quant.mx_outlier_thresholds()[0]
    exact, problem = _whole_number(output, "last_exact_k", "ANSWER_MX_LAST_EXACT_K")
    if problem or exact == last_exact:
        return problem
    if exact > last_exact:
        hint = ("below e4m3's smallest normal value, 2 ** -6, the grid's step stays "
                "2 ** -9, and 1.875 needs all three mantissa bits: at your k the "
                "others are already rounded")
    else:
        hint = ("at your k + 1 the others, 1.875 / X, are still normal in e4m3 "
                "(at least 2 ** -6) and so still exact: find X from the outlier's "
                "floor(log2), then where 1.875 / X lands")
    return f"ANSWER_MX_LAST_EXACT_K is not yet right (you answered {exact}): {hint}"


def _judge_mx_first_zero(case, output):
    first_zero = quant.mx_outlier_thresholds()[1]
    zero, problem = _whole_number(output, "first_zero_k", "ANSWER_MX_FIRST_ZERO_K")
    if problem or zero == first_zero:
        return problem
    if zero < first_zero:
        hint = ("at your k the others are still at least half of e4m3's smallest "
                "subnormal, 2 ** -9, so they round up to it, not down to 0 (round "
                "to nearest, ties to even)")
    else:
        hint = ("at your k - 1 the others already land below half of e4m3's smallest "
                "subnormal, 2 ** -9, and round to 0")
    return f"ANSWER_MX_FIRST_ZERO_K is not yet right (you answered {zero}): {hint}"


# -- exercise 10: a learned beta against RMSNorm -----------------------------

BETA_RTOL = 0.01  # the table against the grader's own measurement
ABOUT_THE_SAME = 1.25  # two errors within this factor are "about the same"
BETA_WHY = "b"  # the right reason among the choices the assignment lists


def _beta_rows(table):
    return np.array([table[name] for name in quant.BETA_TABLE_ROWS], np.float64)


def _judge_beta_table(case, output):
    table = np.asarray(output["table"], np.float64)
    reference = _beta_rows(quant.beta_table())
    if np.allclose(table, reference, rtol=BETA_RTOL):
        return None
    if np.allclose(table[:, ::-1], reference, rtol=BETA_RTOL):
        return "each row is the wrong way round: (e4m3 error, bf16 error)"
    if np.allclose(table, _beta_rows(quant.beta_table(beta_after_round_trip=True)),
                   rtol=BETA_RTOL):
        return ("your LayerNorm row stores LayerNorm's output before beta is added: "
                "the layer's output is F.layer_norm(...) + beta, and that sum is what "
                "is stored")
    return (f"BETA_TABLE says {_listed(table[:, 0])} (e4m3) and {_listed(table[:, 1])} "
            f"(bf16) for {list(quant.BETA_TABLE_ROWS)}, but these are not the figures "
            "of each output's round trip, measured with masked_error(out, out_rt, "
            "everywhere) on the output itself, beta included")


def _louder(errors):
    """"layernorm", "rmsnorm" or "about the same" for (LayerNorm's, RMSNorm's) errors."""
    layer_norm, rms_norm = errors
    if max(errors) <= ABOUT_THE_SAME * min(errors):
        return "about the same"
    return "layernorm" if layer_norm > rms_norm else "rmsnorm"


def _norm_choice(answer):
    """A choice of ANSWER_BETA_LOSES_MORE, read so that "Layer Norm", "layer_norm"
    and the row's name "LayerNorm + beta" all read as "layernorm"."""
    return as_choice(answer).replace("-", "").removesuffix("+beta")


def _judge_beta_loses_more(case, output):
    answer = _norm_choice(output["answer"])
    choices = ("LayerNorm", "RMSNorm", "about the same")
    if answer not in map(_norm_choice, choices):
        return (f"ANSWER_BETA_LOSES_MORE is one of {list(choices)} "
                f"(you gave {str(output['answer'])!r})")
    truth = _louder(_beta_rows(quant.beta_table())[:, 0])
    own = np.asarray(output["own_e4m3"], np.float64)
    if answer == _norm_choice(truth):
        return None
    if (np.all(np.isfinite(own)) and np.all(own > 0)
            and answer == _norm_choice(_louder(own))):
        return None
    return (f"ANSWER_BETA_LOSES_MORE is not yet right (you answered "
            f"{str(output['answer'])!r}): compare the two e4m3 errors of your "
            "table, with the rule that errors within 1.25 times of each other are "
            "about the same")


def _judge_beta_why(case, output):
    answer = as_choice(output["why"])
    choices = ("a", "b", "c", "d")
    if answer not in choices:
        return f"ANSWER_BETA_WHY is one of the letters {list(choices)} (you gave {answer!r})"
    if answer != BETA_WHY:
        return (f"ANSWER_BETA_WHY is not yet right (you answered {answer!r}): every "
                "value is rounded after beta is added, in float32; ask what sets the "
                "size of the grid's steps near the stored values")
    return None


def _judge_beta_folded_error(case, output):
    error, problem = _read_number(output, "error", "ANSWER_BETA_FOLDED_ERROR")
    if problem:
        return problem
    if np.isclose(error, quant.beta_folded_error(), rtol=BETA_RTOL):
        return None
    if np.isclose(error, quant.beta_table()["LayerNorm + beta"][0], rtol=BETA_RTOL):
        hint = ("that is the error with beta stored; fold it out first: store "
                "F.layer_norm(plain, ...) alone and add beta back after the round trip")
    elif np.isclose(error, quant.beta_folded_error(on_output_with_beta=False),
                    rtol=BETA_RTOL):
        hint = ("that is measured on LayerNorm's output without beta; measure on the "
                "layer's output, LayerNorm + beta, against the round trip plus beta")
    else:
        hint = ("store LayerNorm's output without beta with fp8_round_trip(out, E4M3), "
                "add beta back, and measure with masked_error on LayerNorm + beta")
    return f"ANSWER_BETA_FOLDED_ERROR is not yet right (you answered {error:.4g}): {hint}"


SPREAD_FOLD_RTOL = 0.01  # each of ANSWER_SPREAD_FOLD_ERRORS, against the grader's


def _judge_spread_fold(case, output):
    unfolded, folded, problem = _read_pair(
        output, ("without", "with"),
        ("the error without the shift", "the error with the shift folded"),
        "ANSWER_SPREAD_FOLD_ERRORS")
    if problem:
        return problem
    true_unfolded, true_folded = quant.spread_fold_errors()
    if (np.isclose(unfolded, true_folded, rtol=SPREAD_FOLD_RTOL)
            and np.isclose(folded, true_unfolded, rtol=SPREAD_FOLD_RTOL)):
        return ("ANSWER_SPREAD_FOLD_ERRORS: the pair is the wrong way round: (error "
                "without the shift, error with it folded)")
    problems = []
    if not np.isclose(unfolded, true_unfolded, rtol=SPREAD_FOLD_RTOL):
        hint = ("store RMSNorm's output of SPREAD_OFFSETS + plain with fp8_round_trip"
                "(out, E4M3) and measure masked_error(out, out_rt, everywhere)")
        if np.isclose(unfolded, quant.rms_offset_error(20.0), rtol=SPREAD_FOLD_RTOL):
            hint = ("that is the batch whose tokens all share the offset 20; move each "
                    f"token by its own offset, SPREAD_OFFSETS: {hint}")
        problems.append(f"the error without the shift is not yet right: {hint}")
    if not np.isclose(folded, true_folded, rtol=SPREAD_FOLD_RTOL):
        input_shift = float(quant.SPREAD_OFFSET_MEAN)
        if np.isclose(folded, true_unfolded, rtol=SPREAD_FOLD_RTOL):
            hint = "it equals the error without the shift: subtract the shift first"
        elif np.isclose(folded, quant.spread_fold_errors(input_shift)[1],
                        rtol=SPREAD_FOLD_RTOL):
            hint = ("the shift is subtracted from RMSNorm's output, so it is the mean of "
                    "RMSNorm's output on the calibration batch, not the offset of its "
                    "input")
        else:
            hint = ("subtract one number, the mean of RMSNorm's output on the "
                    "calibration batch, store with fp8_round_trip(out - shift, E4M3), "
                    "add it back and measure against out")
        problems.append(f"the error with the shift folded is not yet right: {hint}")
    if problems:
        return "ANSWER_SPREAD_FOLD_ERRORS: " + "; ".join(problems)
    return None


CHECKS = {
    "quant_per_token": Check(_per_token_cases, _judge_per_token),
    "quant_delayed_scaler": Check(_delayed_cases, _judge_delayed),
    "quant_delayed_saturation": Check(_saturation_cases, _judge_delayed),
    "quant_scaling_table": Check(
        lambda rng: [("your table, and the same measurement with your "
                      "per_token_round_trip on the four batches", {})], _judge_table),
    "quant_spike_answer": Check(lambda rng: [("your answer about the spike", {})],
                                _judge_spike),
    "quant_scaling_answers": Check(
        lambda rng: [("your two scales that explain the table", {})],
        _judge_scaling_answers),
    "quant_per_channel": Check(_per_channel_cases, _judge_per_channel),
    "quant_mx_blocks": Check(_mx_cases, _judge_mx),
    "quant_mx_matmul": Check(_mx_matmul_cases, _judge_mx_matmul),
    "quant_smoothquant_fold": Check(_fold_cases, _judge_fold),
    "quant_matmul_errors": Check(
        lambda rng: [("your MATMUL_ERRORS, and the same measurement with your "
                      "quantizers on the outlier layer", {})], _judge_matmul_errors),
    "quant_loud_token_errors": Check(
        lambda rng: [("your LOUD_TOKEN_ERRORS, and the same measurement with your "
                      "quantizers on the quiet tokens", {})], _judge_loud_token_errors),
    "quant_loud_token_answers": Check(
        lambda rng: [("your ratio of loud to quiet tokens after the fold, and the same "
                      "ratio measured with your smoothquant_fold", {})],
        _judge_loud_token_answers),
    "quant_offset_answer": Check(
        lambda rng: [("your offset at which RMSNorm's e4m3 error passes 0.1", {})],
        _judge_offset),
    "quant_offset_bracket": Check(
        lambda rng: [("your range of mu from the h / sqrt(12) estimate", {})],
        _judge_offset_bracket),
    "quant_zero_point": Check(_zero_point_cases, _judge_zero_point),
    "quant_mxfp4": Check(_mxfp4_cases, _judge_mxfp4),
    "quant_factor_out": Check(lambda rng: [("the scales you chose", {})],
                              _judge_factor_out),
    "quant_per_channel_matmul": Check(_per_channel_matmul_cases,
                                      _judge_per_channel_matmul),
    "quant_mx_clipped_fraction": Check(
        lambda rng: [("your fraction of clipped blocks, and the same fraction measured "
                      "with your mx_quantize", {})], _judge_mx_clipped),
    "quant_mx_rule_errors": Check(
        lambda rng: [("your two errors, and the floor rule's measured with your "
                      "mx_quantize and mx_dequantize", {})], _judge_mx_rule_errors),
    "quant_mx_last_exact_k": Check(
        lambda rng: [("your largest k at which the block's others stay exact", {})],
        _judge_mx_last_exact),
    "quant_mx_first_zero_k": Check(
        lambda rng: [("your smallest k at which the block's others come back as 0", {})],
        _judge_mx_first_zero),
    "quant_best_scheme_loud_channel": Check(
        lambda rng: [("the scheme you name for the loud channel, and your own "
                      "measurement of the outlier layer", {})],
        _judge_best_scheme_case("loud channel")),
    "quant_best_scheme_loud_token": Check(
        lambda rng: [("the scheme you name for the loud tokens, and your own "
                      "measurement of the quiet tokens", {})],
        _judge_best_scheme_case("loud token")),
    "quant_best_scheme_rms_offset": Check(
        lambda rng: [("your answer for RMSNorm at mu = 20, and your own measurement "
                      "of that batch", {})],
        _judge_best_scheme_case("RMSNorm, mu = 20")),
    "quant_beta_table": Check(
        lambda rng: [("your BETA_TABLE, against the grader's own measurement", {})],
        _judge_beta_table),
    "quant_beta_loses_more": Check(
        lambda rng: [("which output loses more, and your table's e4m3 column", {})],
        _judge_beta_loses_more),
    "quant_beta_folded_error": Check(
        lambda rng: [("your error of LayerNorm + beta with beta folded out", {})],
        _judge_beta_folded_error),
    "quant_spread_fold_errors": Check(
        lambda rng: [("your errors on the batch whose offsets differ from token to "
                      "token, without and with the calibrated shift", {})],
        _judge_spread_fold),
    "quant_beta_why": Check(lambda rng: [("the reason you chose", {})], _judge_beta_why),
}
