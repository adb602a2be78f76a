"""Unit 05, exercise 11: QK-norm. The reference against torch's own attention,
the claim the assignment's experiment reads (three seeds), and the two checks:
they pass right answers written other ways and name the typical slips."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from normref import blocks
from normref.checks import CheckFailed, check_attention_logits, check_qk_norm_attention


def _random(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_((p.dim() == 1) + 0.4 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def _sdpa_reference(attn, x):
    """QK-norm written with F.layer_norm and torch's scaled_dot_product_attention."""
    B, T, d = x.shape
    h = attn.n_heads
    q, k, v = (t.reshape(B, T, h, d // h).transpose(1, 2) for t in attn.qkv(x).chunk(3, -1))
    q = F.layer_norm(q, (d // h,), attn.ln_q.weight, attn.ln_q.bias, 1e-5)
    k = F.layer_norm(k, (d // h,), attn.ln_k.weight, attn.ln_k.bias, 1e-5)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return attn.proj(out.transpose(1, 2).reshape(B, T, d))


@pytest.mark.parametrize("d, heads, seq_len", [(8, 2, 5), (12, 3, 7), (8, 1, 1)])
def test_qk_norm_attention_matches_torch_sdpa(d, heads, seq_len):
    attn = _random(blocks.QKNormAttention(d, heads).double(), seed=d + heads)
    x = 2.0 + 3.0 * torch.randn(2, seq_len, d, dtype=torch.float64)
    torch.testing.assert_close(attn(x), _sdpa_reference(attn, x))


def test_attention_logits_bounded_by_the_norms():
    """With unit gains and zero biases a normalized q and k have norm sqrt(d_head),
    so no logit exceeds sqrt(d_head), however large the tokens."""
    attn = blocks.QKNormAttention(16, 4).double()
    x = 100.0 * torch.randn(3, 6, 16, dtype=torch.float64)
    with torch.no_grad():
        logits = blocks.attention_logits(attn, x)
    finite = logits[torch.isfinite(logits)]
    assert finite.abs().max() <= math.sqrt(4) + 1e-9
    assert torch.isneginf(logits[..., 0, 1:]).all()


def test_qk_norm_keeps_the_logits_small_at_every_seed():
    """The assignment's reading: after 40 steps at lr 1e-2, the plain model's
    largest logit has grown several times more than the QK-norm model's, and
    both learn the copy task (far below chance, ln 15 = 2.708); at each of the
    three seeds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for seed in blocks.QK["seeds"]:
            largest, losses = {}, {}
            for qk in (False, True):
                model = blocks.qk_model(qk, blocks.QK["n_layers"], seed)
                tokens = blocks.experiment_batch(seed)[0]
                losses[qk] = blocks.final_loss(model, blocks.QK["lr"], 0, seed,
                                               steps=blocks.QK["steps"])
                largest[qk] = blocks.largest_logit(model, tokens)
            assert largest[False] > 20 and largest[True] < 10, (seed, largest)
            assert max(losses.values()) < 1.5, (seed, losses)
    finally:
        torch.set_num_threads(before)


class QKNormWithEinsum(nn.Module):
    """The same attention another way: einsum, a hand-written layer norm."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln_q = nn.LayerNorm(d_model // n_heads)
        self.ln_k = nn.LayerNorm(d_model // n_heads)

    @staticmethod
    def _norm(ln, t):
        mean = t.mean(-1, keepdim=True)
        var = (t - mean).pow(2).mean(-1, keepdim=True)
        return (t - mean) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias

    def forward(self, x):
        B, T, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(x).reshape(B, T, 3, h, d // h).unbind(2)
        q, k = self._norm(self.ln_q, q), self._norm(self.ln_k, k)
        s = torch.einsum("bqhe,bkhe->bhqk", q, k) * (d // h) ** -0.5
        s = s + torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
        return self.proj(torch.einsum("bhqk,bkhe->bqhe", s.softmax(-1), v).reshape(B, T, d))


def logits_in_numpy(attn, x):
    """attention_logits in numpy, a float64 array, masked with the dtype's min."""
    w = attn.qkv.weight.detach().numpy()
    b = attn.qkv.bias.detach().numpy()
    xs = x.numpy()
    B, T, d = xs.shape
    h = attn.n_heads
    e = d // h
    qkv = xs @ w.T + b
    q = qkv[..., :d].reshape(B, T, h, e).transpose(0, 2, 1, 3)
    k = qkv[..., d:2 * d].reshape(B, T, h, e).transpose(0, 2, 1, 3)
    if hasattr(attn, "ln_q"):
        for name in ("ln_q", "ln_k"):
            ln = getattr(attn, name)
            t = q if name == "ln_q" else k
            t = (t - t.mean(-1, keepdims=True)) / np.sqrt(t.var(-1, keepdims=True) + ln.eps)
            t = t * ln.weight.detach().numpy() + ln.bias.detach().numpy()
            q, k = (t, k) if name == "ln_q" else (q, t)
    s = np.einsum("bhqe,bhke->bhqk", q, k) / math.sqrt(e)
    s[..., np.triu(np.ones((T, T), dtype=bool), 1)] = np.finfo(np.float64).min
    return s


def test_checks_pass_the_reference_and_other_ways():
    check_qk_norm_attention(blocks.QKNormAttention)
    check_qk_norm_attention(QKNormWithEinsum)
    check_attention_logits(blocks.attention_logits)
    check_attention_logits(logits_in_numpy)


def _fails(check, subject, hint):
    with pytest.raises(CheckFailed) as failure:
        check(subject)
    assert hint in str(failure.value), str(failure.value)


class NoNorms(blocks.QKNormAttention):
    def forward(self, x):
        return blocks.CausalSelfAttention.forward(self, x)


class Swapped(blocks.QKNormAttention):
    def forward(self, x):
        self.ln_q, self.ln_k = self.ln_k, self.ln_q
        try:
            return super().forward(x)
        finally:
            self.ln_q, self.ln_k = self.ln_k, self.ln_q


class NormOverModel(blocks.QKNormAttention):
    def __init__(self, d_model, n_heads):
        super().__init__(d_model, n_heads)
        self.ln_q, self.ln_k = nn.LayerNorm(d_model), nn.LayerNorm(d_model)


class NoScale(blocks.QKNormAttention):
    def forward(self, x):
        B, T, d = x.shape
        h = self.n_heads
        q, k, v = (t.view(B, T, h, d // h).transpose(1, 2) for t in self.qkv(x).split(d, -1))
        q, k = self.ln_q(q), self.ln_k(k)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        w = (q @ k.transpose(-2, -1)).masked_fill(mask, float("-inf")).softmax(-1)
        return self.proj((w @ v).transpose(1, 2).reshape(B, T, d))


def test_qk_norm_check_names_the_mistake():
    _fails(check_qk_norm_attention, NoNorms, "neither is normalized")
    _fails(check_qk_norm_attention, Swapped, "not the other way round")
    _fails(check_qk_norm_attention, NoScale, "sqrt(d_head)")
    _fails(check_qk_norm_attention, NormOverModel, "the contract gives it shape (4,)")
    _fails(check_qk_norm_attention, blocks.CausalSelfAttention, "missing ['ln_k.bias'")


def logits_unmasked(attn, x):
    B, T, d = x.shape
    h = attn.n_heads
    q, k, _ = attn.qkv(x).split(d, -1)
    q, k = (t.view(B, T, h, d // h).transpose(1, 2) for t in (q, k))
    if hasattr(attn, "ln_q"):
        q, k = attn.ln_q(q), attn.ln_k(k)
    return q @ k.transpose(-2, -1) / math.sqrt(d // h)


def logits_ignore_norms(attn, x):
    B, T, d = x.shape
    h = attn.n_heads
    q, k, _ = attn.qkv(x).split(d, -1)
    q, k = (t.view(B, T, h, d // h).transpose(1, 2) for t in (q, k))
    s = q @ k.transpose(-2, -1) / math.sqrt(d // h)
    return s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))


def logits_softmaxed(attn, x):
    return blocks.attention_logits(attn, x).softmax(-1)


def logits_masked_with_zero(attn, x):
    logits = blocks.attention_logits(attn, x)
    return torch.where(torch.isinf(logits), torch.zeros_like(logits), logits)


def test_logits_check_names_the_mistake():
    _fails(check_attention_logits, logits_unmasked, "the causal mask")
    _fails(check_attention_logits, logits_ignore_norms, "apply them to each head's queries")
    _fails(check_attention_logits, logits_softmaxed, "not the softmax's output")
    _fails(check_attention_logits, logits_masked_with_zero, "must be -inf")
    _fails(check_attention_logits, lambda attn, x: None, "not an array")
