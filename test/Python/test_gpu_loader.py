"""python/moe_mlir/gpu.py without a GPU: the manifest, the argument checks, and the calling
convention against a C stand-in for a compiled layer (CPU tensors, null stream).

The torch parts skip when torch is missing (CI has none); nothing here needs CUDA.
"""

import copy
import json
import shutil
import subprocess

import pytest

from moe_mlir import gpu

T, D, E, K = 4, 8, 4, 2

MANIFEST = {
    "name": "fake_layer",
    "chip": "sm_90a",
    "compiler": "test",
    "layer": {
        "T": T,
        "d": D,
        "n": 64,
        "E": E,
        "k": K,
        "activation": "swiglu",
        "scoring": "softmax",
        "renormalize": True,
        "num_groups": 1,
        "topk_groups": 1,
        "scaling_factor": 1.0,
        "has_bias": False,
        "shared_n": 0,
        "inputs": {"x": "arg0", "w_router": "arg1"},
    },
    "entry_points": {
        "forward": {
            "symbol": "fake_layer_forward",
            "workspace_symbol": "fake_layer_forward_workspace_bytes",
            "params": [
                {"name": "arg0", "role": "input", "dtype": "f32", "shape": [T, D]},
                {"name": "arg1", "role": "input", "dtype": "f32", "shape": [D, E]},
                {"name": "result0", "role": "output", "dtype": "f32", "shape": [T, D]},
                {"name": "result1", "role": "output", "dtype": "f32", "shape": [T, E]},
                {"name": "moe.router.experts", "role": "saved", "dtype": "i32", "shape": [T, K]},
            ],
        },
        "backward": {
            "symbol": "fake_layer_backward",
            "workspace_symbol": "fake_layer_backward_workspace_bytes",
            "params": [
                {
                    "name": "arg0",
                    "role": "saved",
                    "forward_param": "arg0",
                    "dtype": "f32",
                    "shape": [T, D],
                },
                {
                    "name": "moe.router.experts",
                    "role": "saved",
                    "forward_param": "moe.router.experts",
                    "dtype": "i32",
                    "shape": [T, K],
                },
                {
                    "name": "d_result0",
                    "role": "cotangent",
                    "of": "result0",
                    "dtype": "f32",
                    "shape": [T, D],
                },
                {
                    "name": "d_result1",
                    "role": "cotangent",
                    "of": "result1",
                    "dtype": "f32",
                    "shape": [T, E],
                },
                {
                    "name": "d_arg0",
                    "role": "gradient",
                    "of": "arg0",
                    "dtype": "f32",
                    "shape": [T, D],
                },
                {
                    "name": "d_arg1",
                    "role": "gradient",
                    "of": "arg1",
                    "dtype": "f32",
                    "shape": [D, E],
                },
            ],
        },
    },
}

# The stand-in: result0 = 2*x; result1[t, e] = x[t, 0] + e; experts[t, j] = (t + j) % E;
# d_arg0 = 3*d_result0 + experts[t, 0]; d_arg1 = sum over t of d_result1 (row e = column sum).
# x[0] == -1 makes the forward fail like a refused argument. `tokens` is the static T's
# #define and workspace functions (STATIC_TOKENS) or a dynamic T's (DYNAMIC_TOKENS), whose
# entry points take T after the stream (`token_param`).
FAKE_C = r"""
#include <stddef.h>
#include <stdint.h>
#define D %(D)d
#define E %(E)d
#define K %(K)d
%(tokens)s
static const char *message = "";
void *last_stream = (void *)1;
int64_t last_tokens = 0;
const char *moeGetLastErrorMessage(void) { return message; }
const char *moeStatusString(int s) { return s == 3 ? "MOE_ERROR_INVALID_ARGUMENT" : "OTHER"; }
int moeSetDevice(int d) { (void)d; return 0; }
int fake_layer_forward(void *stream%(token_param)s, float *x, float *wr, float *out,
                       float *logits, int32_t *experts) {
  last_stream = stream;
  last_tokens = T;
  (void)wr;
  if (x[0] == -1.0f) { message = "fake_layer_forward: arg0 is refused"; return 3; }
  for (int i = 0; i < T * D; ++i) out[i] = 2 * x[i];
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) logits[t * E + e] = x[t * D] + e;
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j) experts[t * K + j] = (t + j) %% E;
  return 0;
}
int fake_layer_backward(void *stream%(token_param)s, float *x, int32_t *experts, float *dout,
                        float *dlogits, float *dx, float *dwr) {
  last_stream = stream;
  last_tokens = T;
  (void)x;
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < D; ++i) dx[t * D + i] = 3 * dout[t * D + i] + experts[t * K];
  for (int i = 0; i < D; ++i)
    for (int e = 0; e < E; ++e) {
      float s = 0;
      for (int t = 0; t < T; ++t) s += dlogits[t * E + e];
      dwr[i * E + e] = s;
    }
  return 0;
}
"""
STATIC_TOKENS = f"""#define T {T}
size_t fake_layer_forward_workspace_bytes(void) {{ return 12345; }}
size_t fake_layer_backward_workspace_bytes(void) {{ return 678; }}"""


def write_manifest(tmp_path, data, name="fake_layer.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


# --------------------------------------------------------------------------- manifest


def test_manifest_parses(tmp_path):
    m = gpu.Manifest.load(write_manifest(tmp_path, MANIFEST))
    assert m.name == "fake_layer"
    assert m.forward.symbol == "fake_layer_forward"
    assert [p.name for p in m.forward.by_role("input")] == ["arg0", "arg1"]
    assert m.forward.param("result1").shape == (T, E)
    assert m.backward.param("arg0").forward_param == "arg0"
    assert m.input_name("arg1") == "w_router"
    assert m.input_name("arg9") == "arg9"
    assert m.saved_bytes() == T * K * 4
    assert m.forward.param("arg0").nbytes == T * D * 4


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda m: m.pop("name"), "has no 'name'"),
        (lambda m: m["entry_points"].pop("forward"), "no 'forward'"),
        (lambda m: m["entry_points"]["forward"]["params"][0].update(dtype="f64"), "dtype is 'f64'"),
        (
            lambda m: m["entry_points"]["forward"]["params"][0].update(role="weird"),
            "role is 'weird'",
        ),
        (
            lambda m: m["entry_points"]["forward"]["params"][0].update(shape=[4, -1]),
            "non-negative integers",
        ),
        (
            lambda m: m["entry_points"]["forward"]["params"][0].update(role="gradient"),
            "cannot have",
        ),
        (lambda m: m["entry_points"]["forward"]["params"][1].update(name="arg0"), "twice"),
        (
            lambda m: m["entry_points"]["backward"]["params"][0].update(forward_param="nope"),
            "which the forward does not have",
        ),
        (
            lambda m: m["entry_points"]["backward"]["params"][0].update(shape=[T, D + 1]),
            "but the forward's 'arg0'",
        ),
        (
            lambda m: m["entry_points"]["forward"]["params"][4].update(memory="disk"),
            "memory is 'disk', expected 'device' or 'host'",
        ),
        (
            lambda m: m["entry_points"]["forward"]["params"][0].update(memory="host"),
            "only saved tensors can be",
        ),
        # an offloaded saved tensor must be in host memory on both sides
        (
            lambda m: m["entry_points"]["forward"]["params"][4].update(memory="host"),
            "in pinned host memory but the forward's|but the forward's .* in pinned host memory",
        ),
        (
            lambda m: m["entry_points"]["backward"]["params"][2].update(of="arg0"),
            "not a forward output",
        ),
        (
            lambda m: m["entry_points"]["backward"]["params"][4].update(of="result0"),
            "not a forward input",
        ),
    ],
)
def test_manifest_errors(tmp_path, mutate, message):
    data = copy.deepcopy(MANIFEST)
    mutate(data)
    with pytest.raises(ValueError, match=message):
        gpu.Manifest.load(write_manifest(tmp_path, data))


def offloading_manifest():
    """MANIFEST with the saved experts in pinned host memory, as --policy=offload writes an
    offloaded h."""
    data = copy.deepcopy(MANIFEST)
    data["entry_points"]["forward"]["params"][4]["memory"] = "host"
    data["entry_points"]["backward"]["params"][1]["memory"] = "host"
    return data


def test_manifest_host_memory(tmp_path):
    m = gpu.Manifest.load(write_manifest(tmp_path, offloading_manifest()))
    saved = m.forward.param("moe.router.experts")
    assert saved.on_host and saved.memory == "host"
    assert "pinned host memory" in saved.describe()
    assert m.backward.param("moe.router.experts").on_host
    assert not m.forward.param("arg0").on_host


def test_host_parameter_takes_a_cpu_tensor(tmp_path):
    torch = pytest.importorskip("torch")
    m = gpu.Manifest.load(write_manifest(tmp_path, offloading_manifest()))
    spec = m.forward.param("moe.router.experts")
    gpu.check_tensor(torch.zeros(T, K, dtype=torch.int32), spec, "f", require_cuda=False)
    with pytest.raises(ValueError, match="pageable memory; the offload copies need pinned"):
        gpu.check_tensor(torch.zeros(T, K, dtype=torch.int32), spec, "f", require_cuda=True)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="expected pinned host memory"):
            gpu.check_tensor(torch.zeros(T, K, dtype=torch.int32, device="cuda"), spec, "f")


def test_manifest_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        gpu.Manifest.load(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        gpu.Manifest.load(str(bad))


def test_no_backward_entry(tmp_path):
    data = copy.deepcopy(MANIFEST)
    del data["entry_points"]["backward"]
    m = gpu.Manifest.load(write_manifest(tmp_path, data))
    with pytest.raises(ValueError, match="without a backward"):
        m.entry("backward")


def test_missing_library(tmp_path):
    manifest = write_manifest(tmp_path, MANIFEST)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        gpu.CompiledLayer(str(tmp_path / "fake_layer.so"), manifest)


def test_unknown_dtype_name():
    with pytest.raises(ValueError, match="unknown element type"):
        gpu.element_size("f8")
    assert gpu.element_size("bf16") == 2


# --------------------------------------------------------------------------- arguments

torch = None


def need_torch():
    global torch
    torch = pytest.importorskip("torch")
    return torch


def manifest_only(tmp_path, require_cuda=True):
    return gpu.CompiledLayer(None, write_manifest(tmp_path, MANIFEST), require_cuda=require_cuda)


def good_inputs():
    return {"x": torch.randn(T, D), "w_router": torch.randn(D, E)}


def test_torch_dtype_map():
    need_torch()
    assert gpu.torch_dtype("bf16") is torch.bfloat16
    assert gpu.torch_dtype("f32") is torch.float32
    assert gpu.torch_dtype("i32") is torch.int32


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda a: a.update(x=a["x"].double()), TypeError, "dtype torch.float64, expected"),
        (lambda a: a.update(x=a["x"][:, :4]), ValueError, r"shape \(4, 4\), expected \(4, 8\)"),
        (lambda a: a.update(x=torch.randn(D, T).t()), ValueError, "not contiguous"),
        (lambda a: a.update(x=[[0.0]]), TypeError, "must be a torch.Tensor"),
        (lambda a: a.pop("w_router"), ValueError, r"missing w_router \(arg1\)"),
        (lambda a: a.update(w_routr=a.pop("w_router")), ValueError, "unknown argument 'w_routr'"),
    ],
)
def test_argument_errors_before_any_call(tmp_path, change, error, message):
    need_torch()
    layer = manifest_only(tmp_path)
    args = good_inputs()
    change(args)
    with pytest.raises(error, match=message):
        layer.forward(args)


def test_cpu_tensor_is_refused(tmp_path):
    need_torch()
    layer = manifest_only(tmp_path)
    with pytest.raises(ValueError, match="is on cpu, expected a CUDA device"):
        layer.forward(good_inputs())


def test_misaligned_view_is_refused(tmp_path):
    need_torch()
    layer = manifest_only(tmp_path, require_cuda=False)
    base = torch.randn(T * D + 1)
    args = good_inputs()
    args["x"] = base[1:].view(T, D)  # 4 bytes off the allocation
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        layer.forward(args)


def test_list_inputs_count(tmp_path):
    need_torch()
    layer = manifest_only(tmp_path, require_cuda=False)
    with pytest.raises(ValueError, match="1 tensors given, expected 2"):
        layer.forward([torch.randn(T, D)])


def test_manifest_only_layer_cannot_run(tmp_path):
    need_torch()
    layer = manifest_only(tmp_path, require_cuda=False)
    with pytest.raises(RuntimeError, match="no library loaded"):
        layer.forward(good_inputs())


# --------------------------------------------------------------------------- a stand-in


def build_fake_layer(tmp_path, manifest, dynamic=False):
    """The stand-in compiled and loaded with `manifest`; `dynamic`: its entry points take T."""
    need_torch()
    cc = shutil.which("cc") or shutil.which("clang-22") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "fake_layer.c"
    tokens = DYNAMIC_TOKENS if dynamic else STATIC_TOKENS
    token_param = ", int64_t T" if dynamic else ""
    src.write_text(FAKE_C % dict(D=D, E=E, K=K, tokens=tokens, token_param=token_param))
    so = tmp_path / "fake_layer.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(so), str(src)], check=True)
    write_manifest(tmp_path, manifest)  # fake_layer.json beside fake_layer.so
    return gpu.CompiledLayer(str(so), require_cuda=False)


@pytest.fixture
def fake_layer(tmp_path):
    return build_fake_layer(tmp_path, MANIFEST)


def test_offloaded_saved_tensor_lives_on_the_host(tmp_path):
    """A layer compiled with --policy=offload: forward allocates its offloaded saved tensor
    in host memory (pinned when it runs on CUDA), and backward takes it from there."""
    layer = build_fake_layer(tmp_path, offloading_manifest())
    x = torch.randn(T, D)
    fwd = layer.forward([x, torch.randn(D, E)])
    experts = fwd["moe.router.experts"]
    assert experts.device.type == "cpu"
    assert torch.equal(experts, (torch.arange(T)[:, None] + torch.arange(K)) % E)
    # held while the copy may still write it; after backward, until an event on the stream
    # (none without CUDA: let go at once)
    assert layer._offloads_in_flight == [experts]
    grads = layer.backward(fwd, {"result0": torch.ones(T, D)})
    assert torch.allclose(grads["d_arg0"], 3 + experts[:, :1].float())
    assert layer._offloads_in_flight == [] and layer._offloads_until == []
    fwd = layer.forward([x, torch.randn(D, E)])
    assert len(layer._offloads_in_flight) == 1
    layer.synchronize_offloads()
    assert layer._offloads_in_flight == []
    # prefetch refuses what it cannot copy from: a missing or mis-shaped saved tensor
    with pytest.raises(ValueError, match="saved has no 'moe.router.experts'"):
        layer.prefetch({})
    with pytest.raises(ValueError, match="has shape"):
        layer.prefetch({"moe.router.experts": torch.zeros(T, K + 1, dtype=torch.int32)})
    layer.prefetch(fwd)  # without CUDA: nothing to start


def test_forward_and_backward_through_the_stand_in(fake_layer):
    import ctypes

    layer = fake_layer
    assert layer.workspace_bytes("forward") == 12345
    assert layer.workspace_bytes("backward") == 678
    x = torch.randn(T, D)
    wr = torch.randn(D, E)
    fwd = layer.forward([x, wr])
    assert ctypes.c_void_p.in_dll(layer._lib, "last_stream").value is None  # null stream
    assert torch.equal(fwd["result0"], 2 * x)
    assert torch.equal(fwd["result1"], x[:, :1] + torch.arange(E).float())
    experts = fwd["moe.router.experts"]
    assert experts.dtype == torch.int32
    assert torch.equal(experts, (torch.arange(T)[:, None] + torch.arange(K)) % E)
    assert fwd["arg0"] is x  # inputs are passed through for backward

    d_out = torch.randn(T, D)
    d_logits = torch.randn(T, E)
    grads = layer.backward(fwd, {"result0": d_out, "d_result1": d_logits})
    assert set(grads) == {"d_arg0", "d_arg1"}
    assert torch.allclose(grads["d_arg0"], 3 * d_out + experts[:, :1].float())
    assert torch.allclose(grads["d_arg1"], d_logits.sum(0).expand(D, E))
    assert layer.gradient_names() == {"d_arg0": "x", "d_arg1": "w_router"}

    # A missing cotangent is zeros.
    grads = layer.backward(fwd, {"d_result0": d_out})
    assert torch.equal(grads["d_arg1"], torch.zeros(D, E))


def test_backward_argument_errors(fake_layer):
    layer = fake_layer
    fwd = layer.forward(good_inputs())
    with pytest.raises(ValueError, match="unknown cotangent 'd_out'"):
        layer.backward(fwd, {"d_out": torch.randn(T, D)})
    saved = dict(fwd)
    del saved["moe.router.experts"]
    with pytest.raises(ValueError, match="saved has no 'moe.router.experts'"):
        layer.backward(saved, {})
    saved = dict(fwd)
    saved["moe.router.experts"] = saved["moe.router.experts"].float()
    with pytest.raises(TypeError, match="expected torch.int32"):
        layer.backward(saved, {})
    with pytest.raises(TypeError, match="the dict that forward returned"):
        layer.backward([fwd["arg0"]], {})


def test_failure_raises_with_the_runtime_message(fake_layer):
    args = good_inputs()
    args["x"][0, 0] = -1.0
    with pytest.raises(
        RuntimeError,
        match="fake_layer_forward failed: "
        "MOE_ERROR_INVALID_ARGUMENT: fake_layer_forward: arg0 is refused",
    ):
        fake_layer.forward(args)


# --------------------------------------------------------------------------- dynamic T


def dynamic_manifest(bound=4):
    """MANIFEST with a dynamic token count up to `bound`: every [T, ...] size -1 with one row
    a token, the entry points' max_tokens."""
    data = copy.deepcopy(MANIFEST)
    data["layer"]["T"] = bound
    data["layer"]["max_tokens"] = bound
    for ep in data["entry_points"].values():
        ep["max_tokens"] = bound
        for p in ep["params"]:
            if p["shape"][0] == T and p["name"] not in ("arg1", "d_arg1"):
                p["shape"][0] = -1
                p["rows_per_token"] = 1
    return data


# FAKE_C with a dynamic T, a parameter of the entry points: the workspace is 400 B forward and
# 40 B backward for T in [1, 4], -1 outside.
DYNAMIC_TOKENS = """
int64_t fake_layer_forward_workspace_bytes(int64_t T) { return T < 1 || T > 4 ? -1 : 400; }
int64_t fake_layer_backward_workspace_bytes(int64_t T) { return T < 1 || T > 4 ? -1 : 40; }"""


def test_dynamic_manifest_parses(tmp_path):
    manifest = gpu.Manifest.load(write_manifest(tmp_path, dynamic_manifest()))
    assert manifest.max_tokens == 4
    x = manifest.forward.param("arg0")
    assert x.shape == (-1, D) and x.rows_per_token == 1
    assert x.describe() == f"f32[T, {D}]"
    assert x.at(3).shape == (3, D) and x.at(3).nbytes == 3 * D * 4
    assert manifest.forward.param("arg1").at(3).shape == (D, E)
    assert manifest.saved_bytes() == 4 * K * 4 and manifest.saved_bytes(2) == 2 * K * 4


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda m: m["entry_points"]["forward"]["params"][0].pop("rows_per_token"),
            "non-negative integers",
        ),
        (
            lambda m: m["entry_points"]["forward"]["params"][1].update(rows_per_token=1),
            "rows_per_token but a static shape",
        ),
        (lambda m: m["entry_points"]["forward"].pop("max_tokens"), "no max_tokens"),
        (lambda m: m["entry_points"]["forward"].update(max_tokens=-2), "max_tokens must be"),
    ],
)
def test_dynamic_manifest_errors(tmp_path, mutate, message):
    data = dynamic_manifest()
    mutate(data)
    with pytest.raises(ValueError, match=message):
        gpu.Manifest.load(write_manifest(tmp_path, data))


def test_dynamic_token_count_through_the_stand_in(tmp_path):
    import ctypes

    layer = build_fake_layer(tmp_path, dynamic_manifest(), dynamic=True)
    assert layer.workspace_bytes("forward", 3) == 400
    assert layer.workspace_bytes("forward", 5) == -1
    wr = torch.randn(D, E)
    for tokens in (1, 3, 4):
        x = torch.randn(tokens, D)
        fwd = layer.forward([x, wr])
        assert ctypes.c_int64.in_dll(layer._lib, "last_tokens").value == tokens
        assert torch.equal(fwd["result0"], 2 * x)
        experts = fwd["moe.router.experts"]
        assert experts.shape == (tokens, K)
        assert torch.equal(experts, (torch.arange(tokens)[:, None] + torch.arange(K)) % E)
        d_out = torch.randn(tokens, D)
        grads = layer.backward(fwd, {"result0": d_out})
        assert ctypes.c_int64.in_dll(layer._lib, "last_tokens").value == tokens
        assert torch.allclose(grads["d_arg0"], 3 * d_out + experts[:, :1].float())
    # T outside [1, bound] is refused before any call.
    ctypes.c_int64.in_dll(layer._lib, "last_tokens").value = 0
    for tokens in (0, 5):
        with pytest.raises(ValueError, match=rf"T = {tokens} is outside \[1, 4\]"):
            layer.forward([torch.randn(tokens, D), wr])
    assert ctypes.c_int64.in_dll(layer._lib, "last_tokens").value == 0
    # Every tensor of the call has the T of x.
    fwd = layer.forward([torch.randn(3, D), wr])
    with pytest.raises(ValueError, match="has shape"):
        layer.backward(fwd, {"result0": torch.randn(4, D)})
