"""Unit 05 checks, the student-facing half: how each exercise is called.

The cases carry weights as plain arrays keyed "w:<parameter name>"; a probe
builds the student's module, checks its parameters against the naming
contract below, loads the weights, runs forward and backward in float64 and
returns the outputs and gradients ("g:<parameter name>" for a parameter).
The small stand-in modules here are test harness, not answers: they let the
model and gradient-norm checks run without depending on the student's blocks.
"""

import numpy as np

from normref.checks._runner import run_check

BLOCK_CONTRACT = (
    "ln1.weight (d,), ln1.bias (d,), attn.qkv.weight (3d, d), attn.qkv.bias (3d,), "
    "attn.proj.weight (d, d), attn.proj.bias (d,), ln2.weight (d,), ln2.bias (d,), "
    "mlp.fc.weight (d_ff, d), mlp.fc.bias (d_ff,), mlp.proj.weight (d, d_ff), "
    "mlp.proj.bias (d,)"
)


def _torch():
    import torch

    return torch


def _weights(case):
    return {key[2:]: value for key, value in case.items() if key.startswith("w:")}


def _load_by_contract(module, weights, what, contract_hint=""):
    """Copy `weights` into `module` (made float64) after checking the names and shapes."""
    torch = _torch()
    module.double()
    params = dict(module.named_parameters())
    missing = sorted(set(weights) - set(params))
    unexpected = sorted(set(params) - set(weights))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if unexpected:
            parts.append(f"unexpected {unexpected}")
        raise ValueError(f"{what}'s parameters do not follow the naming contract: "
                         f"{'; '.join(parts)}. {contract_hint}".strip())
    for name, value in weights.items():
        if tuple(params[name].shape) != value.shape:
            raise ValueError(f"{what}'s parameter {name} has shape {tuple(params[name].shape)}; "
                             f"the contract gives it shape {value.shape}. {contract_hint}".strip())
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(torch.from_numpy(value))
    return params


def _forward_backward(module, params, inputs, dy):
    """y = module(*inputs); backward from the upstream gradient dy; all as arrays."""
    torch = _torch()
    tensors = [torch.from_numpy(a.copy()).requires_grad_(a.dtype.kind == "f") for a in inputs]
    y = module(*tensors)
    if not torch.is_tensor(y):
        raise TypeError(f"forward returned a {type(y).__name__}, not a tensor")
    if tuple(y.shape) != dy.shape:
        return {"y": y.detach()}  # the judge reports the shape
    (y * torch.from_numpy(dy)).sum().backward()
    result = {"y": y.detach()}
    for i, t in enumerate(tensors):
        if t.requires_grad:
            result[f"d{i}"] = t.grad if t.grad is not None else torch.zeros_like(t)
    for name, p in params.items():
        # NaN marks a parameter the forward pass never used.
        result[f"g:{name}"] = p.grad if p.grad is not None else torch.full_like(p, float("nan"))
    return result


def _probe_block(block_class, case):
    d, heads, d_ff = int(case["d_model"]), int(case["n_heads"]), int(case["d_ff"])
    block = block_class(d, heads, d_ff)
    params = _load_by_contract(block, _weights(case), "your block",
                               f"The contract is: {BLOCK_CONTRACT}.")
    block.eval()
    return _forward_backward(block, params, [case["x"]], case["dy"])


def check_pre_ln_block(PreLNBlock):
    """Check PreLNBlock(d_model, n_heads, d_ff): output and gradients, float64."""
    run_check("blocks_pre_ln", PreLNBlock, _probe_block)


def check_post_ln_block(PostLNBlock):
    """Check PostLNBlock(d_model, n_heads, d_ff): output and gradients, float64."""
    run_check("blocks_post_ln", PostLNBlock, _probe_block)


def _stand_in_block_class():
    nn = _torch().nn

    class StandInBlock(nn.Module):
        """x + tanh(mix(x)): a cheap block whose position in the stack matters."""

        def __init__(self, d_model):
            super().__init__()
            self.mix = nn.Linear(d_model, d_model)

        def forward(self, x):
            return x + self.mix(x).tanh()

    return StandInBlock


def run_stand_in_lm(model, n_layers, d_model, weights, tokens):
    """Swap the model's blocks for stand-ins, load `weights`, return its logits."""
    torch, nn = _torch(), _torch().nn
    if not hasattr(model, "blocks"):
        raise AttributeError("your model has no attribute `blocks` (an nn.ModuleList of blocks)")
    stand_in = _stand_in_block_class()
    model.blocks = nn.ModuleList(stand_in(d_model) for _ in range(n_layers))
    _load_by_contract(model, weights, "your model",
                      "Expected tok_emb, pos_emb, blocks, ln_f (Pre-LN only) and head.")
    model.eval()
    with torch.no_grad():
        return model(torch.from_numpy(tokens.copy()))


def _probe_tiny_lm(TinyLM, case):
    vocab, d, n_layers = int(case["vocab"]), int(case["d_model"]), int(case["n_layers"])
    model = TinyLM(vocab, d, n_layers, int(case["n_heads"]), str(case["norm_position"]),
                   d_ff=int(case["d_ff"]), max_len=int(case["max_len"]))
    return {"logits": run_stand_in_lm(model, n_layers, d, _weights(case), case["tokens"])}


def check_tiny_lm(TinyLM):
    """Check TinyLM's assembly (embeddings, blocks in order, ln_f, head) with
    stand-in blocks, so your own blocks cannot affect the verdict."""
    run_check("blocks_tiny_lm", TinyLM, _probe_tiny_lm)


def make_grad_probe_lm(vocab, d_model, n_layers):
    """A Pre-LN stack of MLP-only blocks following the naming contract
    (blocks[i].ln2, blocks[i].mlp.fc, blocks[i].mlp.proj), for the
    gradient-norm check."""
    torch, nn = _torch(), _torch().nn

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(d_model, 2 * d_model)
            self.proj = nn.Linear(2 * d_model, d_model)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln2 = nn.LayerNorm(d_model)
            self.mlp = MLP()

        def forward(self, x):
            return x + self.mlp.proj(torch.tanh(self.mlp.fc(self.ln2(x))))

    class GradProbeLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_emb = nn.Embedding(vocab, d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(n_layers))
            self.ln_f = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab, bias=False)

        def forward(self, tokens):
            h = self.tok_emb(tokens)
            for block in self.blocks:
                h = block(h)
            return self.head(self.ln_f(h))

    return GradProbeLM()


STALE_GRAD = 3.0  # what the probe leaves in every .grad before calling the student


def build_grad_probe_lm(case):
    torch = _torch()
    model = make_grad_probe_lm(int(case["vocab"]), int(case["d_model"]), int(case["n_layers"]))
    params = _load_by_contract(model, _weights(case), "the probe model")
    batch = (torch.from_numpy(case["inputs"].copy()), torch.from_numpy(case["targets"].copy()))
    return model, params, batch


def _probe_grad_norms(grad_norms_by_layer, case):
    torch = _torch()
    model, params, batch = build_grad_probe_lm(case)
    for p in params.values():  # stale gradients, as after an earlier backward pass
        p.grad = torch.full_like(p, STALE_GRAD)
    norms = grad_norms_by_layer(model, batch)
    return {"norms": np.array([float(v) for v in norms], dtype=np.float64)}


def check_grad_norms_by_layer(grad_norms_by_layer):
    """Check grad_norms_by_layer(model, batch) on small Pre-LN stacks."""
    run_check("blocks_grad_norms", grad_norms_by_layer, _probe_grad_norms)


def init_like_xiong(model, seed):
    """The shipped experiment's initialization, applied by name so it does not
    depend on how the model was written: Linear weights Xavier-normal, biases 0,
    LayerNorm weights 1, embeddings N(0, 1)."""
    torch = _torch()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("emb.weight"):
                p.copy_(torch.randn(p.shape, generator=generator))
            elif p.dim() == 2:
                fan_out, fan_in = p.shape
                std = (2.0 / (fan_in + fan_out)) ** 0.5
                p.copy_(std * torch.randn(p.shape, generator=generator))
            elif name.split(".")[-2].startswith("ln") and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.zero_()


def _probe_depth_ratio(subject, case):
    """Run the depth experiment on the grader's seeds, two ways: the student's
    own last_block_ratio(depth, seeds), and the probe's loop over the same
    models with the student's TinyLM and grad_norms_by_layer. Only raw
    numbers come back; the grader reruns the experiment with its reference
    pieces on the same seeds and compares."""
    torch = _torch()
    last_block_ratio, TinyLM, grad_norms_by_layer = subject
    d, heads, vocab = int(case["d_model"]), int(case["n_heads"]), int(case["vocab"])
    seq_len = case["inputs"].shape[-1]
    seeds = tuple(int(seed) for seed in case["seeds"])
    depths = [int(depth) for depth in case["depths"]]
    ratios = np.array([float(last_block_ratio(depth, seeds)) for depth in depths])
    last = np.zeros((2, len(depths), len(seeds)))  # pre/post, depth, seed
    for k, position in enumerate(("pre", "post")):
        for i, depth in enumerate(depths):
            for j, seed in enumerate(seeds):
                model = TinyLM(vocab, d, depth, heads, position, d_ff=4 * d,
                               max_len=seq_len)
                init_like_xiong(model, seed)
                batch = (torch.from_numpy(case["inputs"][j].copy()),
                         torch.from_numpy(case["targets"][j].copy()))
                norms = [float(v) for v in grad_norms_by_layer(model, batch)]
                if len(norms) != depth:
                    raise ValueError(f"{len(norms)} gradient norms for a model of {depth} blocks")
                last[k, i, j] = norms[-1]
    return {"ratios": ratios, "last_layer_norms": last}


def check_depth_ratio(last_block_ratio, TinyLM, grad_norms_by_layer):
    """Check the depth experiment on seeds the grader picks: your
    last_block_ratio(depth, seeds), and the last-block gradient norms of your
    TinyLM measured with your grad_norms_by_layer, must both match the same
    experiment run with the reference blocks."""
    run_check("blocks_depth_ratio", (last_block_ratio, TinyLM, grad_norms_by_layer),
              _probe_depth_ratio)


ADA_LN_CONTRACT = "to_scale_shift.weight (2 * d_model, d_cond), to_scale_shift.bias (2 * d_model,)"


def _probe_ada_ln(AdaLN, case):
    torch = _torch()
    d, d_cond = int(case["d_model"]), int(case["d_cond"])
    layer = AdaLN(d, d_cond)
    layer.double()
    with torch.no_grad():  # a new layer, before any weights are loaded
        fresh = layer(torch.from_numpy(case["x"].copy()), torch.from_numpy(case["cond"].copy()))
    params = _load_by_contract(layer, _weights(case), "your AdaLN",
                               f"The contract is: {ADA_LN_CONTRACT}; the LayerNorm inside "
                               "has no parameters of its own.")
    result = _forward_backward(layer, params, [case["x"], case["cond"]], case["dy"])
    result["y_fresh"] = fresh
    return result


def check_ada_ln(AdaLN):
    """Check AdaLN(d_model, d_cond): forward(x, cond) and its gradients."""
    run_check("blocks_ada_ln", AdaLN, _probe_ada_ln)
