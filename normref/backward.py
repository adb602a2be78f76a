"""Unit 04, the backward pass: layer norm, RMSNorm, GroupNorm and BatchNorm gradients.

A *token* is one row of d features; every function works on the last axis and
accepts any leading batch shape (...). Arithmetic is done in float64; results
come back in the input's floating dtype (float64 for integer input).

The forward pass keeps a small cache for the backward pass: the input x, gamma,
and per token only the mean and rstd = 1 / sqrt(var + eps). It does not keep
x_hat, which is as large as x itself: the backward pass recomputes it from
x, mean and rstd (as llm.c does), trading a little arithmetic for memory.

With g = dy * gamma and the mean taken over each token's features:

    dbeta  = dy summed over every token
    dgamma = dy * x_hat summed over every token
    dx     = rstd * (g - mean(g) - x_hat * mean(g * x_hat))           (layer norm)
    dx     = rstd * (g - x_hat * mean(g * x_hat))                     (RMSNorm)

GroupNorm works on x: (N, C, *) and takes its statistics per example and per
group of C / G consecutive channels, over those channels and every position;
gamma and beta are per channel. Its dx is layer norm's formula applied to
each group (the means taken over the group's members), with g = dy * gamma
broadcast per channel; dgamma and dbeta sum over every axis but the channels.

BatchNorm (training mode) works on x: (N, D) and takes its statistics per
feature over the batch (axis 0), with the biased variance. Its dx is layer
norm's formula with the means taken over the batch instead of the features;
dgamma and dbeta sum over the batch as before. Spatial BatchNorm (BatchNorm2d)
works on x: (N, C, H, W): the same formula, each channel's means taken over the
N * H * W values of axes 0, 2 and 3.

Layer norm's backward can also start from its output y instead of x (Apex's
memory_efficient option): x_hat = (y - beta) / gamma, gamma clamped to a
magnitude of at least eps, and the same dx formula.
"""

import numpy as np


def _as_float(x):
    """Return (x as float64, dtype to give results back in)."""
    x = np.asarray(x)
    out_dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64
    return x.astype(np.float64), out_dtype


def _sum_over_tokens(values):
    """Sum a (..., d) array over every leading axis -> (d,)."""
    return values.reshape(-1, values.shape[-1]).sum(axis=0)


def layer_norm_forward(x, gamma, beta, eps=1e-5):
    """Layer norm over the last axis, keeping what the backward pass needs.

    x: (..., d); gamma, beta: (d,) -> (y, cache) with y: (..., d) and cache a
    dict of plain arrays: "x" (..., d) and "gamma" (d,) as given, and float64
    "mean", "rstd" of shape (...), one number per token.
    """
    x64, dtype = _as_float(x)
    gamma64 = np.asarray(gamma, dtype=np.float64)  # d
    mean = x64.mean(axis=-1)  # ...
    var = ((x64 - mean[..., None]) ** 2).mean(axis=-1)  # ...
    rstd = 1.0 / np.sqrt(var + eps)  # ...
    x_hat = (x64 - mean[..., None]) * rstd[..., None]  # ..., d
    y = gamma64 * x_hat + np.asarray(beta, dtype=np.float64)  # ..., d
    cache = {"x": np.asarray(x), "gamma": np.asarray(gamma), "mean": mean, "rstd": rstd}
    return y.astype(dtype), cache


def layer_norm_backward(dy, cache):
    """Gradients of layer norm, given the upstream gradient dy = dL/dy.

    dy: (..., d); cache: from layer_norm_forward ->
    (dx: (..., d) in dy's dtype, dgamma: (d,), dbeta: (d,))
    """
    dy64, dtype = _as_float(dy)
    x64 = np.asarray(cache["x"], dtype=np.float64)  # ..., d
    gamma64 = np.asarray(cache["gamma"], dtype=np.float64)  # d
    mean = np.asarray(cache["mean"], dtype=np.float64)[..., None]  # ..., 1
    rstd = np.asarray(cache["rstd"], dtype=np.float64)[..., None]  # ..., 1
    x_hat = (x64 - mean) * rstd  # ..., d  recomputed, not cached
    dbeta = _sum_over_tokens(dy64)  # d
    dgamma = _sum_over_tokens(dy64 * x_hat)  # d
    g = dy64 * gamma64  # ..., d  gradient reaching x_hat
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)  # ..., d
                 - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))
    return dx.astype(dtype), dgamma.astype(dtype), dbeta.astype(dtype)


def rms_norm_backward(dy, x, gamma, eps=1e-5):
    """Gradients of RMSNorm y = gamma * x * rstd, rstd = 1 / sqrt(mean(x^2) + eps).

    It takes x and gamma rather than a cache: RMSNorm's only per-token
    statistic, rstd, is recomputed here from x in one pass.

    dy, x: (..., d); gamma: (d,) -> (dx: (..., d) in dy's dtype, dgamma: (d,))
    """
    dy64, dtype = _as_float(dy)
    x64 = np.asarray(x, dtype=np.float64)  # ..., d
    gamma64 = np.asarray(gamma, dtype=np.float64)  # d
    rstd = 1.0 / np.sqrt((x64**2).mean(axis=-1, keepdims=True) + eps)  # ..., 1
    x_hat = x64 * rstd  # ..., d
    dgamma = _sum_over_tokens(dy64 * x_hat)  # d
    g = dy64 * gamma64  # ..., d
    dx = rstd * (g - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))  # ..., d
    return dx.astype(dtype), dgamma.astype(dtype)


def rms_dx_dot_x(row_loss, mean_square, eps):
    """sum(dx * x) over one token's features for RMSNorm, from the token's share
    of the loss, row_loss = sum(dy * y), and its mean square mean(x^2).

    Stretching the token by a factor c gives y(c) = c * y / sqrt(c^2 ms + eps) *
    sqrt(ms + eps); its slope at c = 1 is y * eps / (ms + eps), and sum(dx * x)
    is that slope dotted with dy: zero when eps = 0, as the stretch then leaves
    y alone.
    """
    return row_loss * eps / (mean_square + eps)


def group_norm_backward(dy, x, num_groups, gamma, eps=1e-5):
    """Gradients of GroupNorm y = gamma * x_hat + beta, statistics per group.

    dy, x: (N, C, *); gamma: (C,); C divisible by num_groups ->
    (dx: like x, in dy's dtype; dgamma: (C,); dbeta: (C,))
    """
    dy64, dtype = _as_float(dy)
    x64 = np.asarray(x, dtype=np.float64)  # N, C, *
    n, c = x64.shape[:2]
    if c % num_groups:
        raise ValueError(f"num_channels ({c}) must be divisible by num_groups ({num_groups})")
    per_channel = (c,) + (1,) * (x64.ndim - 2)  # gamma as C, 1, ..., 1
    gamma64 = np.asarray(gamma, dtype=np.float64).reshape(per_channel)
    grouped = x64.reshape(n, num_groups, -1)  # N, G, M
    mean = grouped.mean(axis=-1, keepdims=True)  # N, G, 1
    rstd = 1.0 / np.sqrt(grouped.var(axis=-1, keepdims=True) + eps)  # N, G, 1
    x_hat = (grouped - mean) * rstd  # N, G, M
    not_channels = (0,) + tuple(range(2, x64.ndim))
    dbeta = dy64.sum(axis=not_channels)  # C
    dgamma = (dy64 * x_hat.reshape(x64.shape)).sum(axis=not_channels)  # C
    g = (dy64 * gamma64).reshape(n, num_groups, -1)  # N, G, M
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)
                 - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))  # N, G, M
    return dx.reshape(x64.shape).astype(dtype), dgamma.astype(dtype), dbeta.astype(dtype)


def batch_norm_backward(dy, x, gamma, eps=1e-5):
    """Gradients of batch norm in training mode, y = gamma * x_hat + beta with
    x_hat = (x - mean) * rstd, mean and the biased variance per feature over
    the batch (axis 0), rstd = 1 / sqrt(var + eps).

    dy, x: (N, D); gamma: (D,) -> (dx: (N, D) in dy's dtype, dgamma: (D,), dbeta: (D,))
    """
    dy64, dtype = _as_float(dy)
    x64 = np.asarray(x, dtype=np.float64)  # N, D
    gamma64 = np.asarray(gamma, dtype=np.float64)  # D
    mean = x64.mean(axis=0)  # D
    rstd = 1.0 / np.sqrt(((x64 - mean) ** 2).mean(axis=0) + eps)  # D
    x_hat = (x64 - mean) * rstd  # N, D
    dbeta = dy64.sum(axis=0)  # D
    dgamma = (dy64 * x_hat).sum(axis=0)  # D
    g = dy64 * gamma64  # N, D
    dx = rstd * (g - g.mean(axis=0) - x_hat * (g * x_hat).mean(axis=0))  # N, D
    return dx.astype(dtype), dgamma.astype(dtype), dbeta.astype(dtype)


def batch_norm_2d_backward(dy, x, gamma, eps=1e-5):
    """Gradients of spatial batch norm (BatchNorm2d) in training mode: each
    channel's mean and biased variance are taken over the batch and every
    position, the N * H * W values that share the channel.

    dy, x: (N, C, H, W); gamma: (C,) ->
    (dx: (N, C, H, W) in dy's dtype, dgamma: (C,), dbeta: (C,))
    """
    dy64, dtype = _as_float(dy)
    x64 = np.asarray(x, dtype=np.float64)  # N, C, H, W
    shared = (0, 2, 3)  # the axes a channel's statistics run over
    per_channel = np.asarray(gamma, dtype=np.float64).reshape(1, -1, 1, 1)  # 1, C, 1, 1
    mean = x64.mean(axis=shared, keepdims=True)  # 1, C, 1, 1
    rstd = 1.0 / np.sqrt(((x64 - mean) ** 2).mean(axis=shared, keepdims=True) + eps)
    x_hat = (x64 - mean) * rstd  # N, C, H, W
    dbeta = dy64.sum(axis=shared)  # C
    dgamma = (dy64 * x_hat).sum(axis=shared)  # C
    g = dy64 * per_channel  # N, C, H, W
    dx = rstd * (g - g.mean(axis=shared, keepdims=True)
                 - x_hat * (g * x_hat).mean(axis=shared, keepdims=True))  # N, C, H, W
    return dx.astype(dtype), dgamma.astype(dtype), dbeta.astype(dtype)


def layer_norm_backward_from_output(dy, y, gamma, beta, rstd, eps=1e-5):
    """Gradients of layer norm from its output, as NVIDIA Apex's
    memory_efficient backward takes them: the cache is rstd alone, next to the
    output y that the layer after the norm keeps anyway. x_hat is got back as
    (y - beta) / gamma, with gamma clamped to a magnitude of at least eps, its
    sign kept and 0 taken as +eps (Apex's clamp_by_magnitude): where |gamma| <
    eps the x_hat got back is the true one times |gamma| / eps, and y says
    nothing of x_hat where gamma is 0.

    dy, y: (..., d); gamma, beta: (d,); rstd: (..., 1) or (...) ->
    (dx: (..., d) in dy's dtype, dgamma: (d,), dbeta: (d,))
    """
    dy64, dtype = _as_float(dy)
    y64 = np.asarray(y, dtype=np.float64)  # ..., d
    gamma64 = np.asarray(gamma, dtype=np.float64)  # d
    rstd64 = np.asarray(rstd, dtype=np.float64).reshape(y64.shape[:-1] + (1,))  # ..., 1
    clamped = np.where(gamma64 >= 0, np.maximum(gamma64, eps),
                       np.minimum(gamma64, -eps))  # d
    x_hat = (y64 - np.asarray(beta, dtype=np.float64)) / clamped  # ..., d
    g = dy64 * gamma64  # ..., d
    dx = rstd64 * (g - g.mean(axis=-1, keepdims=True)  # ..., d
                   - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))
    dgamma = _sum_over_tokens(dy64 * x_hat)  # d
    dbeta = _sum_over_tokens(dy64)  # d
    return dx.astype(dtype), dgamma.astype(dtype), dbeta.astype(dtype)


def running_row_sum(dy, x_hat, acc_dtype):
    """dgamma = sum over the rows of dy * x_hat, added as a kernel adds it: one
    running sum of acc_dtype, each row's product formed in acc_dtype and added,
    the sum rounded to acc_dtype after every row (unit 07's kernels keep it in
    float32 whatever the tensors' dtype).

    dy, x_hat: torch tensors (M, d) -> a (d,) tensor of acc_dtype.
    """
    import torch  # only this function needs torch: its dtypes are the point

    total = torch.zeros(dy.shape[-1], dtype=acc_dtype)
    for dy_row, x_hat_row in zip(dy, x_hat):
        total = total + dy_row.to(acc_dtype) * x_hat_row.to(acc_dtype)
    return total
