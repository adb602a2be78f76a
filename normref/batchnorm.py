"""Unit 02, rows versus columns: batch norm and group norm in numpy.

Batch norm normalizes each channel (a column of the token table) over the
batch, with torch.nn.BatchNorm1d's semantics; group norm normalizes groups of
channels within each example, like torch.nn.functional.group_norm. Arithmetic
is done in float64 and results come back in the input's floating dtype
(float64 for integer input), as in normref.recipe.
"""

import numpy as np


def _as_float(x):
    """Return (x as float64, dtype to give results back in)."""
    x = np.asarray(x)
    out_dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64
    return x.astype(np.float64), out_dtype


def _per_channel(values, ndim):
    """Shape a (C,) vector to broadcast against (N, C, *) with `ndim` axes."""
    return np.asarray(values, dtype=np.float64).reshape((-1,) + (1,) * (ndim - 2))


def batch_norm(x, gamma, beta, running_mean, running_var, training,
               momentum=0.1, eps=1e-5):
    """Batch norm over the batch (and length) axes, one channel at a time.

    x: (N, C) or (N, C, L); gamma, beta: (C,) or None (meaning 1 and 0);
    running_mean, running_var: (C,) or None (statistics not tracked)
    -> (y like x, new_running_mean (C,), new_running_var (C,))

    Training normalizes with the batch's biased variance and moves the running
    statistics towards the batch's mean and *unbiased* variance, momentum being
    the weight of the new value: running = (1 - momentum) * running + momentum
    * batch. Eval normalizes with the running statistics and leaves them as
    they are. A training batch with one value per channel has no spread to
    measure and raises ValueError, as torch does.
    """
    x64, dtype = _as_float(x)
    if x64.ndim not in (2, 3):
        raise ValueError(f"expected a 2-D or 3-D input, got shape {x64.shape}")
    reduce_axes = (0,) if x64.ndim == 2 else (0, 2)
    values_per_channel = x64.size // x64.shape[1]
    tracked = running_mean is not None and running_var is not None
    new_mean = None if running_mean is None else np.asarray(running_mean).copy()
    new_var = None if running_var is None else np.asarray(running_var).copy()

    if training or not tracked:  # torch uses batch statistics when nothing is tracked
        if training and values_per_channel == 1:
            # torch prints the shape as a torch.Size; match its text exactly
            raise ValueError("Expected more than 1 value per channel when training, "
                             f"got input size torch.Size({list(x64.shape)})")
        mean = x64.mean(axis=reduce_axes)  # C
        var = x64.var(axis=reduce_axes)  # C, biased: divides by N (* L)
        if training and tracked:
            unbiased = var * values_per_channel / (values_per_channel - 1)  # C
            new_mean = ((1 - momentum) * np.asarray(running_mean, np.float64)
                        + momentum * mean).astype(new_mean.dtype)
            new_var = ((1 - momentum) * np.asarray(running_var, np.float64)
                       + momentum * unbiased).astype(new_var.dtype)
    else:
        mean = np.asarray(running_mean, dtype=np.float64)  # C
        var = np.asarray(running_var, dtype=np.float64)  # C

    x_hat = (x64 - _per_channel(mean, x64.ndim)) / np.sqrt(_per_channel(var, x64.ndim) + eps)
    if gamma is not None:
        x_hat = x_hat * _per_channel(gamma, x64.ndim)
    if beta is not None:
        x_hat = x_hat + _per_channel(beta, x64.ndim)
    return x_hat.astype(dtype), new_mean, new_var


def group_norm(x, num_groups, gamma=None, beta=None, eps=1e-5):
    """Group norm: each example's channels split into `num_groups` groups of
    consecutive channels; each group normalized over its channels and positions.

    x: (N, C, *); gamma, beta: (C,) or None (meaning 1 and 0) -> y: like x.
    One group is layer norm over (C, *) without affine; C groups is instance
    norm. C must be divisible by num_groups (torch's nn.GroupNorm message).
    """
    x64, dtype = _as_float(x)
    n, c = x64.shape[:2]
    if c % num_groups:
        raise ValueError(f"num_channels ({c}) must be divisible by num_groups ({num_groups})")
    grouped = x64.reshape(n, num_groups, -1)  # N, G, (C/G * positions)
    mean = grouped.mean(axis=-1, keepdims=True)  # N, G, 1
    var = grouped.var(axis=-1, keepdims=True)  # N, G, 1, biased
    y = ((grouped - mean) / np.sqrt(var + eps)).reshape(x64.shape)  # N, C, *
    if gamma is not None:
        y = y * _per_channel(gamma, x64.ndim)
    if beta is not None:
        y = y + _per_channel(beta, x64.ndim)
    return y.astype(dtype)


def channel_layer_norm(x, eps=1e-5):
    """Layer norm over the channels at each position, no affine: what
    ConvNeXt's channels-first LayerNorm computes for x (N, C, *).

    x: (N, C, *) -> like x; every (example, position) pair normalized over its C
    values on its own.
    """
    x64, dtype = _as_float(x)
    mean = x64.mean(axis=1, keepdims=True)  # N, 1, *
    var = x64.var(axis=1, keepdims=True)  # N, 1, *, biased
    return ((x64 - mean) / np.sqrt(var + eps)).astype(dtype)


# How each convention weighs a new batch statistic, and which batch variance
# it averages: PyTorch's momentum is the weight of the new value and its
# running_var follows the unbiased variance; CS231n's assignment code (like
# Keras's documented formula) gives momentum to the old value, and CS231n
# averages the biased variance.
CONVENTIONS = {
    "pytorch": {"weight_on_new": lambda m: m, "unbiased": True},
    "cs231n": {"weight_on_new": lambda m: 1 - m, "unbiased": False},
}


def batch_norm_train(x, gamma, beta, running_mean, running_var, momentum,
                     convention="pytorch", eps=1e-5):
    """One training step of batch norm under either momentum convention.

    x: (N, C) or (N, C, L); gamma, beta, running_mean, running_var: (C,)
    -> (y like x, new_running_mean (C,), new_running_var (C,))

    y is the same under both conventions (batch mean, biased batch variance).
    pytorch: running = (1 - momentum) * running + momentum * batch, with the
    unbiased batch variance (n / (n - 1), n = N * L values per channel).
    cs231n: running = momentum * running + (1 - momentum) * batch, with the
    biased batch variance. One value per channel raises ValueError.
    """
    rule = CONVENTIONS[convention]
    x64, dtype = _as_float(x)
    if x64.ndim not in (2, 3):
        raise ValueError(f"expected a 2-D or 3-D input, got shape {x64.shape}")
    n = x64.size // x64.shape[1]  # values per channel
    if n == 1:
        raise ValueError("Expected more than 1 value per channel when training")
    axes = (0,) if x64.ndim == 2 else (0, 2)
    mean, var = x64.mean(axis=axes), x64.var(axis=axes)  # C, C (biased)
    batch_var = var * n / (n - 1) if rule["unbiased"] else var  # C
    new = rule["weight_on_new"](momentum)
    new_mean = (1 - new) * np.asarray(running_mean, np.float64) + new * mean  # C
    new_var = (1 - new) * np.asarray(running_var, np.float64) + new * batch_var  # C
    x_hat = (x64 - _per_channel(mean, x64.ndim)) / np.sqrt(_per_channel(var, x64.ndim) + eps)
    y = x_hat * _per_channel(gamma, x64.ndim) + _per_channel(beta, x64.ndim)
    return y.astype(dtype), new_mean.astype(dtype), new_var.astype(dtype)


def spatial_batch_norm_forward(x, gamma, beta, eps=1e-5):
    """Training-mode batch norm of images: each channel over (N, H, W).

    x: (N, C, H, W); gamma, beta: (C,) -> y: (N, C, H, W)

    One mean and one biased variance per channel, over every image and every
    position, as F.batch_norm(x, None, None, gamma, beta, training=True).
    """
    x64, dtype = _as_float(x)
    if x64.ndim != 4:
        raise ValueError(f"expected x of shape (N, C, H, W), got {x64.shape}")
    mean = x64.mean(axis=(0, 2, 3), keepdims=True)  # 1,C,1,1
    var = x64.var(axis=(0, 2, 3), keepdims=True)  # 1,C,1,1 (biased)
    x_hat = (x64 - mean) / np.sqrt(var + eps)  # N,C,H,W
    y = x_hat * _per_channel(gamma, 4) + _per_channel(beta, 4)  # N,C,H,W
    return y.astype(dtype)


def batch_norm_eval(x, gamma, beta, running_mean, running_var, eps=1e-5):
    """Eval-mode batch norm: each channel normalized with its running statistics.

    x: (N, C, *); gamma, beta, running_mean, running_var: (C,) -> y like x

    As F.batch_norm(x, running_mean, running_var, gamma, beta, training=False):
    no statistic comes from the batch, so any N works (one example too), and
    the running statistics are read, never changed.
    """
    x64, dtype = _as_float(x)
    if x64.ndim < 2:
        raise ValueError(f"expected x of shape (N, C, *), got {x64.shape}")
    mean = _per_channel(running_mean, x64.ndim)  # C, 1, ...
    var = _per_channel(running_var, x64.ndim)  # C, 1, ...
    x_hat = (x64 - mean) / np.sqrt(var + eps)  # N, C, *
    y = x_hat * _per_channel(gamma, x64.ndim) + _per_channel(beta, x64.ndim)
    return y.astype(dtype)


def fold_batch_norm(weight, bias, gamma, beta, running_mean, running_var, eps=1e-5):
    """A Linear layer followed by eval-mode batch norm, as one Linear layer.

    weight: (C, D) in nn.Linear's layout (row c makes channel c); bias, gamma,
    beta, running_mean, running_var: (C,) -> (folded_weight (C, D), folded_bias (C,))
    with x @ folded_weight.T + folded_bias equal to batch_norm_eval(x @ weight.T
    + bias, gamma, beta, running_mean, running_var, eps) for every x.
    """
    w64, dtype = _as_float(weight)
    scale = np.asarray(gamma, np.float64) / np.sqrt(np.asarray(running_var, np.float64) + eps)
    folded_weight = w64 * scale[:, None]  # C, D: row c scaled by channel c's factor
    folded_bias = ((np.asarray(bias, np.float64) - np.asarray(running_mean, np.float64))
                   * scale + np.asarray(beta, np.float64))
    return folded_weight.astype(dtype), folded_bias.astype(dtype)


def fold_conv_batch_norm(weight, bias, gamma, beta, running_mean, running_var, eps=1e-5):
    """A Conv2d followed by eval-mode BatchNorm2d, as one Conv2d.

    weight: (C_out, C_in, kh, kw) in nn.Conv2d's layout (filter c makes channel c);
    bias, gamma, beta, running_mean, running_var: (C_out,) -> (folded_weight
    (C_out, C_in, kh, kw), folded_bias (C_out,)): each output channel's filter is a
    row of a Linear layer over the patch, so the Linear fold applies filter by filter.
    """
    w = np.asarray(weight)
    rows, folded_bias = fold_batch_norm(w.reshape(w.shape[0], -1), bias, gamma, beta,
                                        running_mean, running_var, eps)  # C_out, C_in*kh*kw
    return rows.reshape(w.shape), folded_bias
