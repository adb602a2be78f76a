"""Unit 05: Pre-LN and Post-LN blocks, TinyLM, gradient norms, adaLN, and their checks."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from normref import blocks
from normref.checks import (
    CheckFailed,
    blocks_probes,
    check_ada_ln,
    check_depth_ratio,
    check_grad_norms_by_layer,
    check_post_ln_block,
    check_pre_ln_block,
    check_tiny_lm,
)


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


# --- the checks pass the reference and reference-equivalent code ---

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


def last_block_ratio_for(TinyLM, grad_norms_by_layer, reduce=np.median, default=(0, 1, 2)):
    """The notebook's last_block_ratio(depth, seeds), built on the given pieces."""
    def last_block_ratio(depth, seeds=default):
        ratios = []
        for seed in seeds:
            batch = blocks.copy_task_batch(16, 8, 16, seed)
            last = {}
            for position in ("pre", "post"):
                model = TinyLM(16, 64, depth, 4, position, max_len=16)
                blocks_probes.init_like_xiong(model, seed)
                last[position] = float(grad_norms_by_layer(model, batch)[-1])
            ratios.append(last["post"] / last["pre"])
        return float(reduce(ratios))

    return last_block_ratio


def test_checks_pass_the_reference(one_thread):
    check_pre_ln_block(blocks.PreLNBlock)
    check_post_ln_block(blocks.PostLNBlock)
    check_tiny_lm(blocks.TinyLM)
    check_grad_norms_by_layer(blocks.grad_norms_by_layer)
    check_depth_ratio(last_block_ratio_for(blocks.TinyLM, blocks.grad_norms_by_layer),
                      blocks.TinyLM, blocks.grad_norms_by_layer)
    check_ada_ln(blocks.AdaLN)


def test_checks_pass_equivalent_code():
    check_pre_ln_block(OtherPre)
    check_post_ln_block(OtherPost)

    def norms_by_backward(model, batch):
        model.zero_grad()
        inputs, targets = batch
        logits = model(inputs)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
        return [block.mlp.proj.weight.grad.norm().item() for block in model.blocks]

    check_grad_norms_by_layer(norms_by_backward)

    class AdaLNFunctional(nn.Module):
        def __init__(self, d_model, d_cond):
            super().__init__()
            self.d = d_model
            self.to_scale_shift = nn.Linear(d_cond, 2 * d_model)
            nn.init.zeros_(self.to_scale_shift.weight)
            nn.init.zeros_(self.to_scale_shift.bias)

        def forward(self, x, cond):
            out = self.to_scale_shift(cond)
            scale, shift = out[:, : self.d], out[:, self.d:]
            return F.layer_norm(x, (self.d,)) * (1 + scale[:, None]) + shift[:, None]

    check_ada_ln(AdaLNFunctional)


# --- the checks fail typical mistakes, naming them ---

def _fails(check, *subject, hint):
    with pytest.raises(CheckFailed) as failure:
        check(*subject)
    assert hint in str(failure.value), str(failure.value)


class PostLNBeforeAdd(blocks.PostLNBlock):
    def forward(self, x):
        x = x + self.ln1(self.attn(x))
        return x + self.ln2(self.mlp(x))


class PreLNNormalizedResidual(blocks.PreLNBlock):
    def forward(self, x):
        h = self.ln1(x)
        x = h + self.attn(h)
        h = self.ln2(x)
        return h + self.mlp(h)


class PreNoMask(blocks.PreLNBlock):
    def forward(self, x):
        B, T, d = x.shape
        q, k, v = (t.view(B, T, self.attn.n_heads, -1).transpose(1, 2)
                   for t in self.attn.qkv(self.ln1(x)).split(d, -1))
        weights = (q @ k.transpose(-2, -1) / math.sqrt(d // self.attn.n_heads)).softmax(-1)
        x = x + self.attn.proj((weights @ v).transpose(1, 2).reshape(B, T, d))
        return x + self.mlp(self.ln2(x))


class PreDetached(blocks.PreLNBlock):
    def forward(self, x):
        x = x + self.attn(self.ln1(x)).detach()
        return x + self.mlp(self.ln2(x))


class PreExtraParameter(blocks.PreLNBlock):
    def __init__(self, d_model, n_heads, d_ff):
        super().__init__(d_model, n_heads, d_ff)
        self.ln3 = nn.LayerNorm(d_model)


def test_block_checks_name_the_mistake():
    _fails(check_post_ln_block, PostLNBeforeAdd,
           hint="not on the sublayer's output before the add")
    _fails(check_pre_ln_block, PreLNNormalizedResidual, hint="must carry the unnormalized x")
    _fails(check_pre_ln_block, blocks.PostLNBlock, hint="which is Post-LN")
    _fails(check_post_ln_block, blocks.PreLNBlock, hint="that is a Pre-LN block")
    _fails(check_pre_ln_block, PreNoMask, hint="must be causal")
    _fails(check_pre_ln_block, PreDetached, hint="cuts the graph")
    _fails(check_pre_ln_block, PreExtraParameter, hint="unexpected ['ln3.bias', 'ln3.weight']")


class PreWithoutFinalLN(blocks.TinyLM):
    def forward(self, tokens):
        h = self.tok_emb(tokens) + self.pos_emb(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            h = block(h)
        return self.head(h)


class NoFinalLNAtAll(PreWithoutFinalLN):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ln_f = nn.Identity()


class PostWithFinalLN(blocks.TinyLM):
    def __init__(self, vocab, d_model, n_layers, n_heads, norm_position="pre", **kwargs):
        super().__init__(vocab, d_model, n_layers, n_heads, norm_position, **kwargs)
        self.ln_f = nn.LayerNorm(d_model)


def test_tiny_lm_check_names_the_mistake():
    _fails(check_tiny_lm, PreWithoutFinalLN, hint="applies its final LayerNorm ln_f")
    _fails(check_tiny_lm, NoFinalLNAtAll, hint="missing ['ln_f.bias', 'ln_f.weight']")
    _fails(check_tiny_lm, PostWithFinalLN, hint="unexpected ['ln_f.bias', 'ln_f.weight']")


def test_grad_norm_check_names_the_mistake():
    def stale(model, batch):
        blocks.lm_loss(model, batch).backward()
        return [b.mlp.proj.weight.grad.norm() for b in model.blocks]

    def squared(model, batch):
        return blocks.grad_norms_by_layer(model, batch) ** 2

    def first_weight(model, batch):
        model.zero_grad()
        blocks.lm_loss(model, batch).backward()
        return [b.mlp.fc.weight.grad.norm() for b in model.blocks]

    def summed_loss(model, batch):
        inputs, targets = batch
        logits = model(inputs).flatten(0, 1)
        loss = F.cross_entropy(logits, targets.flatten(), reduction="sum")
        weights = [b.mlp.proj.weight for b in model.blocks]
        return [g.norm() for g in torch.autograd.grad(loss, weights)]

    _fails(check_grad_norms_by_layer, stale, hint="clear old gradients")
    _fails(check_grad_norms_by_layer, squared, hint="not the squared norm")
    _fails(check_grad_norms_by_layer, first_weight, hint="not mlp.fc.weight")
    _fails(check_grad_norms_by_layer, summed_loss, hint="not the sum")


def test_depth_check_fails_when_pre_ln_has_no_final_ln(one_thread):
    _fails(check_depth_ratio,
           last_block_ratio_for(PreWithoutFinalLN, blocks.grad_norms_by_layer),
           PreWithoutFinalLN, blocks.grad_norms_by_layer,
           hint="only the Pre-LN models differ")


class PostLNOnSublayerOutput(blocks.PostLNBlock):
    def forward(self, x):
        x = x + self.ln1(self.attn(x))
        return x + self.ln2(self.mlp(x))


class TinyLMWrongPost(blocks.TinyLM):
    def __init__(self, vocab, d_model, n_layers, n_heads, norm_position="pre", d_ff=None,
                 max_len=64):
        super().__init__(vocab, d_model, n_layers, n_heads, norm_position, d_ff, max_len)
        if norm_position == "post":
            self.blocks = nn.ModuleList(PostLNOnSublayerOutput(d_model, n_heads, d_ff)
                                        for _ in range(n_layers))


def test_depth_check_reruns_the_experiment_instead_of_trusting_numbers(one_thread):
    """Before, the judge only asked whether the student's numbers grew with depth,
    so made-up numbers passed. Now the grader reruns the experiment with its
    reference blocks on seeds it picks and compares."""
    def made_up_norms(model, batch):  # growing with depth for Post-LN, by construction
        n = len(model.blocks)
        post = isinstance(model.ln_f, nn.Identity)
        return [1.0] * (n - 1) + [0.5 * n if post else 1.0]

    def made_up_ratio(depth, seeds=(0, 1, 2)):
        return {2: 1.2, 6: 1.8, 12: 2.6}[depth]

    right_ratio = last_block_ratio_for(blocks.TinyLM, blocks.grad_norms_by_layer)
    _fails(check_depth_ratio, made_up_ratio, blocks.TinyLM, made_up_norms,
           hint="both kinds of model differ")
    _fails(check_depth_ratio, made_up_ratio, blocks.TinyLM, blocks.grad_norms_by_layer,
           hint="look at last_block_ratio itself")
    # real measurements of a wrong Post-LN model still show the ratio growing; they are
    # not the experiment's numbers, and the grader can tell
    _fails(check_depth_ratio, last_block_ratio_for(TinyLMWrongPost, blocks.grad_norms_by_layer),
           TinyLMWrongPost, blocks.grad_norms_by_layer, hint="only the Post-LN models differ")
    assert right_ratio(12) > 1.5  # the visible test's claim, for the default seeds


def test_depth_check_names_slips_in_last_block_ratio(one_thread):
    pieces = (blocks.TinyLM, blocks.grad_norms_by_layer)
    _fails(check_depth_ratio, last_block_ratio_for(*pieces, reduce=np.mean), *pieces,
           hint="not their mean")

    def fixed_seeds(depth, seeds=(0, 1, 2)):
        return last_block_ratio_for(*pieces)(depth)

    _fails(check_depth_ratio, fixed_seeds, *pieces, hint="use the seeds you are given")


def test_depth_check_seeds_change_with_the_grader_seed():
    from normref.checks import _registry

    seeds = [tuple(_registry.make_cases("blocks_depth_ratio", seed)[0][1]["seeds"])
             for seed in (0, 1)]
    assert seeds[0] != seeds[1] and len(seeds[0]) % 2 == 1


def test_depth_check_passes_unusual_but_right_code(one_thread):
    """Other blocks, a TinyLM slicing pos_emb.weight, norms by .backward() in a tensor,
    and a last_block_ratio that uses torch.median on a tensor of ratios."""
    class OtherTinyLM(blocks.TinyLM):
        def __init__(self, vocab, d_model, n_layers, n_heads, norm_position="pre",
                     d_ff=None, max_len=64):
            super().__init__(vocab, d_model, n_layers, n_heads, norm_position, d_ff, max_len)
            kind = OtherPre if norm_position == "pre" else OtherPost
            self.blocks = nn.ModuleList(kind(d_model, n_heads, d_ff or 4 * d_model)
                                        for _ in range(n_layers))

        def forward(self, tokens):
            h = self.tok_emb(tokens) + self.pos_emb.weight[: tokens.shape[1]]
            for block in self.blocks:
                h = block(h)
            return self.head(self.ln_f(h))

    def norms_by_backward(model, batch):
        model.zero_grad(set_to_none=True)
        inputs, targets = batch
        logits = model(inputs)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
        return torch.stack([torch.linalg.norm(b.mlp.proj.weight.grad) for b in model.blocks])

    ratio = last_block_ratio_for(OtherTinyLM, norms_by_backward,
                                 reduce=lambda r: torch.tensor(r).median())
    check_depth_ratio(ratio, OtherTinyLM, norms_by_backward)


class AdaLNNoOffset(blocks.AdaLN):
    def forward(self, x, cond):
        gamma, beta = self.to_scale_shift(cond).unsqueeze(1).chunk(2, dim=-1)
        return self.norm(x) * gamma + beta


class AdaLNRandomStart(blocks.AdaLN):
    def __init__(self, d_model, d_cond):
        super().__init__(d_model, d_cond)
        nn.init.normal_(self.to_scale_shift.weight)


class AdaLNSwapped(blocks.AdaLN):
    def forward(self, x, cond):
        beta, gamma = self.to_scale_shift(cond).unsqueeze(1).chunk(2, dim=-1)
        return self.norm(x) * (1 + gamma) + beta


class AdaLNAffine(blocks.AdaLN):
    def __init__(self, d_model, d_cond):
        super().__init__(d_model, d_cond)
        self.norm = nn.LayerNorm(d_model)


def test_ada_ln_check_names_the_mistake():
    _fails(check_ada_ln, AdaLNNoOffset, hint="(1 + gamma)")
    _fails(check_ada_ln, AdaLNRandomStart, hint="start to_scale_shift at zero")
    _fails(check_ada_ln, AdaLNSwapped, hint="the first half")
    _fails(check_ada_ln, AdaLNAffine, hint="no parameters of its own")
