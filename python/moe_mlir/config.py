"""`LayerConfig`: the static description of one MoE layer.

Shared by the NumPy reference (`reference.py`), the MLIR text emitter (`mlir_text.py`) and the
CPU runner (`cpu.py`). Sizes follow docs/dialect.md: `T` tokens, `d` hidden, `n` expert FFN,
`E` experts, `k` experts per token, `m` shared-expert FFN (0 = no shared expert).
"""

from __future__ import annotations

import dataclasses
import math
from typing import List, Optional, Tuple

SCORINGS = ("softmax", "sigmoid")
ACTIVATIONS = ("swiglu", "gelu", "silu", "gelu_tanh")
DTYPES = ("f32", "bf16", "f16")
I32_MAX = 2**31 - 1

# Numeric codes of the CPU kernels (docs/cpu-path.md §1).
SCORING_CODES = {"softmax": 0, "sigmoid": 1}
ACTIVATION_CODES = {"swiglu": 0, "gelu": 1, "silu": 2, "gelu_tanh": 3}


def capacity_for(capacity_factor: Optional[float], tokens: int, top_k: int, experts: int) -> int:
    """Pairs an expert keeps: `ceil(capacity_factor * T * k / E)`, or `T * k` when dropless.

    Evaluated left to right in double precision and bounded by `T * k`, as the conversion
    does (a larger capacity never matters).
    """
    pairs = tokens * top_k
    if capacity_factor is None:
        return pairs
    return int(min(math.ceil(float(capacity_factor) * tokens * top_k / experts), pairs))


@dataclasses.dataclass
class LayerConfig:
    tokens: int
    hidden: int
    ffn: int
    experts: int
    top_k: int
    scoring: str = "softmax"
    renormalize: bool = False
    num_groups: int = 1
    topk_groups: int = 1
    scaling_factor: float = 1.0
    # the router's logits rounded to the activations' type (bf16) before scoring, as a
    # bf16 nn.Linear router has them (HF Mixtral, Qwen3-MoE, OLMoE)
    round_logits: bool = False
    router_bias: bool = False
    # gpt-oss's expert biases: b_gate_up [E, G] added before the activation and b_down
    # [E, d] after the down projection, inside each routed expert (the shared expert has none)
    expert_bias: bool = False
    shared_ffn: int = 0
    activation: str = "swiglu"
    capacity_factor: Optional[float] = None
    dtype: str = "f32"

    # ------------------------------------------------------------------ checks
    def validate(self) -> "LayerConfig":
        """Raises ValueError naming the first impossible setting; returns self."""

        def need_int(name: str, lo: int) -> int:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            if value < lo:
                raise ValueError(f"{name} must be at least {lo}, got {value}")
            return value

        tokens = need_int("tokens", 0)
        need_int("hidden", 1)
        need_int("ffn", 1)
        experts = need_int("experts", 1)
        top_k = need_int("top_k", 1)
        groups = need_int("num_groups", 1)
        topk_groups = need_int("topk_groups", 1)
        need_int("shared_ffn", 0)
        if self.scoring not in SCORINGS:
            raise ValueError(f"scoring must be one of {SCORINGS}, got {self.scoring!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        for name in ("renormalize", "round_logits", "router_bias", "expert_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if experts >= I32_MAX:
            raise ValueError(
                f"the number of experts ({experts}) exceeds the i32 expert index range"
            )
        if top_k > experts:
            raise ValueError(f"top_k ({top_k}) exceeds the number of experts ({experts})")
        if experts % groups != 0:
            raise ValueError(f"num_groups ({groups}) must divide the number of experts ({experts})")
        if topk_groups > groups:
            raise ValueError(
                f"topk_groups must be in [1, num_groups = {groups}], got {topk_groups}"
            )
        candidates = topk_groups * (experts // groups)
        if top_k > candidates:
            raise ValueError(
                f"top_k ({top_k}) exceeds the {candidates} experts of the topk_groups "
                f"({topk_groups}) best groups"
            )
        if tokens * top_k > I32_MAX:
            raise ValueError(f"T * k ({tokens} * {top_k}) exceeds the i32 row index range")
        try:
            scaling = float(self.scaling_factor)
        except (TypeError, ValueError):
            raise ValueError(
                f"scaling_factor must be a number, got {self.scaling_factor!r}"
            ) from None
        if not math.isfinite(scaling) or scaling <= 0.0:
            raise ValueError(
                f"scaling_factor must be a positive finite number, got {self.scaling_factor!r}"
            )
        if self.capacity_factor is not None:
            try:
                cf = float(self.capacity_factor)
            except (TypeError, ValueError):
                raise ValueError(
                    f"capacity_factor must be a number or None, got {self.capacity_factor!r}"
                ) from None
            if not math.isfinite(cf) or cf <= 0.0:
                raise ValueError(
                    f"capacity_factor must be positive and finite (or None for dropless), "
                    f"got {self.capacity_factor!r}"
                )
        return self

    # ------------------------------------------------------------ derived sizes
    @property
    def gated(self) -> bool:
        return self.activation == "swiglu"

    @property
    def gate_up_width(self) -> int:
        """G: last dimension of w_gate_up (2n for swiglu, n otherwise)."""
        return 2 * self.ffn if self.gated else self.ffn

    @property
    def shared_gate_up_width(self) -> int:
        return 2 * self.shared_ffn if self.gated else self.shared_ffn

    @property
    def rows(self) -> int:
        """R = T * k."""
        return self.tokens * self.top_k

    @property
    def capacity(self) -> int:
        return capacity_for(self.capacity_factor, self.tokens, self.top_k, self.experts)

    @property
    def has_shared(self) -> bool:
        return self.shared_ffn > 0

    def arg_specs(self) -> List[Tuple[str, Tuple[int, ...], str]]:
        """(name, shape, element type) of the layer function's arguments, in order:
        x, w_router, [router_bias], w_gate_up, w_down, [shared_gate_up, shared_down],
        [b_gate_up, b_down]."""
        T, d, n, E = self.tokens, self.hidden, self.ffn, self.experts
        dt = self.dtype
        specs = [("x", (T, d), dt), ("w_router", (d, E), dt)]
        if self.router_bias:
            specs.append(("router_bias", (E,), "f32"))
        specs.append(("w_gate_up", (E, d, self.gate_up_width), dt))
        specs.append(("w_down", (E, n, d), dt))
        if self.has_shared:
            specs.append(("shared_gate_up", (d, self.shared_gate_up_width), dt))
            specs.append(("shared_down", (self.shared_ffn, d), dt))
        if self.expert_bias:
            specs.append(("b_gate_up", (E, self.gate_up_width), dt))
            specs.append(("b_down", (E, d), dt))
        return specs

    def result_specs(self) -> List[Tuple[str, Tuple[int, ...], str]]:
        """(name, shape, element type) of the layer's results: out and the router logits."""
        return [
            ("out", (self.tokens, self.hidden), self.dtype),
            ("logits", (self.tokens, self.experts), "f32"),
        ]

    def arg_names(self) -> List[str]:
        return [name for name, _, _ in self.arg_specs()]
