"""HF's auxiliary loss through swapped blocks: with `output_router_logits=True` the model's
OutputRecorder (a forward hook on the block's router module, whose forward the compiled layer
does not call) receives the layer's router logits, so HF's load_balancing_loss_func, the
total loss and the router weights' gradients match the unswapped model (tiny random-init
Mixtral, Qwen3-MoE and OLMoE, f32, CPU path). CI installs torch and transformers
(scripts/install-deps.sh): there a missing one fails instead of skipping."""

import copy
import os

import pytest

try:
    import torch
    import transformers
except ImportError:  # pragma: no cover - depends on the machine
    if os.environ.get("CI"):
        raise
    pytest.skip(
        "needs torch and transformers (scripts/install-deps.sh installs them)",
        allow_module_level=True,
    )

from moe_mlir import hf  # noqa: E402


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MOE_MLIR_CACHE", str(tmp_path_factory.getbasetemp() / "hf_cache"))
    monkeypatch.delenv("MOE_MLIR_PREBUILT", raising=False)
    monkeypatch.setenv("MOE_MLIR_QUIET", "1")


COMMON = dict(
    vocab_size=96,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
    output_router_logits=True,
    router_aux_loss_coef=0.5,
)


def make(family):
    t = transformers
    if family == "mixtral":
        cfg = t.MixtralConfig(
            **COMMON, intermediate_size=24, num_local_experts=4, num_experts_per_tok=2
        )
        model = t.MixtralForCausalLM(cfg)
    elif family == "qwen3":
        cfg = t.Qwen3MoeConfig(
            **COMMON,
            head_dim=8,
            moe_intermediate_size=16,
            intermediate_size=40,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
        )
        model = t.Qwen3MoeForCausalLM(cfg)
    else:
        cfg = t.OlmoeConfig(**COMMON, intermediate_size=16, num_experts=8, num_experts_per_tok=3)
        model = t.OlmoeForCausalLM(cfg)
    # routers far from uniform, so the loss and its gradient are not near their minimum
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    return model


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def run(model, ids, mask=None):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize("hooked_first", [False, True])
@pytest.mark.parametrize("family", ["mixtral", "qwen3", "olmoe"])
def test_aux_loss_matches_unswapped_model(family, hooked_first):
    """hooked_first: the model recorded router logits before the swap (HF installs its
    hooks once, on the router modules, which the swapped layer keeps)."""
    torch.manual_seed(0)
    model = make(family)
    ids = torch.randint(0, 96, (2, 11))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # padding: HF's loss weighs tokens by the mask
    reference = copy.deepcopy(model)
    if hooked_first:
        model(input_ids=ids)
    ref, ref_grads = run(reference, ids, mask)
    assert ref.aux_loss is not None and float(ref.aux_loss.detach()) > 0
    hf.replace_moe_blocks(model)
    out, grads = run(model, ids, mask)
    assert out.router_logits is not None and len(out.router_logits) == 2
    for ours, theirs in zip(out.router_logits, ref.router_logits):
        assert ours.shape == theirs.shape and rel(ours, theirs) <= 1e-5
    assert rel(out.aux_loss, ref.aux_loss) <= 1e-5
    assert rel(out.loss, ref.loss) <= 1e-5
    assert set(grads) == set(ref_grads)
    for name, g in ref_grads.items():
        assert rel(grads[name], g) <= 1e-4, name
    # the aux loss's share of a router's gradient is large enough to be checked above
    without = copy.deepcopy(reference)
    without.config.router_aux_loss_coef = 0.0
    without.router_aux_loss_coef = 0.0
    _, plain = run(without, ids, mask)
    name = "model.layers.0.mlp.gate.weight"
    assert rel(plain[name], ref_grads[name]) > 1e-2


def test_router_hooks_see_the_layer_logits():
    """A forward hook of the user's on the router module gets the block's input rows and
    the router's (logits, None, None); the layer still returns y alone."""
    torch.manual_seed(1)
    model = make("mixtral")
    model.config.output_router_logits = False
    block = model.model.layers[0].mlp
    x = torch.randn(2, 5, 32)
    expected = block.gate(x)[0].detach()
    seen = []
    block.gate.register_forward_hook(lambda m, args, out: seen.append((args[0], out)))
    block.gate.register_forward_hook(
        lambda m, args, kwargs, out: seen.append((kwargs, out)), with_kwargs=True
    )
    seen.clear()
    layer = hf.from_hf_block(block)
    y = layer(x)
    assert isinstance(y, torch.Tensor) and y.shape == x.shape
    (rows, out), (kwargs, out2) = seen
    assert torch.equal(rows, x.reshape(-1, 32)) and kwargs == {}
    assert out[1] is None and out[2] is None and out2[0] is out[0]
    assert rel(out[0], expected) <= 1e-5
    y, logits = layer(x, return_router_logits=True)
    assert torch.equal(logits, seen[-1][1][0])


def test_no_hooks_without_recording():
    """Without output_router_logits the swapped model's loss is the unswapped one's and no
    router_logits come back."""
    torch.manual_seed(2)
    model = make("qwen3")
    model.config.output_router_logits = False
    ids = torch.randint(0, 96, (2, 7))
    ref = copy.deepcopy(model)(input_ids=ids, labels=ids)
    hf.replace_moe_blocks(model)
    out = model(input_ids=ids, labels=ids)
    assert out.aux_loss is None and not out.router_logits
    assert rel(out.loss, ref.loss) <= 1e-5
