"""Unit 01, the recipe: token statistics and layer norm in numpy.

A *token* is one row of d features; every function here works on the last
axis and accepts any leading batch shape. Arithmetic is done in float64 and
the result is returned in the input's floating dtype (float64 for integer
input), so the reference is as exact as the input allows.
"""

import numpy as np


def _as_float(x):
    """Return (x as float64, dtype to give results back in)."""
    x = np.asarray(x)
    out_dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64
    return x.astype(np.float64), out_dtype


def token_mean(x):
    """Mean of each token's features.

    x: (..., d) -> (...)
    """
    x64, dtype = _as_float(x)
    return x64.mean(axis=-1).astype(dtype)  # ...


def token_var(x):
    """Biased variance of each token's features (divides by d, not d - 1).

    x: (..., d) -> (...)
    """
    x64, dtype = _as_float(x)
    mu = x64.mean(axis=-1, keepdims=True)  # ..., 1
    return ((x64 - mu) ** 2).mean(axis=-1).astype(dtype)  # ...


def layer_norm(x, gamma=None, beta=None, eps=1e-5):
    """Layer norm over the last axis: y = gamma * (x - mu) / sqrt(var + eps) + beta.

    x: (..., d); gamma, beta: (d,) or None (meaning 1 and 0) -> y: (..., d)
    """
    x64, dtype = _as_float(x)
    mu = x64.mean(axis=-1, keepdims=True)  # ..., 1
    var = ((x64 - mu) ** 2).mean(axis=-1, keepdims=True)  # ..., 1
    x_hat = (x64 - mu) / np.sqrt(var + eps)  # ..., d
    if gamma is not None:
        x_hat = x_hat * np.asarray(gamma, dtype=np.float64)  # ..., d
    if beta is not None:
        x_hat = x_hat + np.asarray(beta, dtype=np.float64)  # ..., d
    return x_hat.astype(dtype)


def shortcut_var(x):
    """The one-pass textbook shortcut mean(x^2) - mean(x)^2, in x's own dtype.

    Equal to token_var in exact arithmetic; in floating point it cancels when
    a token's mean is large next to its spread. The checks use it to recognize
    an answer that took the shortcut.

    x: (..., d) floating -> (...)
    """
    x = np.asarray(x)
    return (x * x).mean(axis=-1) - x.mean(axis=-1) ** 2  # ...


def chunk_stats(x):
    """Count, mean and M2 (sum of squared deviations) of each token's features,
    computed two-pass inside the chunk, in float64.

    x: (..., c) -> (n, mean, m2): n an int, mean and m2 (...)
    """
    x64, _ = _as_float(x)
    n = x64.shape[-1]
    mean = x64.mean(axis=-1)  # ...
    m2 = ((x64 - mean[..., None]) ** 2).sum(axis=-1)  # ...
    return n, mean, m2


def merge_stats(a, b):
    """Chan, Golub and LeVeque's merge of two chunks' statistics.

    a, b: (n, mean, m2) with n a count and mean, m2 (...) -> (n, mean, m2) of
    the two chunks taken together. Exact in exact arithmetic, and it never
    subtracts two sums of squares, so it keeps its accuracy far from zero.
    """
    n_a, mean_a, m2_a = a
    n_b, mean_b, m2_b = b
    n = n_a + n_b
    delta = np.asarray(mean_b, dtype=np.float64) - mean_a  # ...
    mean = mean_a + delta * (n_b / n)  # ...
    m2 = m2_a + m2_b + delta**2 * (n_a * n_b / n)  # ...
    return n, mean, m2


def chunked_var(x, chunk):
    """Biased variance of each token, read `chunk` features at a time: each
    chunk's (count, mean, M2) is merged into a running one (the last chunk may
    be shorter). What a kernel that sees each row once, in tiles, computes.

    x: (..., d), chunk >= 1 -> (...)
    """
    x64, dtype = _as_float(x)
    d = x64.shape[-1]
    stats = chunk_stats(x64[..., :chunk])
    for start in range(chunk, d, chunk):
        stats = merge_stats(stats, chunk_stats(x64[..., start:start + chunk]))
    n, _, m2 = stats
    return (m2 / n).astype(dtype)  # ...


def naive_chunked_var(x, chunk):
    """The naive one-pass variance: running sums of x and x**2 over the chunks,
    then sum(x**2) / d - mean**2, in x's own dtype. Equal to chunked_var in exact
    arithmetic; the checks use it to recognize an answer that took it.

    x: (..., d) floating -> (...)
    """
    x = np.asarray(x)
    total = np.zeros(x.shape[:-1], x.dtype)  # ...
    squares = np.zeros(x.shape[:-1], x.dtype)  # ...
    for start in range(0, x.shape[-1], chunk):
        part = x[..., start:start + chunk]  # ..., c
        total = total + part.sum(axis=-1)
        squares = squares + (part * part).sum(axis=-1)
    mean = total / x.shape[-1]
    return squares / x.shape[-1] - mean * mean  # ...
