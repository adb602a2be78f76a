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



def token_scale_spread(x, dtype=torch.float8_e4m3fn):
    """The largest per-token amax scale of x over the smallest, in float64."""
    amax = x.double().abs().amax(dim=-1)
    scales = fp8_max(dtype) / amax[amax > 0]
    return float(scales.max() / scales.min())


def largest_stored_kept(x, keep, dtype=torch.float8_e4m3fn):
    """The largest |x * s| over the entries `keep`, s the per-token amax scale
    of each entry's token: where the kept entries land on the fp8 grid."""
    amax = x.double().abs().amax(dim=-1, keepdim=True)
    scaled = x.double() * torch.where(amax > 0, fp8_max(dtype) / amax, 1.0)
    return float(scaled[keep].abs().max())

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


# -- per-channel and MX block scaling, and their effect on a matmul ----------

MX_BLOCK = 32  # elements per shared scale in the OCP MX v1.0 formats


def per_channel_quantize(x, dtype):
    """One amax scale per channel (column): (tokens, channels) -> fp8 and scales.

    x: float (T, C) -> (q, scale): q in `dtype`, (T, C); scale float32, (C,),
    fmax / max_t |x[t, c]|, or 1 for an all-zero channel. q = cast(clamp(x *
    scale)); per_channel_dequantize(q, scale) undoes the scale.
    """
    fmax = fp8_max(dtype)
    amax = x.abs().amax(dim=0)  # C
    scale = torch.where(amax > 0, fmax / amax, torch.ones_like(amax))  # C
    q = (x * scale).clamp(-fmax, fmax).to(dtype)  # T, C
    return q, scale.float()


def per_channel_dequantize(q, scale):
    """fp8 (T, C) and scales (C,) -> float32 (T, C): q / scale, column by column."""
    return q.float() / scale.float()  # T, C


def _blocks(x, block):
    """(..., d) -> (..., n_blocks, block), the last block padded with zeros."""
    d = x.shape[-1]
    n_blocks = -(-d // block)
    padded = F.pad(x, (0, n_blocks * block - d))  # ..., n_blocks * block
    return padded.reshape(*x.shape[:-1], n_blocks, block)


def mx_quantize(x, dtype, block=MX_BLOCK):
    """MX-style block scaling along the last axis (OCP MX v1.0, section 6.3).

    x: float (..., d) -> (q, X): q in `dtype`, (..., d); X float32, (...,
    ceil(d / block)), one shared power-of-two scale per block of `block`
    consecutive elements of a row (the last block may be shorter).
    X = 2 ** (floor(log2(amax)) - emax), emax = floor(log2(fmax)) (8 for
    e4m3, 15 for e5m2), or 1 for an all-zero block; q = cast(clamp(x / X)).
    amax / X lies in [2**emax, 2**(emax + 1)), which can pass fmax: those
    values saturate at +-fmax. Dequantize with mx_dequantize (q * X).
    """
    d = x.shape[-1]
    emax = float(torch.tensor(fp8_max(dtype)).log2().floor())
    blocks = _blocks(x, block)  # ..., n_blocks, block
    amax = blocks.abs().amax(dim=-1)  # ..., n_blocks
    exponent = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))[1]
    X = torch.where(amax > 0, torch.ldexp(torch.ones_like(amax), exponent - 1 - emax),
                    torch.ones_like(amax))  # ..., n_blocks
    fmax = fp8_max(dtype)
    q = (blocks / X.unsqueeze(-1)).clamp(-fmax, fmax).to(dtype)  # ..., n_blocks, block
    return q.flatten(-2)[..., :d], X.float()


MX_RULE_SHAPE, MX_RULE_SEED = (4096, 32), 0  # the blocks the scale rules are compared on


def mx_rule_blocks():
    """4096 blocks of 32 N(0, 1) values, one block per row."""
    return torch.randn(*MX_RULE_SHAPE, generator=torch.Generator().manual_seed(MX_RULE_SEED))


def mx_round_up_quantize(x, dtype, block=MX_BLOCK):
    """mx_quantize with the scale rounded up instead of the specification's
    floor: X = 2 ** ceil(log2(amax / fmax)), the smallest power of two with
    amax / X <= fmax, so that nothing clips (the rule Mishra et al., 2025,
    use for MXFP8 pre-training). Worked out exactly with frexp in float64."""
    d = x.shape[-1]
    blocks = _blocks(x, block)
    amax = blocks.abs().amax(dim=-1).double()
    ratio = torch.where(amax > 0, amax / fp8_max(dtype), torch.ones_like(amax))
    mantissa, exponent = torch.frexp(ratio)  # ratio = mantissa * 2 ** exponent
    up = torch.where(mantissa == 0.5, exponent - 1, exponent)  # ceil(log2(ratio))
    X = torch.where(amax > 0, torch.ldexp(torch.ones_like(amax), up), torch.ones_like(amax))
    q = (blocks.double() / X.unsqueeze(-1)).clamp(-fp8_max(dtype), fp8_max(dtype)).to(dtype)
    return q.flatten(-2)[..., :d], X.float()


def mx_rule_figures(quantize=None, dequantize=None):
    """(fraction of mx_rule_blocks() whose largest |value| clips under the
    floor rule, e4m3 rmse_over_std under the floor rule, under the round-up
    rule). quantize and dequantize default to mx_quantize and mx_dequantize."""
    quantize, dequantize = quantize or mx_quantize, dequantize or mx_dequantize
    x, e4m3 = mx_rule_blocks(), torch.float8_e4m3fn
    q, X = quantize(x.clone(), e4m3)
    X = torch.as_tensor(X).double().reshape(x.shape[0])
    # a power-of-two X divides exactly; the margin spares an X = amax / fmax
    # computed in float32 the rounding of its division
    ratio = x.double().abs().amax(dim=-1) / X
    clipped = float((ratio > fp8_max(e4m3) * (1 + 1e-6)).double().mean())
    floor_error = rmse_over_std(x, torch.as_tensor(dequantize(q, X.float().reshape(-1, 1)))
                                .float())
    round_up_error = rmse_over_std(x, mx_dequantize(*mx_round_up_quantize(x, e4m3)))
    return clipped, floor_error, round_up_error


def mx_dequantize(q, X, block=MX_BLOCK):
    """fp8 (..., d) and block scales (..., n_blocks) -> float32 (..., d)."""
    d = q.shape[-1]
    scaled = _blocks(q.float(), block) * X.float().unsqueeze(-1)  # ..., n_blocks, block
    return scaled.flatten(-2)[..., :d]



def mx_block_partials(qa, qw_t, block=MX_BLOCK):
    """The partial sums of an MX matmul, on the stored values alone.

    qa: fp8 (T, d), blocks of `block` along d; qw_t: fp8 (J, d), W transposed,
    so that its blocks run along d too. -> float32 (T, J, n_blocks): for
    each block b, the sum over its elements c of qa[t, c] * qw_t[j, c]."""
    a = _blocks(qa.float(), block)  # T, n_blocks, block
    w = _blocks(qw_t.float(), block)  # J, n_blocks, block
    return torch.einsum("tbk,jbk->tjb", a, w)


def mx_matmul(qa, Xa, qw_t, Xw_t, block=MX_BLOCK):
    """A @ W from MX-quantized operands: each block's partial sum times the
    product of its two power-of-two scales, then the sum over the blocks.

    Xa: (T, n_blocks), Xw_t: (J, n_blocks), as mx_quantize returns them for
    A and for W transposed. -> float32 (T, J)."""
    partials = mx_block_partials(qa, qw_t, block)  # T, J, n_blocks
    return (partials * Xa.float()[:, None, :] * Xw_t.float()[None, :, :]).sum(-1)

OUTLIER_CHANNELS = (5, 77, 130, 201)  # the experiment's loud channels
OUTLIER_GAMMA = 1e5  # their gamma, the largest of the lesson's section 7


def outlier_layer(n_tokens=128, d=256, d_out=128, seed=0):
    """(A, W): layer norm's output with gamma OUTLIER_GAMMA on OUTLIER_CHANNELS,
    (n_tokens, d) float32, and a weight (d, d_out) float32 whose rows for those
    channels are divided by the same gamma, so that A @ W is the layer without
    the outliers: the loud channels carry no more than the others."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randn(n_tokens, d, generator=gen)  # T, d
    W = torch.randn(d, d_out, generator=gen) / d**0.5  # d, d_out
    gamma = torch.ones(d)
    gamma[list(OUTLIER_CHANNELS)] = OUTLIER_GAMMA
    W[list(OUTLIER_CHANNELS)] /= OUTLIER_GAMMA
    return F.layer_norm(tokens, (d,), weight=gamma), W


def matmul_relative_error(A, A_rt, W, W_rt=None, rows=None):
    """||A_rt @ W_rt - A @ W|| / ||A @ W|| (Frobenius), all in float64.

    W_rt is the weight the stored activation meets (W unless a fold changed
    it); rows, a bool mask or indices of the tokens measured (all if None).
    """
    exact = A.double() @ W.double()  # T, d_out
    approx = A_rt.double() @ (W if W_rt is None else W_rt).double()  # T, d_out
    if rows is not None:
        exact, approx = exact[rows], approx[rows]
    return float((approx - exact).norm() / exact.norm())


def smoothing_factors(X, W, alpha=0.5):
    """SmoothQuant's per-channel factors (Xiao et al., 2023, arXiv:2211.10438).

    X: float (T, C), the activation; W: float (C, D), the weight it feeds.
    s_c = max_t |X[t, c]| ** alpha / max_d |W[c, d]| ** (1 - alpha), in float64;
    a channel whose activation or weight row is all zeros gets 1 (its fold
    changes nothing). Returns float64 (C,).
    """
    x_max = X.double().abs().amax(dim=0)  # C
    w_max = W.double().abs().amax(dim=1)  # C
    live = (x_max > 0) & (w_max > 0)
    s = x_max.clamp_min(1e-300) ** alpha / w_max.clamp_min(1e-300) ** (1 - alpha)
    return torch.where(live, s, torch.ones_like(s))  # C


def smoothquant_fold(X, W, alpha=0.5):
    """(X diag(s)^-1, diag(s) W) with s = smoothing_factors(X, W, alpha), float64.

    The product is unchanged: X diag(s)^-1 diag(s) W = X W. The activation's
    loud channels are divided down and the matching rows of W multiplied up.
    """
    s = smoothing_factors(X, W, alpha)  # C
    return X.double() / s, s.unsqueeze(-1) * W.double()  # T, C and C, D


def scheme_errors(A, W, dtype=torch.float8_e4m3fn, rows=None):
    """{scheme: matmul_relative_error} of A @ W for the five scalings, on `rows`.

    "smoothquant" folds with alpha 0.5, stores the smoothed activation with
    one per-tensor scale and multiplies it by the folded weight.
    """
    A_smooth, W_smooth = smoothquant_fold(A, W)
    stored = {
        "per-tensor": (fp8_round_trip(A, dtype), W),
        "per-token": (per_token_round_trip(A, dtype), W),
        "per-channel": (per_channel_dequantize(*per_channel_quantize(A, dtype)), W),
        "per-block": (mx_dequantize(*mx_quantize(A, dtype)), W),
        "smoothquant": (fp8_round_trip(A_smooth.float(), dtype), W_smooth),
    }
    return {name: matmul_relative_error(A, A_rt, W, W_rt, rows)
            for name, (A_rt, W_rt) in stored.items()}


def matmul_errors(dtype=torch.float8_e4m3fn):
    """{scheme: matmul_relative_error} on outlier_layer() for the five scalings."""
    A, W = outlier_layer()
    return scheme_errors(A, W, dtype)


LOUD_TOKENS = (0, 31, 64, 100)  # question 3's loud tokens
LOUD_TOKEN_FACTOR = 1e5


def loud_token_layer(n_tokens=128, d=256, d_out=128, seed=0):
    """(A, W, quiet): layer norm's output (no gamma) with LOUD_TOKENS multiplied
    by LOUD_TOKEN_FACTOR, the weight of outlier_layer before its rows were
    divided, and the bool mask (n_tokens,) of the other tokens."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randn(n_tokens, d, generator=gen)  # T, d
    W = torch.randn(d, d_out, generator=gen) / d**0.5  # d, d_out
    A = F.layer_norm(tokens, (d,))
    A[list(LOUD_TOKENS)] *= LOUD_TOKEN_FACTOR
    quiet = torch.ones(n_tokens, dtype=torch.bool)
    quiet[list(LOUD_TOKENS)] = False
    return A, W, quiet


def loud_to_quiet_ratio(X, quiet):
    """max |X| over the loud token rows over max |X| over the quiet ones."""
    return float(X[~quiet].abs().max() / X[quiet].abs().max())


def loud_token_errors(dtype=torch.float8_e4m3fn):
    """{scheme: matmul error on the quiet tokens} of loud_token_layer()."""
    A, W, quiet = loud_token_layer()
    return scheme_errors(A, W, dtype, rows=quiet)



# -- the conclusions: which scheme stores which case best --------------------

ABOUT_THE_SAME = 1.25  # two errors within 25% of each other are about the same
RMS_CASE_CHOICES = ("per-tensor", "per-token", "about-the-same")


def fair_best_schemes(errors):
    """The names in {name: error} whose error is within 25% of the smallest:
    each is a fair answer to "which scheme stores this best"."""
    best = min(errors.values())
    return {name for name, error in errors.items() if error <= ABOUT_THE_SAME * best}


def token_scaling_verdict(per_tensor_error, per_token_error):
    """"per-tensor", "per-token", or "about-the-same" when neither error is
    more than 25% above the other."""
    low, high = sorted((per_tensor_error, per_token_error))
    if high <= ABOUT_THE_SAME * low:
        return "about-the-same"
    return "per-tensor" if per_tensor_error < per_token_error else "per-token"


# -- the offset, and a zero-point per token ----------------------------------

OFFSET_ERROR_LIMIT = 0.1  # the error at which exercise 9 asks where RMSNorm's offset starts to cost


def experiment_tokens(n_tokens=64, d=256, seed=0):
    """The assignment's N(0, 1) batch (n_tokens, d): exercise 3's "plain"."""
    return torch.randn(n_tokens, d, generator=torch.Generator().manual_seed(seed))


def rms_offset_error(mu, dtype=torch.float8_e4m3fn):
    """rmse_over_std of RMSNorm's output for the tokens mu + experiment_tokens(),
    after a per-tensor round trip."""
    out = rms_norm_output(mu + experiment_tokens())
    return rmse_over_std(out, fp8_round_trip(out, dtype))


def offset_crossing(dtype=torch.float8_e4m3fn, limit=OFFSET_ERROR_LIMIT, hi=20.0,
                    tolerance=1e-4):
    """The mu in [0, hi] at which rms_offset_error passes `limit`, by bisection
    (the error grows with mu there)."""
    lo = 0.0
    if not rms_offset_error(lo, dtype) < limit <= rms_offset_error(hi, dtype):
        raise ValueError(f"the error does not pass {limit} between 0 and {hi}")
    while hi - lo > tolerance:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rms_offset_error(mid, dtype) < limit else (lo, mid)
    return (lo + hi) / 2


def zero_point_round_trip(x, dtype, per_token_scale=False):
    """Each token's mean subtracted, the centred tensor round-tripped (one
    amax scale, or one per token), the mean added back: the mean is the
    token's zero-point, kept in float32. x: (..., d) -> float32 (..., d)."""
    mean = x.mean(dim=-1, keepdim=True)  # ..., 1
    centred = x - mean
    stored = (per_token_round_trip(centred, dtype) if per_token_scale
              else fp8_round_trip(centred, dtype))
    return stored + mean


def range_round_trip(x, dtype):
    """Exercise 9's zero-point round trip: each token's range [min, max] mapped
    onto [-fmax, fmax], its midpoint (min + max) / 2 as the zero-point and
    fmax / ((max - min) / 2) as the scale, both kept in float32 per token; a
    constant token (max = min) keeps scale 1 and comes back exact.
    x: (..., d) -> float32 (..., d)."""
    x = x.float()
    fmax = fp8_max(dtype)
    lo, hi = x.amin(dim=-1, keepdim=True), x.amax(dim=-1, keepdim=True)  # ..., 1
    zero = (lo + hi) / 2
    half = (hi - lo) / 2
    scale = torch.where(half > 0, fmax / half, torch.ones_like(half))  # ..., 1
    stored = ((x - zero) * scale).clamp(-fmax, fmax).to(dtype).float()
    return stored / scale + zero


# -- an offset that differs from token to token (exercise 10) -----------------

SPREAD_OFFSET_MEAN, SPREAD_OFFSET_STD, SPREAD_SEED = 20.0, 3.0, 4


def spread_offset_batches():
    """(RMSNorm's output of the experiment tokens, each moved by its own offset
    from N(20, 3^2), and RMSNorm's output of a calibration batch drawn the same
    way), as the assignment builds them."""
    gen = torch.Generator().manual_seed(SPREAD_SEED)
    offsets = SPREAD_OFFSET_MEAN + SPREAD_OFFSET_STD * torch.randn(64, 1, generator=gen)
    calibration_offsets = (SPREAD_OFFSET_MEAN
                           + SPREAD_OFFSET_STD * torch.randn(64, 1, generator=gen))
    calibration_tokens = torch.randn(64, 256, generator=gen)
    return (rms_norm_output(offsets + experiment_tokens()),
            rms_norm_output(calibration_offsets + calibration_tokens))


def spread_fold_errors(shift=None):
    """(e4m3 error of that output stored per tensor, the same with the
    calibration batch's mean, or `shift`, subtracted before and added back
    after), each rmse_over_std."""
    out, calibration = spread_offset_batches()
    shift = calibration.mean() if shift is None else shift
    e4m3 = torch.float8_e4m3fn
    return (rmse_over_std(out, fp8_round_trip(out, e4m3)),
            rmse_over_std(out, fp8_round_trip(out - shift, e4m3) + shift))


# -- what one loud entry costs its MX block ----------------------------------

MX_QUIET_VALUE = 1.875  # binary 1.111: it needs all three of e4m3's mantissa bits


def mx_block_with_outlier(k, quiet=MX_QUIET_VALUE):
    """One block (1, MX_BLOCK): MX_BLOCK - 1 entries `quiet`, one 2**k times larger."""
    block = torch.full((1, MX_BLOCK), quiet)
    block[0, 0] = quiet * 2.0**k
    return block


def mx_outlier_thresholds(dtype=torch.float8_e4m3fn, quiet=MX_QUIET_VALUE, k_max=40):
    """(the largest k at which the quiet entries of mx_block_with_outlier(k) come
    back exactly, the smallest k at which they come back as 0)."""
    if float(torch.tensor(quiet).to(dtype).float()) != quiet:
        raise ValueError(f"{quiet} is not exact in {dtype}")
    back = [mx_dequantize(*mx_quantize(mx_block_with_outlier(k, quiet), dtype))[0, 1:]
            for k in range(k_max + 1)]
    exact = [k for k, b in enumerate(back) if bool((b == quiet).all())]
    zero = [k for k, b in enumerate(back) if bool((b == 0).all())]
    return max(exact), min(zero)


# -- a learned beta: LayerNorm's output moved off zero -----------------------

BETA_MEAN, BETA_SPREAD, BETA_SEED = 5.0, 0.5, 1  # the assignment's beta, per channel
BETA_TABLE_ROWS = ("LayerNorm + beta", "RMSNorm")


def learned_beta(d=256, seed=BETA_SEED):
    """A beta of BETA_MEAN +- BETA_SPREAD per channel, as a trained layer might learn."""
    return BETA_MEAN + BETA_SPREAD * torch.randn(d, generator=torch.Generator().manual_seed(seed))


def beta_folded_error(on_output_with_beta=True):
    """The e4m3 error of LayerNorm + beta when beta is folded into the next
    layer's bias: LayerNorm's output is stored without beta (per-tensor e4m3)
    and beta added back, measured on the output with beta. With
    on_output_with_beta=False it is measured on LayerNorm's output alone, the
    slip the grader recognises."""
    tokens = experiment_tokens()
    beta = learned_beta(tokens.shape[-1])
    plain_ln = layer_norm_output(tokens)
    stored = fp8_round_trip(plain_ln, torch.float8_e4m3fn)
    if not on_output_with_beta:
        return rmse_over_std(plain_ln, stored)
    return rmse_over_std(plain_ln + beta, stored + beta)


def beta_table(beta_after_round_trip=False):
    """{row: (e4m3 error, bf16 error)} for LayerNorm + beta and RMSNorm of the
    centred experiment tokens: rmse_over_std after a per-tensor e4m3 round trip
    and after a bf16 cast. beta_after_round_trip stores LayerNorm's output
    before beta is added, then adds it: the mistake the grader recognises."""
    tokens = experiment_tokens()
    beta = learned_beta(tokens.shape[-1])
    with_beta = layer_norm_output(tokens) + beta
    outputs = {"LayerNorm + beta": with_beta, "RMSNorm": rms_norm_output(tokens)}
    table = {name: (rmse_over_std(out, fp8_round_trip(out, torch.float8_e4m3fn)),
                    rmse_over_std(out, bf16_round_trip(out)))
             for name, out in outputs.items()}
    if beta_after_round_trip:
        plain_ln = layer_norm_output(tokens)
        table["LayerNorm + beta"] = (
            rmse_over_std(with_beta, fp8_round_trip(plain_ln, torch.float8_e4m3fn) + beta),
            rmse_over_std(with_beta, bf16_round_trip(plain_ln) + beta))
    return table


# -- four-bit elements: MXFP4 and NVFP4 --------------------------------------

# FP4 E2M1 (OCP MX v1.0, section 5.3.3): 1 sign, 2 exponent and 1 mantissa bit,
# no infinity, no NaN. Its non-negative values, and emax = 2 (largest normal 6).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_EMAX = 2
NVFP4_BLOCK = 16  # NVFP4: 16 elements share one e4m3 scale


def e2m1_round(v):
    """Each value of v rounded to the nearest e2m1 value, ties to the one with
    an even mantissa (0, 1, 2, 4), saturating at +-6. Float in, same dtype out."""
    grid = torch.tensor(E2M1_VALUES, dtype=v.dtype)  # 8
    distance = (v.abs().clamp(max=6.0).unsqueeze(-1) - grid).abs()  # ..., 8
    odd = torch.arange(8) % 2  # the odd mantissas sit at odd positions
    tied_last = torch.where(distance == distance.amin(-1, keepdim=True),
                            16 * odd + torch.arange(8), 99)
    return torch.sign(v) * grid[tied_last.argmin(-1)]


def mxfp4_round_trip(x, block=MX_BLOCK):
    """MXFP4 round trip along the last axis: e2m1 elements sharing one E8M0
    scale per block of 32, X = 2 ** (floor(log2 amax) - 2), 1 for an all-zero
    block; back = e2m1_round(x / X) * X. x: float (..., d) -> float32 (..., d)."""
    d = x.shape[-1]
    blocks = _blocks(x.float(), block)  # ..., n_blocks, block
    amax = blocks.abs().amax(dim=-1, keepdim=True)  # ..., n_blocks, 1
    exponent = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))[1]
    X = torch.where(amax > 0, torch.ldexp(torch.ones_like(amax),
                                          exponent - 1 - E2M1_EMAX),
                    torch.ones_like(amax))
    return (e2m1_round(blocks / X) * X).flatten(-2)[..., :d]


def nvfp4_round_trip(x, block=NVFP4_BLOCK):
    """NVFP4 round trip along the last axis: e2m1 elements, one e4m3 scale per
    block of 16 and one float32 scale for the whole tensor. The tensor scale
    puts the largest block scale at e4m3's 448: t = amax(x) / (448 * 6); each
    block's scale is amax(block) / 6 / t, stored in e4m3; an element is stored
    as e2m1_round(x / (e4m3 scale * t)). x: float (..., d) -> float32 (..., d)."""
    e4m3 = torch.float8_e4m3fn
    d = x.shape[-1]
    x = x.float()
    amax = x.abs().max()
    t = amax / (fp8_max(e4m3) * 6) if amax > 0 else torch.tensor(1.0)
    blocks = _blocks(x, block)  # ..., n_blocks, block
    block_amax = blocks.abs().amax(dim=-1, keepdim=True)  # ..., n_blocks, 1
    stored_scale = (block_amax / 6 / t).clamp(max=fp8_max(e4m3)).to(e4m3).float()
    scale = stored_scale * t
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (e2m1_round(blocks / scale) * scale).flatten(-2)[..., :d]


def per_token_fp4_round_trip(x):
    """e2m1 with one float32 scale per token: amax over the row onto 6."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 6, torch.ones_like(amax))
    return e2m1_round(x / scale) * scale
