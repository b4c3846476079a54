"""The GPU path's contract, python/moe_mlir/gpu_contract.json: check_gpu_config refuses what
it rules out, naming the limit and its reason, and takes the benchmark layers; the manifest
parser keeps gpu_limits; the header generator reads the file and refuses a malformed one."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from moe_mlir import config as config_module
from moe_mlir.config import LayerConfig
from moe_mlir.gpu import Manifest

torch = pytest.importorskip("torch")
from moe_mlir import layer as L  # noqa: E402 (needs torch)

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "python" / "moe_mlir" / "gpu_contract.json"
GENERATOR = ROOT / "lib" / "Conversion" / "MoEToGPU" / "gen_gpu_contract.py"
# The four benchmark layers (bench/bench.py DEFAULT_LAYERS), read from their examples.
BENCH_EXAMPLES = ["mixtral-8x7b", "olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-v3"]


def contract():
    return json.loads(CONTRACT.read_text())


def reason(limit):
    return contract()["limits"][limit]["reason"]


def refused(cfg):
    with pytest.raises(NotImplementedError) as info:
        L.check_gpu_config(cfg)
    return str(info.value)


def test_the_module_reads_the_file():
    assert L.gpu_contract() == contract()
    limits = contract()["limits"]
    assert L.GPU_DTYPE == torch.bfloat16 and limits["data_dtype"]["value"] == "bf16"
    assert set(limits["activations"]["value"]) <= set(config_module.ACTIVATIONS)
    assert limits["data_dtype"]["value"] in config_module.DTYPES
    assert set(limits["tile_multiple"]["applies_to"]) <= set(L._CONTRACT_SIZES)
    assert set(limits["max_width"]["applies_to"]) <= set(L._CONTRACT_SIZES)


@pytest.mark.parametrize(
    "kw, limit, what",
    [
        (dict(experts=1025), "max_experts", "experts = 1025 is over 1024"),
        (
            dict(experts=256, num_groups=128, topk_groups=2),
            "max_expert_groups",
            "num_groups = 128 is over 64",
        ),
        (dict(hidden=65600), "max_width", "hidden (d) = 65600 is over 65536"),
        (dict(ffn=100), "tile_multiple", "ffn (n) = 100 is not a multiple of 64"),
        (dict(shared_ffn=96), "tile_multiple", "shared_ffn (m) = 96 is not a multiple of 64"),
    ],
)
def test_refuses_what_the_contract_rules_out(kw, limit, what):
    base = dict(tokens=0, hidden=128, ffn=128, experts=8, top_k=2)
    cfg = LayerConfig(**{**base, **kw}).validate()
    message = refused(cfg)
    assert what in message
    assert f"({limit}: {reason(limit)})" in message
    assert message.startswith("the CUDA path of moe_mlir does not run this layer: ")


def test_names_every_broken_limit():
    message = refused(LayerConfig(0, 96, 100, 2048, 2, capacity_factor=1.25))
    for limit in ("tile_multiple", "max_experts"):
        assert f"({limit}: " in message
    assert "hidden (d) = 96" in message and "ffn (n) = 100" in message
    assert "capacity_factor" not in message


def test_accepts_a_capacity_factor():
    assert contract()["limits"]["capacity_factor_supported"]["value"] is True
    for factor in (0.5, 1.0, 1.25):
        L.check_gpu_config(LayerConfig(0, 128, 128, 8, 2, capacity_factor=factor).validate())


def example_config(name):
    """The LayerConfig of examples/NAME.mlir: sizes from the layer function's argument types,
    routing from its #moe.routing."""
    text = (ROOT / "examples" / f"{name}.mlir").read_text()
    args = dict(re.findall(r"%(\w+): tensor<([0-9x]+)x(?:bf16|f32)>", text))

    def dims(arg):
        return [int(v) for v in args[arg].split("x")]

    tokens, hidden = dims("x")
    experts, ffn, _ = dims("w_down")
    routing = re.search(r"#moe\.routing<([^>]*)>", text).group(1)
    fields = dict(re.findall(r"(\w+) = ([\w.]+)", routing))
    return LayerConfig(
        tokens=tokens,
        hidden=hidden,
        ffn=ffn,
        experts=experts,
        top_k=int(fields["top_k"]),
        scoring=fields.get("scoring", "softmax"),
        renormalize=fields.get("renormalize") == "true",
        num_groups=int(fields.get("num_groups", 1)),
        topk_groups=int(fields.get("topk_groups", 1)),
        scaling_factor=float(fields.get("scaling_factor", 1.0)),
        router_bias="router_bias" in args,
        shared_ffn=dims("shared_down")[0] if "shared_down" in args else 0,
        dtype="bf16",
    ).validate()


@pytest.mark.parametrize("name", BENCH_EXAMPLES)
def test_takes_the_benchmark_layers(name):
    cfg = example_config(name)
    L.check_gpu_config(cfg)
    if name == "deepseek-v3":
        assert (cfg.experts, cfg.num_groups, cfg.shared_ffn) == (256, 8, 2048)


def test_manifest_keeps_gpu_limits():
    limits = contract()["limits"]
    entry = {
        "symbol": "f_forward",
        "workspace_symbol": "f_forward_workspace_bytes",
        "params": [{"name": "arg0", "role": "input", "dtype": "bf16", "shape": [4, 64]}],
    }
    base = {"name": "f", "chip": "sm_90a", "layer": {}, "entry_points": {"forward": entry}}
    assert Manifest.from_dict({**base, "gpu_limits": limits}).gpu_limits == limits
    assert Manifest.from_dict(base).gpu_limits == {}
    with pytest.raises(ValueError, match="gpu_limits must be an object"):
        Manifest.from_dict({**base, "gpu_limits": [1]})
    # The SM count the layer was compiled for.
    assert Manifest.from_dict({**base, "num_sms": 114}).num_sms == 114
    assert Manifest.from_dict(base).num_sms == 0
    for bad in (-1, "132", True):
        with pytest.raises(ValueError, match="num_sms must be a non-negative integer"):
            Manifest.from_dict({**base, "num_sms": bad})


def generate(tmp_path, data):
    source = tmp_path / "contract.json"
    source.write_text(data if isinstance(data, str) else json.dumps(data))
    return subprocess.run(
        [sys.executable, str(GENERATOR), str(source), "-o", str(tmp_path / "out.h.inc")],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_generator_writes_every_limit_and_function(tmp_path):
    result = generate(tmp_path, contract())
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "out.h.inc").read_text()
    assert "inline constexpr int64_t kMaxExperts = 1024;" in text
    assert (
        'inline constexpr llvm::StringLiteral kActivations[] = {"swiglu", "silu", "gelu",'
        ' "gelu_tanh"};' in text
    )
    assert "inline constexpr bool kCapacityFactorSupported = true;" in text
    for name in contract()["limits"]:
        assert f'{{"{name}", GPULimit::Kind::' in text
    for function in contract()["host_functions"]:
        assert f'{{"{function["name"]}", "{function["op"]}",' in text


@pytest.mark.parametrize(
    "change, error",
    [
        (lambda d: d["limits"]["max_experts"].update(unit="experts"), "unknown keys"),
        (lambda d: d["limits"]["max_experts"].pop("reason"), "lacks"),
        (lambda d: d["limits"]["max_experts"].update(value=1.5), "must be an integer"),
        (lambda d: d["host_functions"].append(d["host_functions"][0]), "twice"),
        (
            lambda d: d["host_functions"][0].update(name="__moe_gpu_router__moe_gemm_x"),
            "not a library host function name",
        ),
        (lambda d: d["limits"]["max_experts"].update(reason='a "quoted"\nline'), "one line"),
    ],
)
def test_generator_refuses_a_malformed_contract(tmp_path, change, error):
    data = contract()
    change(data)
    result = generate(tmp_path, data)
    assert result.returncode == 1
    assert error in result.stderr
    assert not (tmp_path / "out.h.inc").exists()


def test_generator_refuses_duplicate_keys(tmp_path):
    text = CONTRACT.read_text().replace('"chip": "sm_90a",', '"chip": "sm_90a", "chip": "sm_80",')
    result = generate(tmp_path, text)
    assert result.returncode == 1 and "twice" in result.stderr
