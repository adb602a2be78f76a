"""Unit 06 checks, the student-facing half: how each exercise is called.

torch is imported inside the probes, not at the top, so that importing
normref.checks stays quick for the units that do not use it.
"""

import numpy as np

from normref.checks._runner import run_check

FLOAT8_HINT = ("arithmetic on float8 tensors is not implemented on the CPU; "
               "cast back with .float() first, then unscale in float32")
LOUD = 1e5  # how much louder the loud token and the loud channel are
TOKEN_SET_NAMES = ("plain", "loud token", "loud channel", "RMSNorm, mu = 20")
SCALING_CHOICES = ("per-tensor", "per-token", "about the same")


def _torch_dtype(name):
    import torch

    return getattr(torch, str(name))


def _dtype_name(value):
    return np.array(str(getattr(value, "dtype", type(value).__name__)))


def _tensor(array):
    import torch

    return torch.from_numpy(np.array(array, copy=True))


def _with_float8_hint(call):
    try:
        return call()
    except (NotImplementedError, RuntimeError) as exc:
        if "Float8" in str(exc):
            raise type(exc)(f"{exc} (hint: {FLOAT8_HINT})") from None
        raise


def experiment_token_sets(n_tokens=64, d=256, seed=0):
    """{name: (tokens, keep)}: the experiment's four batches, (n_tokens, d)
    float32, and the bool mask of the entries whose error is measured (all
    but the loud ones). The assignment builds the same batches."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(seed)
    plain = torch.randn(n_tokens, d, generator=gen)
    everywhere = torch.ones(n_tokens, d, dtype=torch.bool)
    loud_token = plain.clone()
    loud_token[0] *= LOUD  # token 0 is LOUD times louder
    quiet_tokens = everywhere.clone()
    quiet_tokens[0] = False
    loud_channel = plain.clone()
    loud_channel[:, 0] += LOUD  # feature 0 sits near LOUD in every token
    quiet_channels = everywhere.clone()
    quiet_channels[:, 0] = False
    rms_out = F.rms_norm(20 + plain, (d,), eps=1e-5)
    return {"plain": (plain, everywhere),
            "loud token": (loud_token, quiet_tokens),
            "loud channel": (loud_channel, quiet_channels),
            "RMSNorm, mu = 20": (rms_out, everywhere)}


def per_tensor_round_trip(x, dtype):
    """The lesson's round trip: one amax scale for the whole tensor."""
    import torch

    fmax = torch.finfo(dtype).max
    amax = x.abs().max()
    scale = fmax / amax if amax > 0 else 1.0
    return (x * scale).clamp(-fmax, fmax).to(dtype).float() / scale


def masked_error(x, x_rt, keep):
    """RMSE over std, in float64, on the entries where keep is True."""
    x64, rt64 = x[keep].double(), x_rt[keep].double()
    return float((rt64 - x64).pow(2).mean().sqrt() / x64.std(correction=0))


def _call_per_token(per_token_round_trip, case):
    x, dtype = _tensor(case["x"]), _torch_dtype(case["dtype"])
    y = _with_float8_hint(lambda: per_token_round_trip(x, dtype))
    return {"y": y, "dtype": _dtype_name(y)}


def _call_delayed_scaler(scaler_class, case):
    """Feed the stream to a new scaler; note each output, the scale after
    each call, the history's length after each call and the last history."""
    dtype = _torch_dtype(case["dtype"])
    scaler = scaler_class(dtype, history_len=int(case["history_len"]))
    outputs, scales, lengths = [], [], []
    for x in case["stream"]:
        y = _with_float8_hint(lambda x=x: scaler(_tensor(x)))
        if "float8" in str(getattr(y, "dtype", "")):
            return {"dtype": _dtype_name(y)}
        outputs.append(np.asarray(y.detach().numpy() if hasattr(y, "detach") else y,
                                  dtype=np.float64))
        scales.append(float(scaler.scale))
        lengths.append(len(scaler.history))
    return {"y": np.stack(outputs), "scales": np.array(scales),
            "lengths": np.array(lengths),
            "history": np.array([float(a) for a in scaler.history], np.float64)}


def _table_probe(subject, case):
    """The student's table, and the same measurement redone here: the
    per-tensor column with the lesson's round trip, the per-token column
    with the student's per_token_round_trip, on the same batches."""
    import torch

    table, per_token_round_trip = subject
    if not hasattr(table, "keys"):
        raise TypeError(f"the table is {type(table).__name__}, not a dict "
                        "{name: (per-tensor error, per-token error)}")
    missing = [name for name in TOKEN_SET_NAMES if name not in table]
    if missing:
        raise KeyError(f"the table has no row for {missing}; it needs {list(TOKEN_SET_NAMES)}")
    rows = [tuple(float(v) for v in table[name]) for name in TOKEN_SET_NAMES]
    if any(len(row) != 2 for row in rows):
        raise ValueError("each row must be a pair (per-tensor error, per-token error)")
    e4m3 = torch.float8_e4m3fn
    measured = []
    for x, keep in experiment_token_sets().values():
        y = _with_float8_hint(lambda x=x: per_token_round_trip(x.clone(), e4m3))
        y = torch.as_tensor(y).float()
        measured.append((masked_error(x, per_tensor_round_trip(x, e4m3), keep),
                         masked_error(x, y, keep)))
    return {"table": np.array(rows, np.float64), "measured": np.array(measured, np.float64)}


def _answers_as_text(answers, case):
    return {name: np.array(str(value)) for name, value in answers.items()}


def check_per_token_round_trip(per_token_round_trip):
    """Check per_token_round_trip(x, dtype): one amax scale per token."""
    run_check("quant_per_token", per_token_round_trip, _call_per_token)


def check_delayed_scaler(DelayedScaler):
    """Check DelayedScaler(dtype, history_len): scales from the amax history."""
    run_check("quant_delayed_scaler", DelayedScaler, _call_delayed_scaler)


def check_delayed_scaler_saturates(DelayedScaler):
    """Check that a spike beyond the remembered amax saturates at +-fmax."""
    run_check("quant_delayed_saturation", DelayedScaler, _call_delayed_scaler)


def check_scaling_predictions(loud_token, loud_channel, rms_offset):
    """Check that each prediction is given, as one of the three choices."""
    run_check("quant_predictions", {"loud_token": loud_token, "loud_channel": loud_channel,
                                    "rms_offset": rms_offset}, _answers_as_text)


def check_scaling_table(table, per_token_round_trip):
    """Check the table against the same measurement made with your function."""
    run_check("quant_scaling_table", (table, per_token_round_trip), _table_probe)


def check_spike_answer(steps):
    """Check the number of calls whose scale the spike sets."""
    run_check("quant_spike_answer", {"steps": steps}, _answers_as_text)


def check_scaling_answers(rms_why, channel_fix):
    """Check the two answers about the experiment."""
    run_check("quant_scaling_answers", {"rms_why": rms_why, "channel_fix": channel_fix},
              _answers_as_text)


# -- per-channel and MX block scaling, and the matmul they feed ---------------

MATMUL_SCHEMES = ("per-tensor", "per-token", "per-channel", "per-block")
OUTLIER_CHANNELS = (5, 77, 130, 201)
OUTLIER_GAMMA = 1e5


def outlier_layer(n_tokens=128, d=256, d_out=128, seed=0):
    """(A, W) of the matmul experiment: layer norm's output with gamma 1e5 on
    four channels, (n_tokens, d), and a weight (d, d_out) whose rows for those
    channels are divided by 1e5. The assignment builds the same pair."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randn(n_tokens, d, generator=gen)
    W = torch.randn(d, d_out, generator=gen) / d**0.5
    gamma = torch.ones(d)
    gamma[list(OUTLIER_CHANNELS)] = OUTLIER_GAMMA
    W[list(OUTLIER_CHANNELS)] /= OUTLIER_GAMMA
    return F.layer_norm(tokens, (d,), weight=gamma), W


def matmul_relative_error(A, A_rt, W):
    """||A_rt @ W - A @ W|| / ||A @ W||, in float64."""
    exact = A.double() @ W.double()
    return float((A_rt.double() @ W.double() - exact).norm() / exact.norm())


def _as_float32(value):
    import torch

    return torch.as_tensor(value).float()


def _stored(q):
    """What a quantizer stored: its values as float64, and its dtype's name."""
    values = q.float() if hasattr(q, "float") else q
    return (np.asarray(getattr(values, "detach", lambda: values)(), np.float64),
            _dtype_name(q))


def _call_quantizer(subject, case):
    """quantize(x, dtype) -> (q, scales); then dequantize(q, scales)."""
    quantize, dequantize = subject
    x, dtype = _tensor(case["x"]), _torch_dtype(case["dtype"])
    result = _with_float8_hint(lambda: quantize(x.clone(), dtype))
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise TypeError("the quantizer must return a pair (q, scales), "
                        f"not {type(result).__name__}")
    q, scales = result
    y = _with_float8_hint(lambda: dequantize(q, scales))
    q_values, q_dtype = _stored(q)
    return {"q": q_values, "q_dtype": q_dtype,
            "scales": np.asarray(_as_float32(scales).numpy(), np.float64),
            "y": np.asarray(_as_float32(y).numpy(), np.float64), "y_dtype": _dtype_name(y)}


def _matmul_probe(subject, case):
    """The student's matmul errors, and the same measurement redone here with
    the lesson's round trip and the student's three other quantizers."""
    import torch

    errors, per_token, channel_pair, block_pair = subject
    if not hasattr(errors, "keys"):
        raise TypeError(f"MATMUL_ERRORS is {type(errors).__name__}, not a dict "
                        "{scheme: relative error}")
    missing = [name for name in MATMUL_SCHEMES if name not in errors]
    if missing:
        raise KeyError(f"MATMUL_ERRORS has no entry for {missing}; it needs "
                       f"{list(MATMUL_SCHEMES)}")
    e4m3 = torch.float8_e4m3fn
    A, W = outlier_layer()
    round_trips = {
        "per-tensor": lambda: per_tensor_round_trip(A, e4m3),
        "per-token": lambda: per_token(A.clone(), e4m3),
        "per-channel": lambda: channel_pair[1](*channel_pair[0](A.clone(), e4m3)),
        "per-block": lambda: block_pair[1](*block_pair[0](A.clone(), e4m3)),
    }
    measured = []
    for name in MATMUL_SCHEMES:
        A_rt = _as_float32(_with_float8_hint(round_trips[name]))
        measured.append(matmul_relative_error(A, A_rt, W))
    return {"errors": np.array([float(errors[name]) for name in MATMUL_SCHEMES]),
            "measured": np.array(measured, np.float64)}


def check_per_channel(per_channel_quantize, per_channel_dequantize):
    """Check per_channel_quantize(x, dtype) and per_channel_dequantize(q, scale)."""
    run_check("quant_per_channel", (per_channel_quantize, per_channel_dequantize),
              _call_quantizer)


def check_mx_blocks(mx_quantize, mx_dequantize):
    """Check mx_quantize(x, dtype) and mx_dequantize(q, X): MX blocks of 32."""
    run_check("quant_mx_blocks", (mx_quantize, mx_dequantize), _call_quantizer)


def check_matmul_errors(errors, per_token_round_trip, per_channel_pair, mx_pair):
    """Check MATMUL_ERRORS against the same measurement made with your functions."""
    run_check("quant_matmul_errors",
              (errors, per_token_round_trip, per_channel_pair, mx_pair), _matmul_probe)


def check_matmul_answers(best, gain):
    """Check which scheme wins the matmul, and by how much."""
    run_check("quant_matmul_answers", {"best": best, "gain": gain}, _answers_as_text)
