"""The activation memory plan of a layer, as `moe-plan-activations` reports it (docs/memory.md).

    from moe_mlir.memory import plan_activations
    plan = plan_activations(config, memory_budget="1GiB")    # config.tokens = T
    print(plan.report())          # the remark, and the bytes of each plan
    plan.keep_bytes, plan.recompute_bytes, plan.planned_bytes, plan.plan

`MoELayer.memory_plan(tokens)` does the same for a layer. Needs moe-opt (the LLVM machine);
NumPy and the standard library only. The step's memory report under the plan:
`memory_report(plan)`; its PNG timeline: `plot_plan(plan, "plan.png")` (moe_mlir.memory_plot,
matplotlib).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

from .config import LayerConfig
from .mlir_text import layer_mlir

__all__ = ["ActivationPlan", "plan_activations", "memory_report", "plot_plan"]

_PLAN_RE = re.compile(r"activation plan '(\w+)'")
_KEEP_RE = re.compile(r"keep saves (\d+) B")
_RECOMPUTE_RE = re.compile(r"recompute saves (\d+) B (?:\([^)]*\) )?and adds ([0-9.e+]+) FLOPs")
_PLANNED_RE = re.compile(r"planned (\d+) B")


@dataclasses.dataclass
class ActivationPlan:
    config: LayerConfig
    memory_budget: Optional[str]
    policy: str
    plan: str  # keep, recompute or partial
    keep_bytes: int
    recompute_bytes: int
    recompute_flops: float
    planned_bytes: int
    remark: str

    def report(self) -> str:
        c = self.config
        gib = 1 << 30
        lines = [
            f"activation plan of T={c.tokens} d={c.hidden} n={c.ffn} E={c.experts} k={c.top_k}"
            f"{f' m={c.shared_ffn}' if c.has_shared else ''} ({c.dtype}), policy {self.policy}"
            f"{f', memory budget {self.memory_budget}' if self.memory_budget else ''}:",
            f"  plan            {self.plan}",
            f"  keep H          {self.keep_bytes:>14,d} B  {self.keep_bytes / gib:8.4f} GiB",
            f"  recompute H     {self.recompute_bytes:>14,d} B  "
            f"{self.recompute_bytes / gib:8.4f} GiB  (+{self.recompute_flops:.3g} FLOPs)",
            f"  planned         {self.planned_bytes:>14,d} B  {self.planned_bytes / gib:8.4f} GiB",
            f"  moe-opt: {self.remark}",
        ]
        return "\n".join(lines)


def plan_activations(
    config: LayerConfig,
    memory_budget: Optional[str] = None,
    policy: str = "auto",
    gpu_tflops: float = 780.0,
    opt_tool: Optional[str] = None,
) -> ActivationPlan:
    """Runs `moe-opt --moe-decompose --moe-plan-activations=...` on the layer and parses its
    remark. A budget no plan meets raises ValueError with moe-opt's message."""
    from . import cpu  # noqa: PLC0415

    if config.tokens < 1:
        raise ValueError("plan_activations needs the token count: config.tokens >= 1")
    opts = [f"policy={policy}", f"gpu-tflops={gpu_tflops}", "report=true"]
    if memory_budget is not None:
        if not isinstance(memory_budget, str):
            memory_budget = f"{int(memory_budget)}B"
        opts.insert(0, f"memory-budget={memory_budget}")
    tool = opt_tool or cpu.find_moe_opt()
    args = ["--moe-decompose", f"--moe-plan-activations={' '.join(opts)}", "-o", "/dev/null", "-"]
    import subprocess  # noqa: PLC0415

    proc = subprocess.run(
        [tool, *args], input=layer_mlir(config, "layer"), capture_output=True, text=True
    )
    text = proc.stderr
    if proc.returncode != 0:
        msg = " ".join(
            line.split("error: ", 1)[1] for line in text.splitlines() if "error: " in line
        )
        raise ValueError(f"no activation plan: {msg or text.strip()}")
    remark = next(
        (
            line.split("remark: ", 1)[1]
            for line in text.splitlines()
            if "remark: activation plan" in line
        ),
        None,
    )
    if remark is None:
        raise RuntimeError(f"moe-opt printed no activation plan remark: {text.strip()}")
    recompute = _RECOMPUTE_RE.search(remark)
    return ActivationPlan(
        config=config,
        memory_budget=memory_budget,
        policy=policy,
        plan=_PLAN_RE.search(remark).group(1),
        keep_bytes=int(_KEEP_RE.search(remark).group(1)),
        recompute_bytes=int(recompute.group(1)) if recompute else 0,
        recompute_flops=float(recompute.group(2)) if recompute else 0.0,
        planned_bytes=int(_PLANNED_RE.search(remark).group(1)),
        remark=remark,
    )


def memory_report(plan: ActivationPlan, opt_tool: Optional[str] = None) -> str:
    """The step's memory report for the plan's layer, budget and policy: moe-opt runs
    moe-decompose, moe-plan-activations, moe-generate-backward, moe-offload and
    moe-plan-memory (docs/memory.md) and prints every buffer with its size, place (an offset
    in its function's arena, returned to the caller, or apart) and lifetime, the peak, the
    arenas and the saved-for-backward total."""
    from . import cpu  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    opts = [f"policy={plan.policy}", "report=false"]
    if plan.memory_budget is not None:
        opts.insert(0, f"memory-budget={plan.memory_budget}")
    args = [
        "--moe-decompose",
        f"--moe-plan-activations={' '.join(opts)}",
        "--moe-generate-backward",
        "--moe-offload",
        "--moe-plan-memory=memory-report=-",
        "-o",
        "/dev/null",
        "-",
    ]
    tool = opt_tool or cpu.find_moe_opt()
    proc = subprocess.run(
        [tool, *args], input=layer_mlir(plan.config, "layer"), capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise ValueError(f"no memory report: {proc.stderr.strip()}")
    return proc.stdout


def plot_plan(plan: ActivationPlan, path: str, opt_tool: Optional[str] = None) -> str:
    """Writes a PNG timeline of the step's memory under the plan (moe_mlir.memory_plot; it
    raises memory_plot.MatplotlibMissing without matplotlib). Returns `path`."""
    from . import memory_plot  # noqa: PLC0415

    c = plan.config
    title = f"T={c.tokens} d={c.hidden} n={c.ffn} E={c.experts} k={c.top_k}, plan {plan.plan}"
    return memory_plot.plot_memory_report(memory_report(plan, opt_tool), path, title=title)
