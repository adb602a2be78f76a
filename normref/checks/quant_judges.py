"""Unit 06 checks, the grader-facing half: inputs, references, diagnoses."""

import functools

import numpy as np
import torch

from normref import quant
from normref.checks._registry import Check
from normref.checks.quant_probes import (
    SCALING_CHOICES,
    TOKEN_SET_NAMES,
    experiment_token_sets,
)
from normref.checks.tolerances import mismatch, number_from_answer

SMALL_EXAMPLE = np.array([[0.5, -1.0, 3.0, 7.0], [0.01, 0.02, -0.04, 0.0]], np.float32)
TABLE_RTOL = 1e-3  # the table against the student's own measurement: same numbers
MEASURED_RTOL = 0.02  # that measurement against the reference: rounding ties aside
RMS_WHY_CHOICES = ("a", "b", "c")
CHANNEL_FIX_CHOICES = ("per-channel", "per-token", "longer history")


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
        problem = (f"call {step + 1}: the round trip is {_listed(y_t.ravel()[:6])}...; "
                   f"expected {_listed(ref_t.ravel()[:6])}..., with the scale {scale:.4g} "
                   "chosen before this tensor was seen")
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


# -- predictions and answers -------------------------------------------------

def _judge_predictions(case, output):
    missing = [name for name in ("loud_token", "loud_channel", "rms_offset")
               if str(output.get(name, "None")) not in SCALING_CHOICES]
    if missing:
        return (f"give each prediction as one of {list(SCALING_CHOICES)}; not yet: "
                f"{', '.join(missing)}. Any of the three earns the point: it is your guess")
    return None


@functools.cache
def _reference_table():
    """(rows, 2): (per-tensor error, per-token error) for each batch, e4m3."""
    return np.array([quant.scaling_errors(x, keep)
                     for x, keep in experiment_token_sets().values()], np.float64)


def _winner(per_tensor, per_token):
    """The winner of a row, 'about the same' within 25% of each other."""
    if max(per_tensor, per_token) < 1.25 * min(per_tensor, per_token):
        return "about the same"
    return "per-token" if per_token < per_tensor else "per-tensor"


def _judge_table(case, output):
    table = np.asarray(output["table"], np.float64)
    measured = np.asarray(output["measured"], np.float64)
    reference = _reference_table()
    if not np.allclose(measured[:, 0], reference[:, 0], rtol=1e-6):
        return "the lesson's per-tensor round trip gave other figures here"
    if not (np.all(np.isfinite(measured)) and np.allclose(measured, reference,
                                                          rtol=MEASURED_RTOL)):
        return (f"measured with your per_token_round_trip, the per-token column is "
                f"{_listed(measured[:, 1])}; the reference measures "
                f"{_listed(reference[:, 1])} on the same batches. Hint: make "
                "per_token_round_trip pass its own check first")
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


def _true_scaling_answers():
    """The answers, worked out from the reference measurement."""
    rows = dict(zip(TOKEN_SET_NAMES, _reference_table()))
    # (a) holds when per-token scaling leaves RMSNorm's error where it was
    rms_why = "a" if _winner(*rows["RMSNorm, mu = 20"]) == "about the same" else "b"
    channel_fix = ("per-channel" if _winner(*rows["loud channel"]) == "about the same"
                   else "per-token")
    return {"rms_why": rms_why, "channel_fix": channel_fix}


def _judge_scaling_answers(case, output):
    truths = _true_scaling_answers()
    given = {name: str(output.get(name, "None")).strip() for name in truths}
    choices = {"rms_why": RMS_WHY_CHOICES, "channel_fix": CHANNEL_FIX_CHOICES}
    invalid = [f"{name} must be one of {list(choices[name])} (you gave {given[name]!r})"
               for name in truths if given[name] not in choices[name]]
    if invalid:
        return "; ".join(invalid)
    wrong = [f"{name} (you answered {given[name]!r})" for name in truths
             if given[name] != truths[name]]
    if wrong:
        return "not yet right: " + "; ".join(wrong) + ". Look at your table again"
    return None


CHECKS = {
    "quant_per_token": Check(_per_token_cases, _judge_per_token),
    "quant_delayed_scaler": Check(_delayed_cases, _judge_delayed),
    "quant_delayed_saturation": Check(_saturation_cases, _judge_delayed),
    "quant_predictions": Check(lambda rng: [("your three predictions", {})],
                               _judge_predictions),
    "quant_scaling_table": Check(
        lambda rng: [("your table, and the same measurement with your "
                      "per_token_round_trip on the four batches", {})], _judge_table),
    "quant_spike_answer": Check(lambda rng: [("your answer about the spike", {})],
                                _judge_spike),
    "quant_scaling_answers": Check(lambda rng: [("your two answers about the table", {})],
                                   _judge_scaling_answers),
}
