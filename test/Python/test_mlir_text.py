"""The layer text emitter (python/moe_mlir/mlir_text.py), checked with moe-opt --moe-decompose."""

import pytest

from moe_mlir import cpu
from moe_mlir.config import LayerConfig
from moe_mlir.mlir_text import layer_mlir, mlir_float, routing_attr


def test_float_literals_have_a_decimal_point():
    assert mlir_float(2.5) == "2.5"
    assert mlir_float(1) == "1.0"
    assert mlir_float(1e-5) == "1.0e-05"
    assert mlir_float(1.5e20) == "1.5e+20"
    assert mlir_float(0.1) == "0.1"
    with pytest.raises(ValueError):
        mlir_float(float("nan"))


def test_routing_attr_elides_defaults():
    cfg = LayerConfig(tokens=1, hidden=2, ffn=2, experts=4, top_k=2)
    assert routing_attr(cfg) == "#moe.routing<scoring = softmax, top_k = 2>"
    cfg = LayerConfig(
        tokens=1,
        hidden=2,
        ffn=2,
        experts=8,
        top_k=2,
        scoring="sigmoid",
        renormalize=True,
        num_groups=4,
        topk_groups=2,
        scaling_factor=2.5,
    )
    assert routing_attr(cfg) == (
        "#moe.routing<scoring = sigmoid, top_k = 2, renormalize = "
        "true, num_groups = 4, topk_groups = 2, scaling_factor = 2.5>"
    )


def test_layer_text_shape():
    cfg = LayerConfig(
        tokens=37, hidden=48, ffn=40, experts=5, top_k=1, activation="gelu", capacity_factor=1.25
    )
    text = layer_mlir(cfg, "layer_gelu_capacity")
    assert "func.func @layer_gelu_capacity(" in text
    assert "%w_gate_up: tensor<5x48x40xf32>" in text
    assert "capacity_factor = 1.25 : f64" in text
    assert "-> (tensor<37x48xf32>, tensor<37x5xf32>)" in text
    sig = cpu.parse_functions(text)["layer_gelu_capacity"]
    assert [t.shape for t in sig.inputs] == [s for _, s, _ in cfg.arg_specs()]


def test_invalid_config_or_name_is_rejected():
    with pytest.raises(ValueError, match="exceeds the number of experts"):
        layer_mlir(LayerConfig(tokens=1, hidden=2, ffn=2, experts=2, top_k=3))
    with pytest.raises(ValueError, match="function name"):
        layer_mlir(LayerConfig(tokens=1, hidden=2, ffn=2, experts=2, top_k=1), "bad name")


CONFIGS = [
    LayerConfig(tokens=37, hidden=48, ffn=40, experts=5, top_k=2, renormalize=True),
    LayerConfig(tokens=1, hidden=48, ffn=40, experts=5, top_k=5),
    LayerConfig(
        tokens=37,
        hidden=48,
        ffn=40,
        experts=6,
        top_k=3,
        scoring="sigmoid",
        renormalize=True,
        num_groups=3,
        topk_groups=2,
        scaling_factor=2.5,
        router_bias=True,
        shared_ffn=24,
    ),
    LayerConfig(
        tokens=1000,
        hidden=48,
        ffn=40,
        experts=5,
        top_k=1,
        activation="silu",
        capacity_factor=1.0e-5,
    ),
    LayerConfig(
        tokens=16,
        hidden=32,
        ffn=8,
        experts=8,
        top_k=2,
        activation="gelu",
        shared_ffn=8,
        capacity_factor=1.25,
        dtype="bf16",
    ),
    LayerConfig(tokens=16, hidden=32, ffn=8, experts=8, top_k=2, dtype="f16", scaling_factor=1e-3),
]


@pytest.mark.parametrize("index", range(len(CONFIGS)))
def test_moe_opt_accepts_and_decomposes(index):
    try:
        tool = cpu.find_moe_opt()
    except cpu.ToolError as exc:
        pytest.skip(str(exc))
    cfg = CONFIGS[index]
    text = layer_mlir(cfg, f"layer{index}")
    out = cpu.run_opt(text, ["--moe-decompose"], tool)
    assert "moe.layer" not in out
    for op in ("moe.router", "moe.dispatch", "moe.expert_ffn", "moe.combine"):
        assert op in out
    assert ("moe.shared_expert" in out) == cfg.has_shared
    assert ("bias(" in out) == cfg.router_bias
    assert ("capacity_factor" in out) == (cfg.capacity_factor is not None)
    assert f"top_k = {cfg.top_k}" in out
    assert f"activation = #moe.activation<{cfg.activation}>" in out
    sig = cpu.parse_functions(out)[f"layer{index}"]
    assert [t.shape for t in sig.inputs] == [s for _, s, _ in cfg.arg_specs()]
    assert [t.element for t in sig.inputs] == [e for _, _, e in cfg.arg_specs()]
    assert [t.shape for t in sig.results] == [s for _, s, _ in cfg.result_specs()]
    # the text round-trips through the parser unchanged in meaning
    assert cpu.run_opt(out, [], tool) == out
