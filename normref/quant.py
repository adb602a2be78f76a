"""Unit 06, zero-centred outputs and low precision: fp8 round trips in torch.

fp8 here is a storage format: a tensor is scaled, clamped, cast to fp8, cast
back to float32 and unscaled. On the CPU torch can cast to and from fp8 but
not do arithmetic in it, so every operation other than the two casts runs in
float32. All tensors are float32 unless a docstring says otherwise.
"""

import torch
import torch.nn.functional as F

FP8_FORMATS = (torch.float8_e4m3fn, torch.float8_e5m2)


def fp8_max(dtype):
    """Largest finite value of an fp8 dtype (448 for e4m3fn, 57344 for e5m2)."""
    return float(torch.finfo(dtype).max)


def amax_scale(x, dtype):
    """Per-tensor scale that maps the largest |x| onto the format's maximum.

    x: any shape -> float32 scalar tensor. An all-zero tensor gets scale 1,
    since any scale leaves zeros at zero.
    """
    amax = x.abs().max().float()  # ()
    if amax == 0:
        return torch.tensor(1.0)
    return fp8_max(dtype) / amax  # ()


def fp8_round_trip(x, dtype, scale=None):
    """x -> scale -> clamp to +-fmax -> fp8 -> float32 -> unscale.

    x: float32 tensor of any shape -> float32 tensor of the same shape.
    scale: a positive number; None means amax scaling (see amax_scale). The
    clamp is explicit because torch versions differ in what an out-of-range
    cast gives (the largest value, inf or NaN).
    """
    if scale is None:
        scale = amax_scale(x, dtype)
    fmax = fp8_max(dtype)
    scaled = (x.float() * scale).clamp(-fmax, fmax)  # same shape as x
    return scaled.to(dtype).float() / scale


def rmse_over_std(x, x_rt):
    """Root-mean-square error of x_rt against x, over the (biased) std of x.

    One number for the whole tensor, computed in float64: 0 is a perfect
    round trip; 1 means the error is as large as the signal's own spread.
    """
    x64 = torch.as_tensor(x).double()
    error = torch.as_tensor(x_rt).double() - x64
    return float(error.pow(2).mean().sqrt() / x64.std(correction=0))


def rmse_over_rms(x, x_rt):
    """Root-mean-square error of x_rt against x, over the RMS of x (float64).

    Unlike rmse_over_std this counts a common offset as signal: for RMSNorm's
    output, whose RMS is 1, it is the RMSE itself.
    """
    x64 = torch.as_tensor(x).double()
    error = torch.as_tensor(x_rt).double() - x64
    return float(error.pow(2).mean().sqrt() / x64.pow(2).mean().sqrt())


def bf16_round_trip(x):
    """x -> bfloat16 -> float32: no scale, bf16 has float32's range."""
    return x.to(torch.bfloat16).float()


def layer_norm_output(x, eps=1e-5):
    """Layer norm over the last axis without gamma and beta. x: (..., d)."""
    return F.layer_norm(x, x.shape[-1:], eps=eps)


def rms_norm_output(x, eps=1e-5):
    """RMSNorm over the last axis without gamma. x: (..., d)."""
    return F.rms_norm(x, x.shape[-1:], eps=eps)


def norm_output_errors(x, round_trip):
    """Quantization error of layer norm's and RMSNorm's outputs for tokens x.

    x: (..., d) float32; round_trip: tensor -> float32 tensor (a quantizer).
    Returns (layer-norm error, RMSNorm error), each rmse_over_std of the
    norm's output against its round trip.
    """
    errors = []
    for output in (layer_norm_output(x), rms_norm_output(x)):
        errors.append(rmse_over_std(output, round_trip(output)))
    return tuple(errors)


def offset_tokens(mu, n_tokens=256, d=1024, seed=0):
    """Tokens whose features are drawn from N(mu, 1): (n_tokens, d) float32."""
    generator = torch.Generator().manual_seed(seed)
    return mu + torch.randn(n_tokens, d, generator=generator)


def norm_errors_for_offset(mu, dtype=torch.float8_e4m3fn, n_tokens=256, d=1024, seed=0):
    """{"raw", "centred", "layer_norm", "rms_norm"}: RMSE / std after an fp8
    round trip with per-tensor amax scaling, for tokens N(mu, 1).

    "raw" quantizes the tokens with their offset kept, "centred" with each
    token's mean removed; the two norms quantize their outputs.
    """
    x = offset_tokens(mu, n_tokens, d, seed)  # n_tokens, d
    centred = x - x.mean(dim=-1, keepdim=True)  # n_tokens, d

    def round_trip(t):
        return fp8_round_trip(t, dtype)

    ln_error, rms_error = norm_output_errors(x, round_trip)
    return {
        "raw": rmse_over_std(x, round_trip(x)),
        "centred": rmse_over_std(centred, round_trip(centred)),
        "layer_norm": ln_error,
        "rms_norm": rms_error,
    }


# -- finer scaling: the assignment's exercises --------------------------------

def per_token_round_trip(x, dtype):
    """Round trip with one amax scale per token (row-wise scaling).

    x: float32 (..., d) -> float32 (..., d). Each token x[..., :] gets its own
    scale fmax / max|token|, or 1 for an all-zero token; then the round trip is
    the per-tensor one: scale, clamp to +-fmax, cast, cast back, unscale.
    """
    fmax = fp8_max(dtype)
    amax = x.float().abs().amax(dim=-1, keepdim=True)  # ..., 1
    scale = torch.where(amax > 0, fmax / amax, torch.ones_like(amax))  # ..., 1
    scaled = (x.float() * scale).clamp(-fmax, fmax)  # ..., d
    return scaled.to(dtype).float() / scale


class DelayedScaler:
    """Delayed per-tensor scaling: the scale comes from an amax history.

    scaler = DelayedScaler(dtype, history_len=16); y = scaler(x) round-trips x
    (float32, any shape -> same shape) with the scale chosen *before* x was
    seen, so a value larger than every remembered amax saturates at +-fmax.
    Then it appends max|x| to `history` (oldest first, at most history_len
    entries) and sets `scale` = fmax / max(history), or 1 if that max is 0.
    `scale` starts at 1.0 and `history` empty.
    """

    def __init__(self, dtype, history_len=16):
        self.dtype = dtype
        self.history_len = history_len
        self.history = []
        self.scale = 1.0

    def __call__(self, x):
        y = fp8_round_trip(x, self.dtype, self.scale)  # same shape as x
        self.history = (self.history + [float(x.abs().max())])[-self.history_len:]
        amax = max(self.history)
        self.scale = fp8_max(self.dtype) / amax if amax > 0 else 1.0
        return y


def masked_error(x, x_rt, keep):
    """rmse_over_std over the entries where the bool mask `keep` is True."""
    return rmse_over_std(x[keep], x_rt[keep])


def scaling_errors(x, keep, dtype=torch.float8_e4m3fn):
    """(per-tensor error, per-token error) of x on the entries `keep`."""
    return (masked_error(x, fp8_round_trip(x, dtype), keep),
            masked_error(x, per_token_round_trip(x, dtype), keep))


def spike_stream(n_steps=40, spike_at=10, spike=100.0, shape=(16, 64), seed=0):
    """A stream of N(0, 1) tensors; the one at `spike_at` is `spike` times larger."""
    generator = torch.Generator().manual_seed(seed)
    stream = [torch.randn(*shape, generator=generator) for _ in range(n_steps)]
    stream[spike_at] = spike * stream[spike_at]
    return stream


def steps_scaled_by_spike(history_len=16, dtype=torch.float8_e4m3fn, spike_at=10):
    """How many calls after the spike a DelayedScaler uses a scale set by it."""
    stream = spike_stream(spike_at=spike_at)
    spike_scale = fp8_max(dtype) / float(stream[spike_at].abs().max())
    scaler = DelayedScaler(dtype, history_len)
    count = 0
    for step, x in enumerate(stream):
        if step > spike_at and scaler.scale == spike_scale:
            count += 1
        scaler(x)
    return count
