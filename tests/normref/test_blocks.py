"""Unit 05: Pre-LN, Post-LN, sandwich-LN and DeepNorm blocks, TinyLM, gradient
norms, adaLN, and the assignment's checks.
"""

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_blocks_verdicts import SandwichDoubled
from torch import nn

from normref import blocks
from normref.checks import (
    CheckFailed,
    blocks_judges,
    blocks_probes,
    check_deepnorm_block,
    check_deepnorm_scale,
    check_make_model,
    check_sandwich_ln_block,
)
from normref.checks.blocks_judges import _judge_make_model
from normref.checks.tolerances import mismatch


@pytest.fixture
def one_thread():
    """Tiny models run faster on one thread than on two that share cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _randomize(module, seed):
    """Random weights everywhere (LN gains and all biases too), so no term hides."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=generator, dtype=p.dtype) + (p.dim() == 1))
    return module


def _torch_layer(block, norm_first):
    """torch's own encoder layer, given the block's weights, as an independent reference."""
    d = block.ln1.normalized_shape[0]
    layer = nn.TransformerEncoderLayer(
        d, block.attn.n_heads, block.mlp.fc.out_features, dropout=0.0, activation="gelu",
        batch_first=True, norm_first=norm_first, dtype=torch.float64)
    with torch.no_grad():
        layer.self_attn.in_proj_weight.copy_(block.attn.qkv.weight)
        layer.self_attn.in_proj_bias.copy_(block.attn.qkv.bias)
        layer.self_attn.out_proj.weight.copy_(block.attn.proj.weight)
        layer.self_attn.out_proj.bias.copy_(block.attn.proj.bias)
        for ours, theirs in ((block.mlp.fc, layer.linear1), (block.mlp.proj, layer.linear2),
                             (block.ln1, layer.norm1), (block.ln2, layer.norm2)):
            theirs.weight.copy_(ours.weight)
            theirs.bias.copy_(ours.bias)
    return layer.eval()


SHAPES = [(1, 1, 8, 1, 16), (2, 5, 8, 2, 32), (3, 7, 16, 4, 24), (2, 9, 12, 3, 48)]


@pytest.mark.parametrize("position", ["pre", "post"])
@pytest.mark.parametrize("batch,seq_len,d,heads,d_ff", SHAPES)
def test_blocks_match_torch_encoder_layer(position, batch, seq_len, d, heads, d_ff):
    block = _randomize(blocks.BLOCK_CLASSES[position](d, heads, d_ff).double().eval(), seed=d)
    layer = _torch_layer(block, norm_first=position == "pre")
    x = torch.randn(batch, seq_len, d, dtype=torch.float64) * 2 + 1
    mask = nn.Transformer.generate_square_subsequent_mask(seq_len, dtype=torch.float64)
    with torch.no_grad():
        expected = layer(x, src_mask=mask, is_causal=True)
        torch.testing.assert_close(block(x), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("position", ["pre", "post"])
def test_blocks_match_hand_composition(position):
    """The two recipes written out with F.layer_norm and F.scaled_dot_product_attention."""
    d, heads, d_ff = 12, 3, 20
    block = _randomize(blocks.BLOCK_CLASSES[position](d, heads, d_ff).double(), seed=7)
    x = torch.randn(2, 6, d, dtype=torch.float64)

    def ln(name, h):
        m = getattr(block, name)
        return F.layer_norm(h, (d,), m.weight, m.bias, 1e-5)

    def attn(h):
        q, k, v = F.linear(h, block.attn.qkv.weight, block.attn.qkv.bias).chunk(3, dim=-1)
        split = [t.unflatten(-1, (heads, d // heads)).transpose(1, 2) for t in (q, k, v)]
        mixed = F.scaled_dot_product_attention(*split, is_causal=True).transpose(1, 2).flatten(2)
        return F.linear(mixed, block.attn.proj.weight, block.attn.proj.bias)

    def mlp(h):
        hidden = F.gelu(F.linear(h, block.mlp.fc.weight, block.mlp.fc.bias))
        return F.linear(hidden, block.mlp.proj.weight, block.mlp.proj.bias)

    with torch.no_grad():
        if position == "pre":
            h = x + attn(ln("ln1", x))
            expected = h + mlp(ln("ln2", h))
        else:
            h = ln("ln1", x + attn(x))
            expected = ln("ln2", h + mlp(h))
        torch.testing.assert_close(block(x), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("position", ["pre", "post"])
def test_attention_is_causal(position):
    block = _randomize(blocks.BLOCK_CLASSES[position](8, 2, 16), seed=1)
    x = torch.randn(1, 6, 8)
    changed = x.clone()
    changed[:, 4:] += 10.0
    with torch.no_grad():
        torch.testing.assert_close(block(x)[:, :4], block(changed)[:, :4])
        assert not torch.allclose(block(x)[:, 4:], block(changed)[:, 4:])


def test_pre_ln_residual_path_carries_the_unnormalized_input():
    """With silent sublayers a Pre-LN block passes x through untouched, offset and
    scale included; a Post-LN block normalizes it."""
    x = 3.0 + 5.0 * torch.randn(2, 4, 8)
    for position, expected in (("pre", x), ("post", F.layer_norm(x, (8,)))):
        block = blocks.BLOCK_CLASSES[position](8, 2, 32)
        with torch.no_grad():
            for sub in (block.attn.proj, block.mlp.proj):
                sub.weight.zero_()
                sub.bias.zero_()
            torch.testing.assert_close(block(x), expected, rtol=1e-5, atol=1e-5)


def test_block_parameters_follow_the_contract():
    for cls in (blocks.PreLNBlock, blocks.PostLNBlock):
        shapes = {name: tuple(p.shape) for name, p in cls(16, 4, 40).named_parameters()}
        sizes = {"d": 16, "3d": 48, "f": 40}
        assert shapes == {name: tuple(sizes[s] for s in shape)
                          for name, shape in blocks.BLOCK_PARAMETER_SHAPES.items()}
    assert blocks.PreLNBlock(16, 4).mlp.fc.out_features == 64  # d_ff defaults to 4 d
    with pytest.raises(ValueError, match="divisible"):
        blocks.PreLNBlock(10, 3, 8)


def test_tiny_lm_has_a_final_ln_only_when_pre_ln():
    pre = blocks.TinyLM(16, 32, 3, 4, "pre", max_len=12)
    post = blocks.TinyLM(16, 32, 3, 4, "post", max_len=12)
    assert isinstance(pre.ln_f, nn.LayerNorm) and isinstance(post.ln_f, nn.Identity)
    assert all(isinstance(b, blocks.PreLNBlock) for b in pre.blocks)
    assert all(isinstance(b, blocks.PostLNBlock) for b in post.blocks)
    tokens = torch.randint(0, 16, (3, 12))
    assert pre(tokens).shape == post(tokens).shape == (3, 12, 16)
    with pytest.raises(ValueError, match="norm_position"):
        blocks.TinyLM(16, 32, 3, 4, "middle")


def test_copy_task_batch():
    inputs, targets = blocks.copy_task_batch(5, 4, 10, seed=3)
    assert inputs.shape == targets.shape == (5, 8)
    assert torch.all(inputs[:, 4] == 0), "the separator comes after the string"
    assert torch.all(targets[:, :4] == blocks.IGNORE)
    torch.testing.assert_close(targets[:, 4:], inputs[:, :4])  # the copy of the string
    assert inputs[:, :4].min() >= 1 and inputs.max() < 10
    again = blocks.copy_task_batch(5, 4, 10, seed=3)
    assert torch.equal(inputs, again[0]), "the same seed gives the same batch"


def test_grad_norms_match_backward_and_leave_grads_alone():
    torch.manual_seed(0)
    model = blocks.TinyLM(16, 32, 4, 4, "post", max_len=12)
    batch = blocks.copy_task_batch(8, 6, 16, seed=1)
    norms = blocks.grad_norms_by_layer(model, batch)
    assert all(p.grad is None for p in model.parameters())
    blocks.lm_loss(model, batch).backward()
    expected = torch.stack([b.mlp.proj.weight.grad.norm() for b in model.blocks]).double()
    torch.testing.assert_close(norms, expected)


def test_lm_loss_at_init_is_near_chance():
    torch.manual_seed(0)
    model = blocks.TinyLM(16, 64, 2, 4, "pre", max_len=16)
    loss = blocks.lm_loss(model, blocks.copy_task_batch(64, 8, 16, seed=0)).item()
    assert abs(loss - math.log(15)) < 1.0  # chance over the 15 symbols is ln 15 = 2.71


def test_post_over_pre_ratio_grows_with_depth(one_thread):
    """The unit's experiment on the shipped config (d = 64, Xavier init):
    inequalities only. The ratio grows with depth and passes 1.5 by L = 12;
    Pre-LN's last-layer gradient shrinks with depth (Xiong et al.'s 1/sqrt(L)
    trend), Post-LN's does not."""
    depths = (2, 6, 12, 24)
    last = {}
    for depth in depths:
        profiles = blocks.layer_profiles(64, depth, seeds=range(8))
        last[depth] = {k: v[:, -1] for k, v in profiles.items()}
    ratios = [float((last[d]["post"] / last[d]["pre"]).median()) for d in depths]
    assert all(a < b for a, b in zip(ratios, ratios[1:])), ratios
    assert ratios[2] > 1.5, ratios
    assert last[24]["pre"].median() < 0.8 * last[2]["pre"].median()
    assert last[24]["post"].median() > last[2]["post"].median()


def test_warmup_rescues_post_ln_at_a_large_learning_rate(one_thread):
    """The warm-up claim on the copy task (4 blocks, lr 1e-2): Post-LN without
    warm-up stays near chance; with warm-up, and Pre-LN without it, it learns."""
    def final(position, warmup):
        return np.mean(blocks.train_copy_task(position, 4, 1e-2, warmup, 120, seed=0)[-10:])

    assert final("post", 0) > 2.0
    assert final("post", 40) < 0.5
    assert final("pre", 0) < 0.5


def test_ada_ln_starts_as_layer_norm_and_scales_by_one_plus_gamma():
    layer = blocks.AdaLN(8, 5)
    x, cond = torch.randn(3, 4, 8), torch.randn(3, 5)
    torch.testing.assert_close(layer(x, cond), F.layer_norm(x, (8,)))
    _randomize(layer, seed=2)
    gamma, beta = layer.to_scale_shift(cond).chunk(2, dim=-1)
    expected = F.layer_norm(x, (8,)) * (1 + gamma[:, None]) + beta[:, None]
    torch.testing.assert_close(layer(x, cond), expected)
    assert [n for n, _ in layer.named_parameters()] == ["to_scale_shift.weight",
                                                         "to_scale_shift.bias"]


def test_timestep_embedding():
    emb = blocks.timestep_embedding(torch.tensor([0, 10, 500]), 16)
    assert emb.shape == (3, 16)
    torch.testing.assert_close(emb[0], torch.cat([torch.ones(8), torch.zeros(8)]))
    assert torch.all(emb.abs() <= 1)


# --- sandwich-LN and DeepNorm against torch ---

class ManualAttention(nn.Module):
    """Attention written another way: einsum and an additive mask."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        T, d = x.shape[1], x.shape[2]
        q, k, v = (t.unflatten(-1, (self.heads, -1)) for t in self.qkv(x).chunk(3, -1))
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) * (d // self.heads) ** -0.5
        mask = torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
        out = torch.einsum("bhqk,bkhe->bqhe", (scores + mask).softmax(-1), v)
        return self.proj(out.flatten(2))


class Sublayers(nn.Module):
    def __init__(self, d_model, n_heads, d_ff):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = ManualAttention(d_model, n_heads)
        self.mlp = nn.Module()
        self.mlp.fc, self.mlp.proj = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def ff(self, x):
        return self.mlp.proj(F.gelu(self.mlp.fc(x)))


class OtherPre(Sublayers):
    def forward(self, x):
        for norm, sublayer in ((self.ln1, self.attn), (self.ln2, self.ff)):
            x = x + sublayer(norm(x))
        return x


class OtherPost(Sublayers):
    def forward(self, x):
        for norm, sublayer in ((self.ln1, self.attn), (self.ln2, self.ff)):
            x = norm(x + sublayer(x))
        return x




def _hand_ln(block, name, h):
    m = getattr(block, name)
    return F.layer_norm(h, h.shape[-1:], m.weight, m.bias, 1e-5)


def _hand_attn(block, h):
    """Attention from the block's weights through F.scaled_dot_product_attention."""
    d, heads = h.shape[-1], block.attn.n_heads
    q, k, v = F.linear(h, block.attn.qkv.weight, block.attn.qkv.bias).chunk(3, dim=-1)
    split = [t.unflatten(-1, (heads, d // heads)).transpose(1, 2) for t in (q, k, v)]
    mixed = F.scaled_dot_product_attention(*split, is_causal=True).transpose(1, 2).flatten(2)
    return F.linear(mixed, block.attn.proj.weight, block.attn.proj.bias)


def _hand_mlp(block, h):
    hidden = F.gelu(F.linear(h, block.mlp.fc.weight, block.mlp.fc.bias))
    return F.linear(hidden, block.mlp.proj.weight, block.mlp.proj.bias)


def test_reference_blocks_equal_blocks_written_another_way():
    for ours, other in ((blocks.PreLNBlock, OtherPre), (blocks.PostLNBlock, OtherPost)):
        block = _randomize(ours(12, 3, 20).double(), seed=4)
        twin = other(12, 3, 20).double()
        twin.load_state_dict(block.state_dict())
        x = torch.randn(2, 5, 12, dtype=torch.float64)
        with torch.no_grad():
            torch.testing.assert_close(block(x), twin(x), rtol=1e-10, atol=1e-10)


def test_sandwich_block_matches_hand_composition():
    block = _randomize(blocks.SandwichLNBlock(12, 3, 20).double(), seed=5)
    x = 4 + torch.randn(2, 6, 12, dtype=torch.float64)
    with torch.no_grad():
        h = x + _hand_ln(block, "ln1_out", _hand_attn(block, _hand_ln(block, "ln1", x)))
        expected = h + _hand_ln(block, "ln2_out", _hand_mlp(block, _hand_ln(block, "ln2", h)))
        torch.testing.assert_close(block(x), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("alpha", [1.0, 1.7, 3.0])
def test_deepnorm_block_matches_hand_composition(alpha):
    block = _randomize(blocks.DeepNormBlock(12, 3, 20, alpha=alpha).double(), seed=6)
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    with torch.no_grad():
        h = _hand_ln(block, "ln1", alpha * x + _hand_attn(block, x))
        expected = _hand_ln(block, "ln2", alpha * h + _hand_mlp(block, h))
        torch.testing.assert_close(block(x), expected, rtol=1e-10, atol=1e-10)


def test_deepnorm_at_alpha_one_is_torch_post_norm_layer():
    block = _randomize(blocks.DeepNormBlock(16, 4, 24, alpha=1.0).double().eval(), seed=7)
    layer = _torch_layer(block, norm_first=False)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    mask = nn.Transformer.generate_square_subsequent_mask(7, dtype=torch.float64)
    with torch.no_grad():
        expected = layer(x, src_mask=mask, is_causal=True)
        torch.testing.assert_close(block(x), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", ["sandwich", "deepnorm"])
def test_new_blocks_pass_a_gradient_check(kind):
    """Centred differences against autograd, in float64, for x and the weights."""
    extra = {"alpha": 1.8} if kind == "deepnorm" else {}
    block = _randomize(blocks.BLOCK_CLASSES[kind](8, 2, 12, **extra).double(), seed=8)
    x = torch.randn(1, 4, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(block, (x,), eps=1e-6, atol=1e-6)
    weight = block.mlp.fc.weight

    def as_function_of_weight(w):
        with torch.no_grad():
            weight.copy_(w)
        return block(x.detach())

    y = block(x.detach())
    dy = torch.randn_like(y)
    (analytic,) = torch.autograd.grad((y * dy).sum(), weight)
    base = weight.detach().clone()
    i, j, h = 3, 5, 1e-6
    plus, minus = base.clone(), base.clone()
    plus[i, j] += h
    minus[i, j] -= h
    numeric = ((as_function_of_weight(plus) - as_function_of_weight(minus)) * dy).sum() / (2 * h)
    assert abs(numeric.item() - analytic[i, j].item()) < 1e-6


def test_sandwich_bounds_what_each_sublayer_adds():
    """With unit output gains and zero biases each sublayer adds a token of
    mean 0 and spread 1, whatever the size of its input."""
    block = blocks.SandwichLNBlock(16, 4, 32)
    with torch.no_grad():
        for sub in (block.mlp.proj, block.ln2_out):
            sub.weight.zero_()
            sub.bias.zero_()
        x = 100 * torch.randn(2, 5, 16)
        added = block(x) - x
    torch.testing.assert_close(added.mean(-1), torch.zeros(2, 5), atol=1e-3, rtol=0)
    torch.testing.assert_close(added.std(-1, unbiased=False), torch.ones(2, 5), atol=1e-2,
                               rtol=0)


def test_deepnorm_constants_follow_deepnet_table_1():
    for n in (1, 6, 12, 100):
        alpha, beta = blocks.deepnorm_constants(n)
        assert math.isclose(alpha**4, 2 * n) and math.isclose(beta**-4, 8 * n)


def test_deepnorm_scale_scales_values_outputs_and_mlp_only():
    block = _randomize(blocks.PostLNBlock(8, 2, 16), seed=9)
    before = {n: p.detach().clone() for n, p in block.named_parameters()}
    assert blocks.deepnorm_scale_(block, 0.25) is block
    after = dict(block.named_parameters())
    for name, old in before.items():
        expected = old.clone()
        if name == "attn.qkv.weight":
            expected[16:] *= 0.25  # the value rows only
        elif name in ("attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight"):
            expected *= 0.25
        torch.testing.assert_close(after[name], expected, rtol=0, atol=0, msg=name)


def test_tiny_lm_kinds_final_ln_and_deepnorm_init():
    for kind, final in blocks.FINAL_LN.items():
        model = blocks.TinyLM(16, 32, 4, 4, kind, max_len=12)
        assert isinstance(model.ln_f, nn.LayerNorm if final else nn.Identity)
        assert all(type(b) is blocks.BLOCK_CLASSES[kind] for b in model.blocks)
    torch.manual_seed(0)
    deep = blocks.TinyLM(16, 32, 8, 4, "deepnorm", max_len=12)
    alpha, beta = blocks.deepnorm_constants(8)
    assert deep.blocks[0].alpha == alpha
    torch.manual_seed(0)
    post = blocks.TinyLM(16, 32, 8, 4, "post", max_len=12)
    torch.testing.assert_close(deep.blocks[3].mlp.fc.weight, beta * post.blocks[3].mlp.fc.weight)
    torch.testing.assert_close(deep.blocks[3].attn.qkv.weight[:64],
                               post.blocks[3].attn.qkv.weight[:64])


def test_experiment_profiles_deepnorm_flat_sandwich_falls(one_thread):
    """The assignment's finding, on other seeds too: DeepNorm's profile is the
    flattest, sandwich-LN's falls the most toward the output."""
    for seeds in ((0, 1, 2), (3, 4, 5)):
        profiles = {kind: blocks.experiment_profile(kind, 8, seeds) for kind in blocks.FINAL_LN}
        spread = {k: float(p.max() / p.min()) for k, p in profiles.items()}
        fall = {k: float(p[-1] / p[0]) for k, p in profiles.items()}
        assert min(spread, key=spread.get) == "deepnorm", spread
        assert min(fall, key=fall.get) == "sandwich", fall
        assert spread["deepnorm"] < 1.2


# --- the checks pass the reference and reference-equivalent code ---

class SandwichWrittenAnotherWay(Sublayers):
    """Einsum attention, LNs called through F.layer_norm, a loop."""

    def __init__(self, d_model, n_heads, d_ff):
        super().__init__(d_model, n_heads, d_ff)
        self.ln1_out, self.ln2_out = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x):
        steps = ((self.ln1, self.attn, self.ln1_out), (self.ln2, self.ff, self.ln2_out))
        for norm_in, sublayer, norm_out in steps:
            out = sublayer(norm_in(x))
            x = torch.add(x, F.layer_norm(out, out.shape[-1:], norm_out.weight, norm_out.bias))
        return x


class DeepNormWrittenAnotherWay(Sublayers):
    def __init__(self, d_model, n_heads, d_ff, alpha):
        super().__init__(d_model, n_heads, d_ff)
        self.register_buffer("alpha", torch.tensor(float(alpha)))  # float32

    def forward(self, x):
        for norm, sublayer in ((self.ln1, self.attn), (self.ln2, self.ff)):
            x = norm(torch.add(sublayer(x), x, alpha=self.alpha.item()))
        return x


def scale_with_views(block, beta):
    _, _, values = block.attn.qkv.weight.data.chunk(3)
    for w in (values, block.attn.proj.weight.data, block.mlp.fc.weight.data,
              block.mlp.proj.weight.data):
        w.mul_(beta)


def make_model_another_way(kind, n_layers, seed):
    alpha, beta = blocks.deepnorm_constants(n_layers)
    model = blocks.TinyLM(16, 64, n_layers, 4, kind, d_ff=256, max_len=16)
    blocks.init_like_xiong(model, seed)
    if kind == "deepnorm":
        for block in model.blocks:
            block.alpha = alpha
            scale_with_views(block, beta)
    return model


def test_checks_pass_the_reference(one_thread):
    check_sandwich_ln_block(blocks.SandwichLNBlock)
    check_deepnorm_block(blocks.DeepNormBlock)
    check_deepnorm_scale(blocks.deepnorm_scale_)
    check_make_model(blocks.experiment_model)


def test_checks_pass_equivalent_code(one_thread):
    check_sandwich_ln_block(SandwichWrittenAnotherWay)
    check_deepnorm_block(DeepNormWrittenAnotherWay)
    check_deepnorm_scale(scale_with_views)
    check_make_model(make_model_another_way)


# --- the checks fail typical mistakes, naming them ---

def _fails(check, *subject, hint, **answers):
    with pytest.raises(CheckFailed) as failure:
        check(*subject, **answers)
    assert hint in str(failure.value), str(failure.value)


class SandwichAfterAdd(blocks.SandwichLNBlock):
    def forward(self, x):
        x = self.ln1_out(x + self.attn(self.ln1(x)))
        return self.ln2_out(x + self.mlp(self.ln2(x)))


class SandwichUnused(blocks.SandwichLNBlock):
    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class SandwichSwapped(blocks.SandwichLNBlock):
    def forward(self, x):
        x = x + self.ln2_out(self.attn(self.ln1(x)))
        return x + self.ln1_out(self.mlp(self.ln2(x)))


class SandwichDetached(blocks.SandwichLNBlock):
    def forward(self, x):
        x = x + self.ln1_out(self.attn(self.ln1(x))).detach()
        return x + self.ln2_out(self.mlp(self.ln2(x)))


class DeepNormOnSublayer(blocks.DeepNormBlock):
    def forward(self, x):
        x = self.ln1(x + self.alpha * self.attn(x))
        return self.ln2(x + self.alpha * self.mlp(x))


class DeepNormIgnoresAlpha(blocks.DeepNormBlock):
    def forward(self, x):
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class DeepNormPreOrder(blocks.DeepNormBlock):
    def forward(self, x):
        x = self.alpha * x + self.attn(self.ln1(x))
        return self.alpha * x + self.mlp(self.ln2(x))


def test_block_checks_name_the_mistake():
    _fails(check_sandwich_ln_block, SandwichAfterAdd, hint="not the sum")
    _fails(check_sandwich_ln_block, SandwichUnused, hint="change nothing")
    _fails(check_sandwich_ln_block, SandwichSwapped, hint="ln2_out to the MLP")
    _fails(check_sandwich_ln_block, SandwichDetached, hint="cuts the graph")
    _fails(check_sandwich_ln_block, blocks.PreLNBlock, hint="missing ['ln1_out.bias'")
    _fails(check_deepnorm_block, DeepNormOnSublayer, hint="multiplies the residual x")
    _fails(check_deepnorm_block, DeepNormIgnoresAlpha, hint="this is plain Post-LN")
    _fails(check_deepnorm_block, DeepNormPreOrder, hint="keeps Post-LN's order")


def _scale_rows(rows, *, biases=False, power=1):
    def scale(block, beta):
        d = block.attn.qkv.weight.shape[1]
        with torch.no_grad():
            block.attn.qkv.weight[rows(d)] *= beta**power
            for layer in (block.attn.proj, block.mlp.fc, block.mlp.proj):
                layer.weight *= beta**power
                if biases:
                    layer.bias *= beta**power

    return scale


def scale_not_in_place(block, beta):
    for layer in (block.attn.proj, block.mlp.fc, block.mlp.proj):
        layer.weight = nn.Parameter(layer.weight * beta)


def scale_forgets_fc(block, beta):
    d = block.attn.qkv.weight.shape[1]
    with torch.no_grad():
        block.attn.qkv.weight[2 * d:] *= beta
        block.attn.proj.weight *= beta
        block.mlp.proj.weight *= beta


def test_scale_check_names_the_mistake():
    _fails(check_deepnorm_scale, _scale_rows(lambda d: slice(0, 3 * d)),
           hint="only the value rows")
    _fails(check_deepnorm_scale, _scale_rows(lambda d: slice(0, d)), hint="last d rows")
    _fails(check_deepnorm_scale, _scale_rows(lambda d: slice(2 * d, 3 * d), biases=True),
           hint="leave the biases")
    _fails(check_deepnorm_scale, _scale_rows(lambda d: slice(2 * d, 3 * d), power=-1),
           hint="do not divide")
    _fails(check_deepnorm_scale, scale_not_in_place, hint="in place")
    _fails(check_deepnorm_scale, scale_forgets_fc, hint="mlp.fc.weight")


def _model_with(kind_to_final_ln=None, *, scale=True, alpha_from=lambda n: n):
    final = {**blocks.FINAL_LN, **(kind_to_final_ln or {})}

    def make_model(kind, n_layers, seed):
        model = make_model_another_way(kind, n_layers, seed)
        model.ln_f = nn.LayerNorm(64) if final[kind] else nn.Identity()
        blocks.init_like_xiong(model, seed)
        if kind == "deepnorm":
            alpha, beta = blocks.deepnorm_constants(alpha_from(n_layers))
            for block in model.blocks:
                block.alpha = alpha
                if scale:
                    blocks.deepnorm_scale_(block, beta)
        return model

    return make_model


def test_make_model_check_names_the_mistake(one_thread):
    _fails(check_make_model, _model_with({"sandwich": False}), hint="needs the final LN")
    _fails(check_make_model, _model_with({"deepnorm": True}), hint="no final LN")
    _fails(check_make_model, _model_with(scale=False), hint="after init_like_xiong")
    _fails(check_make_model, _model_with(alpha_from=lambda n: 2 * n),
           hint="counts blocks, not sublayers")

    def swaps_pre_and_post(kind, n_layers, seed):
        other = {"pre": "post", "post": "pre"}.get(kind, kind)
        model = make_model_another_way(other, n_layers, seed)
        model.ln_f = nn.LayerNorm(64) if blocks.FINAL_LN[kind] else nn.Identity()
        blocks.init_like_xiong(model, seed)
        return model

    _fails(check_make_model, swaps_pre_and_post, hint="those are the norms of a post model")

    def alpha_one(kind, n_layers, seed):
        model = make_model_another_way(kind, n_layers, seed)
        for block in model.blocks:
            block.alpha = 1.0
        return model

    _fails(check_make_model, alpha_one, hint="expected 1.56508 in each")


# More of unit 05's grader-facing checks (normref/checks/blocks_judges.py),
# pinned down where tests/normref/test_blocks_verdicts.py leaves a gap.

CUT_GRAPH = (". The output is right, so look for a .detach(), .data or in-place change "
             "that cuts the graph")


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run faster on one thread than on two that share cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _small_case(alpha=None, sandwich=False, d=4, heads=2, d_ff=6):
    rng = np.random.default_rng(0)
    extra = {} if alpha is None else {"alpha": alpha}
    case = blocks_judges._block_case(rng, 2, 3, d, heads, d_ff, **extra)
    if sandwich:
        case.update(blocks_judges._layer_norm(rng, d, "ln1_out"))
        case.update(blocks_judges._layer_norm(rng, d, "ln2_out"))
    return case


def _run(block_class, case):
    return {key: np.asarray(value.detach() if hasattr(value, "detach") else value)
            for key, value in blocks_probes._probe_block(block_class, case).items()}


def _sandwich_judge():
    return blocks_judges._block_judge("sandwich", blocks_judges._diagnose_sandwich)


def _deepnorm_judge():
    return blocks_judges._block_judge("deepnorm", blocks_judges._diagnose_deepnorm)


class DeepNormFirstOnly(blocks.DeepNormBlock):
    def forward(self, x):
        x = self.ln1(self.alpha * x + self.attn(x))
        return self.ln2(x + self.mlp(x))


# ------------------------------------------------------------ the block judges

def test_block_judges_pass_the_right_blocks():
    assert _sandwich_judge()(_small_case(sandwich=True),
                             _run(blocks.SandwichLNBlock, _small_case(sandwich=True))) is None
    case = _small_case(alpha=1.75)
    assert _deepnorm_judge()(case, _run(blocks.DeepNormBlock, case)) is None


def test_block_judge_names_a_wrong_output_and_its_mistake():
    case = _small_case(sandwich=True)
    got = _run(SandwichAfterAdd, case)
    right = _run(blocks.SandwichLNBlock, case)
    problem = mismatch(got["y"], right["y"], dtype=np.float64, what="your block's output")
    assert problem.startswith("your block's output is [")
    assert _sandwich_judge()(case, got) == (
        problem + ". Hint: ln1_out normalizes the sublayer's output before the add, not the "
                  "sum: the residual path must stay unnormalized")
    case = _small_case(alpha=1.75)
    got = _run(DeepNormFirstOnly, case)
    problem = mismatch(got["y"], _run(blocks.DeepNormBlock, case)["y"], dtype=np.float64,
                       what="your block's output")
    assert _deepnorm_judge()(case, got) == (
        problem + ". Hint: scale the residual in both sublayers: ln2(alpha * x + mlp(x)) too")


def test_block_judge_gives_no_hint_for_an_unknown_mistake():
    case = _small_case(sandwich=True)
    got = _run(SandwichDoubled, case)
    assert _sandwich_judge()(case, got) == mismatch(
        got["y"], _run(blocks.SandwichLNBlock, case)["y"], dtype=np.float64,
        what="your block's output")


def test_block_judge_gives_no_hint_for_an_output_of_another_shape():
    case = _small_case(sandwich=True)
    got = _run(SandwichAfterAdd, case)
    got["y"] = got["y"][:, :2]
    assert _sandwich_judge()(case, got) == (
        "your block's output has shape (2, 2, 4); expected shape (2, 3, 4)")


def test_block_judge_checks_the_gradients_once_the_output_is_right():
    case = _small_case(sandwich=True)
    got, right = _run(SandwichDetached, case), _run(blocks.SandwichLNBlock, case)
    np.testing.assert_array_equal(got["y"], right["y"])
    assert _sandwich_judge()(case, got) == mismatch(
        got["d0"], right["d0"], dtype=np.float64,
        what="the gradient with respect to x") + CUT_GRAPH


# ------------------------------------------------------------ the grader's cases

class Twos:
    """A stand-in for numpy's Generator whose normal() draws are two
    standard deviations above the mean: a scale that multiplies is told
    apart from one that divides."""

    def normal(self, loc=0.0, scale=1.0, size=None):
        return loc + 2 * scale * np.ones(size)


def test_layer_norm_weights_are_one_plus_0_3_sigma_and_biases_0_2_sigma():
    norm = blocks_judges._layer_norm(Twos(), 3, "ln1")
    np.testing.assert_allclose(norm["w:ln1.weight"], np.full(3, 1.6))
    np.testing.assert_allclose(norm["w:ln1.bias"], np.full(3, 0.4))


# ------------------------------------------------------------ make_model

def _model_case(kind, n_layers=2, seed=5):
    inputs, targets = blocks.experiment_batch(seed)
    return {"kind": np.array(kind), "n_layers": np.array(n_layers), "seed": np.array(seed),
            "inputs": inputs.numpy(), "targets": targets.numpy()}


def _names(model):
    return sorted(name for name, _ in model.named_parameters())


def _names_output(names):
    return {"names": np.array("\n".join(names))}


def test_a_parameter_name_with_a_space_is_shown_whole():
    names = _names(blocks.experiment_model("pre", 2, 5))
    message = _judge_make_model(_model_case("pre"), _names_output(names + ["my gain"]))
    assert "unexpected ['my gain'])" in message


@pytest.mark.parametrize("kind, names_change, diff, hint", [
    ("pre", lambda names: [n for n in names if n != "ln_f.bias"],
     "missing ['ln_f.bias'], unexpected []",
     "this kind needs the final LN (final_ln=True): its residual stream is never normalized"),
    ("post", lambda names: sorted(names + ["ln_f.weight"]),
     "missing [], unexpected ['ln_f.weight']",
     "this kind ends every block with an LN already: no final LN (final_ln=False)"),
])
def test_a_final_norm_with_one_parameter_is_named_as_the_final_ln(kind, names_change, diff,
                                                                  hint):
    """A final LN without a bias (bias=False), or an RMSNorm with only a
    gain, shows up as one ln_f parameter: the hint is still the final LN's."""
    names = names_change(_names(blocks.experiment_model(kind, 2, 5)))
    assert _judge_make_model(_model_case(kind), _names_output(names)) == (
        f"your {kind} model's parameters differ from the expected ones ({diff}). "
        f"Hint: {hint}")


def _float32_close(values):
    """Values as a float32 computation would give them: off by 2e-5 relative,
    inside float32's tolerance, outside float64's."""
    return np.asarray(values) * (1 + 2e-5)


def test_an_initialization_slip_in_float32_is_still_named():
    case = _model_case("pre")
    model = blocks.experiment_model("pre", 2, 5)
    wrong = blocks.experiment_model("pre", 2, 6)
    output = {**_names_output(_names(model)),
              "param_norms": _float32_close(blocks_judges._param_norms(wrong))}
    problem = mismatch(output["param_norms"], blocks_judges._param_norms(model),
                       dtype="float32",
                       what="the norms of your pre model's parameters after initialization")
    assert _judge_make_model(case, output) == (
        f"{problem}. Hint: initialize with init_like_xiong(model, seed), with the seed you "
        "are given")


def test_swapped_pre_and_post_norms_in_float32_are_still_named():
    case = _model_case("pre")
    model = blocks.experiment_model("pre", 2, 5)
    other = blocks.experiment_model("post", 2, 5)
    output = {**_names_output(_names(model)),
              "param_norms": blocks_judges._param_norms(model),
              "norms": _float32_close(blocks_judges._norms(other, case))}
    problem = mismatch(output["norms"], blocks_judges._norms(model, case), dtype="float32",
                       what="the gradient norms of your pre model's blocks")
    assert _judge_make_model(case, output) == (
        f"{problem}. Hint: those are the norms of a post model: 'pre' takes PreLNBlock")


# ------------------------------------------------------------ the student's own table

def test_model_layer_norm_has_both_parameters():
    """The names above come from the real model: its final LN has a gain and a bias."""
    assert {"ln_f.weight", "ln_f.bias"} <= set(_names(blocks.experiment_model("pre", 2, 5)))
    assert isinstance(blocks.experiment_model("post", 2, 5).ln_f, nn.Identity)


# --- the cut branches (assignment exercise 9) and adaLN-Zero (exercise 10) ---

def _profile_step_by_step(model, batch, cut):
    """An independent forward pass: the stream written out, each ln1 and ln2
    reading a detached copy when `cut`."""
    inputs, targets = batch
    h = model.tok_emb(inputs) + model.pos_emb(torch.arange(inputs.shape[1]))
    for block in model.blocks:
        h = h + block.attn(block.ln1(h.detach() if cut else h))
        h = h + block.mlp(block.ln2(h.detach() if cut else h))
    logits = model.head(model.ln_f(h))
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    loss.backward()
    return torch.stack([b.mlp.proj.weight.grad.double().norm() for b in model.blocks])


@pytest.mark.parametrize("cut", [False, True])
def test_grad_norms_by_layer_with_cut_branches_matches_a_step_by_step_forward(cut):
    torch.manual_seed(3)
    model = blocks.TinyLM(11, 16, 3, 2, "pre", max_len=8).double()
    batch = blocks.copy_task_batch(4, 4, 11, seed=2)
    got = blocks.grad_norms_by_layer(model, batch, detach_branches=cut)
    torch.testing.assert_close(got, _profile_step_by_step(model, batch, cut))


def test_cutting_branches_leaves_the_last_mlp_and_the_model_as_they_were():
    torch.manual_seed(4)
    model = blocks.TinyLM(11, 16, 4, 2, "pre", max_len=8).double()
    batch = blocks.copy_task_batch(4, 4, 11, seed=5)
    intact = blocks.grad_norms_by_layer(model, batch)
    cut = blocks.grad_norms_by_layer(model, batch, detach_branches=True)
    torch.testing.assert_close(cut[-1], intact[-1])
    assert not torch.allclose(cut[0], intact[0])
    torch.testing.assert_close(blocks.grad_norms_by_layer(model, batch), intact)


# --- the first step's update (assignment exercise 6) ---

def _update_by_torch_adam(model, batch, lr):
    """Independent: torch's Adam takes the first step (eps far below every
    gradient entry that is not zero), on a copy of the model."""
    stepped = copy.deepcopy(model)
    optimizer = torch.optim.Adam(stepped.parameters(), lr=lr, eps=1e-30)
    blocks.lm_loss(stepped, batch).backward()
    optimizer.step()
    with torch.no_grad():
        before, after = model(batch[0]), stepped(batch[0])
    return float((after - before).norm() / before.norm())


@pytest.mark.parametrize("kind", ["pre", "post", "deepnorm"])
def test_first_step_update_is_torch_adams_first_step(kind):
    torch.manual_seed(6)
    model = blocks.TinyLM(11, 16, 3, 2, kind, max_len=8).double()
    batch = blocks.copy_task_batch(4, 4, 11, seed=7)
    expected = _update_by_torch_adam(model, batch, 2e-3)
    assert blocks.first_step_update(model, batch, 2e-3) == pytest.approx(expected, rel=1e-9)


def test_first_step_update_puts_the_model_back_also_when_the_forward_fails():
    torch.manual_seed(8)
    model = blocks.TinyLM(11, 16, 2, 2, "pre", max_len=8).double()
    batch = blocks.copy_task_batch(4, 4, 11, seed=9)
    before = copy.deepcopy(model.state_dict())
    blocks.first_step_update(model, batch, 1e-2)
    calls = []

    def fail_on_second_call(module, args, output):
        calls.append(1)
        if len(calls) == 3:  # the loss, the logits before, then after the step
            raise RuntimeError("the forward pass failed")

    hook = model.head.register_forward_hook(fail_on_second_call)
    with pytest.raises(RuntimeError):
        blocks.first_step_update(model, batch, 1e-2)
    hook.remove()
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_deepnorm_first_step_moves_the_output_least(one_thread):
    """DeepNet's claim on the assignment's toy, on two sets of seeds: at
    every depth DeepNorm's first Adam step changes the logits less than
    Post-LN's, Pre-LN's and sandwich-LN's, by a factor above 2 at 8 blocks
    or more."""
    for seeds in ((0, 1, 2), (3, 4, 5)):
        for depth in (2, 8, 16):
            update = {kind: np.median([blocks.first_step_update(
                blocks.experiment_model(kind, depth, seed), blocks.experiment_batch(seed), 1e-3)
                for seed in seeds]) for kind in blocks.FINAL_LN}
            others = min(v for k, v in update.items() if k != "deepnorm")
            assert update["deepnorm"] < others, (depth, update)
            if depth >= 8:
                assert update["post"] > 2 * update["deepnorm"], (depth, update)


def _adaln_zero_by_formula(block, x, cond):
    """DiT's block written from its formula with F.layer_norm and slices."""
    d = x.shape[-1]
    mod = F.linear(cond * torch.sigmoid(cond), block.ada.weight, block.ada.bias)  # B, 6d
    piece = [mod[:, i * d:(i + 1) * d, None].transpose(1, 2) for i in range(6)]
    ln = F.layer_norm(x, (d,))
    x = x + piece[2] * block.attn(ln * (1 + piece[1]) + piece[0])
    ln = F.layer_norm(x, (d,))
    return x + piece[5] * block.mlp(ln * (1 + piece[4]) + piece[3])


def test_adaln_zero_block_matches_its_formula_and_gradcheck():
    torch.manual_seed(0)
    block = blocks.AdaLNZeroBlock(8, 2, 12, 5).double()
    with torch.no_grad():
        block.ada.weight.normal_(0, 0.5)
        block.ada.bias.normal_(0, 0.5)
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    cond = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(block(x, cond), _adaln_zero_by_formula(block, x, cond))
    assert torch.autograd.gradcheck(block, (x, cond))


def test_new_adaln_zero_block_is_the_identity_with_a_gradient_reaching_ada():
    torch.manual_seed(1)
    block = blocks.AdaLNZeroBlock(8, 2, 12, 5)
    assert sorted(n for n, _ in block.named_parameters() if n.startswith(("ln", "ada"))) == [
        "ada.bias", "ada.weight"]
    x, cond = torch.randn(2, 3, 8), torch.randn(2, 5)
    y = block(x, cond)
    torch.testing.assert_close(y, x)
    (y * torch.randn_like(y)).sum().backward()
    assert block.ada.weight.grad.abs().sum() > 0 and block.ada.bias.grad.abs().sum() > 0


# --- DeepNet's two changes one at a time (assignment exercise 8) ---

def test_ablation_model_with_both_changes_is_the_experiments_deepnorm_model():
    both = blocks.ablation_model(True, True, 4, seed=3)
    deepnorm = blocks.experiment_model("deepnorm", 4, seed=3)
    for (name, got), want in zip(both.named_parameters(), deepnorm.parameters()):
        assert torch.equal(got, want), name
    assert [b.alpha for b in both.blocks] == [b.alpha for b in deepnorm.blocks]


def test_ablation_model_without_changes_computes_what_post_ln_computes():
    """Alpha 1 and no beta: the output of a Post-LN model with the same
    weights, in float64."""
    plain = blocks.ablation_model(False, False, 3, seed=2).double()
    post = blocks.experiment_model("post", 3, seed=2).double()
    post.load_state_dict(plain.state_dict())
    tokens = blocks.experiment_batch(2)[0]
    torch.testing.assert_close(plain(tokens), post(tokens), rtol=1e-12, atol=1e-12)


def test_ablation_model_beta_scales_only_deepnets_weights_of_the_plain_model():
    plain = dict(blocks.ablation_model(True, False, 3, seed=4).named_parameters())
    scaled = dict(blocks.ablation_model(True, True, 3, seed=4).named_parameters())
    beta, d = blocks.deepnorm_constants(3)[1], blocks.EXPERIMENT["d_model"]
    for name, got in scaled.items():
        factor = torch.ones_like(got)
        if name.endswith(("mlp.fc.weight", "mlp.proj.weight", "attn.proj.weight")):
            factor *= beta
        elif name.endswith("attn.qkv.weight"):
            factor[2 * d:] = beta
        torch.testing.assert_close(got, factor * plain[name], rtol=1e-6, atol=0)


def test_final_loss_of_the_plain_ablation_model_is_the_sweeps_post_ln_run():
    """The ablation's 'neither' run is exercise 7's Post-LN run without warm-up,
    cut to the ablation's steps."""
    c = blocks.ABLATION
    plain = blocks.ablation_model(False, False, c["n_layers"], c["seed"])
    post = blocks.experiment_model("post", c["n_layers"], c["seed"])
    assert blocks.final_loss(plain, c["lr"], 0, c["seed"], steps=c["steps"]) == pytest.approx(
        blocks.final_loss(post, c["lr"], 0, c["seed"], steps=c["steps"]), rel=1e-6)
