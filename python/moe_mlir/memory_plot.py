"""The memory report of `moe-plan-memory` (`--moe-plan-memory=memory-report=<file>`) as data
and as a PNG timeline (docs/memory.md).

    from moe_mlir.memory_plot import parse_report, plot_memory_report
    report = parse_report(open("layer.report").read())
    report.check()                        # no two live buffers of an arena share a byte
    plot_memory_report(report, "layer.png")

or from the shell: `python3 -m moe_mlir.memory_plot layer.report layer.png`.

The plot needs matplotlib; parsing and the check need only the standard library.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from typing import Dict, List, Optional, Sequence, Union

__all__ = ["Buffer", "MemoryReport", "parse_report", "plot_memory_report", "MatplotlibMissing"]


class MatplotlibMissing(ImportError):
    """The PNG needs matplotlib, which is not installed."""


@dataclasses.dataclass
class Buffer:
    id: int
    name: str
    size: int
    first: int
    last: int
    offset: Optional[int] = None  # in its function's arena; None elsewhere
    saved: bool = False
    # "arena" (the workspace of `function`), "returned" (the caller's), "apart" (an
    # allocation of its own: offloaded from or prefetched into) or "host" (a host copy)
    place: str = "arena"
    function: Optional[str] = None
    per_token: int = 0  # with a dynamic token count: bytes a token of `size` (at the bound)

    @property
    def host(self) -> bool:
        return self.place == "host"


@dataclasses.dataclass
class MemoryReport:
    """One step of the report: the ops in order, the device buffers and the host copies."""

    forward: str
    backward: Optional[str]
    backward_start: int  # index of the first backward op (= number of ops without backward)
    alignment: int
    bound: Optional[int] = None  # a dynamic token count's bound, where sizes are planned
    ops: List[str] = dataclasses.field(default_factory=list)
    buffers: List[Buffer] = dataclasses.field(default_factory=list)
    peak: int = 0
    peak_op: int = 0
    arenas: Dict[str, int] = dataclasses.field(default_factory=dict)  # function -> bytes
    saved: Optional[int] = None
    saved_arguments: Optional[int] = None
    offloaded: Optional[int] = None

    @property
    def device(self) -> List[Buffer]:
        return [b for b in self.buffers if not b.host]

    @property
    def host(self) -> List[Buffer]:
        return [b for b in self.buffers if b.host]

    @property
    def in_arenas(self) -> List[Buffer]:
        return [b for b in self.buffers if b.place == "arena"]

    @property
    def arena(self) -> int:
        """The largest of the functions' arenas (they are never live together)."""
        return max(self.arenas.values(), default=0)

    def live_bytes(self) -> List[int]:
        """Device bytes live at each op."""
        live = [0] * len(self.ops)
        for b in self.device:
            for i in range(b.first, b.last + 1):
                live[i] += b.size
        return live

    def check(self) -> None:
        """Raises AssertionError unless the plan is consistent: offsets aligned, every buffer
        of an arena inside it and within its function's ops, no two buffers of one arena live
        at one op overlapping in memory, the peak and the saved total as the report says."""
        for b in self.device:
            assert 0 <= b.first <= b.last < len(self.ops), f"{b.name} lives outside the step"
        for b in self.in_arenas:
            assert b.function in self.arenas, f"{b.name} is in an arena the report lacks"
            assert b.offset % self.alignment == 0, f"{b.name} at {b.offset} is not aligned"
            assert b.offset + b.size <= self.arenas[b.function], f"{b.name} ends past the arena"
            in_backward = b.function == self.backward
            assert (b.first >= self.backward_start) == in_backward, f"{b.name} is in another arena"
        ordered = sorted(self.in_arenas, key=lambda b: b.first)
        for i, a in enumerate(ordered):
            for b in ordered[i + 1 :]:
                if b.first > a.last:
                    break
                if a.size and b.size and a.function == b.function:
                    assert a.offset + a.size <= b.offset or b.offset + b.size <= a.offset, (
                        f"buffers {a.id} ({a.name}) and {b.id} ({b.name}) are live together "
                        f"and overlap: [{a.offset}, {a.offset + a.size}) and "
                        f"[{b.offset}, {b.offset + b.size})"
                    )
        live = self.live_bytes()
        assert max(live, default=0) == self.peak, (max(live, default=0), self.peak)
        assert live[self.peak_op] == self.peak
        if self.saved is not None:
            assert sum(b.size for b in self.device if b.saved) == self.saved
            for b in self.device:
                if b.saved:
                    assert b.place == "returned", f"saved {b.name} is not returned"
                    assert b.first < self.backward_start <= b.last or (
                        b.last == self.backward_start - 1
                    ), f"saved {b.name} ends in forward"
        if self.offloaded is not None:
            assert sum(b.size for b in self.host) == self.offloaded


_HEADER = re.compile(
    r"moe-plan-memory: forward @(\S+) ops \[0, (-?\d+)\]"
    r"(?:, backward @(\S+) ops \[(\d+), (\d+)\])?, alignment (\d+) B"
    r"(?:, at the bound T = (\d+))?"
)
_OP = re.compile(r"op (\d+) (\S+)")
_BUFFER = re.compile(
    r"buffer (\d+) (.+): (\d+) B (?:at offset (\d+) in @(\S+)|(returned|apart)), "
    r"live \[(\d+), (\d+)\](, saved)?(?:, (\d+) B a token)?"
)
_HOST = re.compile(r"host (\d+) (.+): (\d+) B, live \[(\d+), (\d+)\](?:, (\d+) B a token)?")
_PEAK = re.compile(r"peak: (\d+) B .* at op (\d+)")
_ARENA = re.compile(r"arena @(\S+): (\d+) B")
_SAVED = re.compile(r"saved for backward: (\d+) B .* in \d+ buffers, and (\d+) B")
_OFFLOADED = re.compile(r"offloaded to the host: (\d+) B")


def parse_reports(text: str) -> List[MemoryReport]:
    """Every step of a report (one per training pair or function)."""
    reports: List[MemoryReport] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        m = _HEADER.fullmatch(line)
        if m:
            forward_end = int(m.group(2))
            reports.append(
                MemoryReport(
                    forward=m.group(1),
                    backward=m.group(3),
                    backward_start=forward_end + 1,
                    alignment=int(m.group(6)),
                    bound=int(m.group(7)) if m.group(7) else None,
                )
            )
            continue
        if not reports:
            raise ValueError(f"not a moe-plan-memory report: {line!r}")
        r = reports[-1]
        if m := _OP.fullmatch(line):
            assert int(m.group(1)) == len(r.ops), line
            r.ops.append(m.group(2))
        elif m := _BUFFER.fullmatch(line):
            r.buffers.append(
                Buffer(
                    int(m.group(1)),
                    m.group(2),
                    int(m.group(3)),
                    int(m.group(7)),
                    int(m.group(8)),
                    offset=int(m.group(4)) if m.group(4) else None,
                    saved=bool(m.group(9)),
                    place=m.group(6) or "arena",
                    function=m.group(5),
                    per_token=int(m.group(10) or 0),
                )
            )
        elif m := _HOST.fullmatch(line):
            r.buffers.append(
                Buffer(
                    int(m.group(1)),
                    m.group(2),
                    int(m.group(3)),
                    int(m.group(4)),
                    int(m.group(5)),
                    place="host",
                    per_token=int(m.group(6) or 0),
                )
            )
        elif m := _PEAK.match(line):
            r.peak, r.peak_op = int(m.group(1)), int(m.group(2))
        elif m := _ARENA.match(line):
            r.arenas[m.group(1)] = int(m.group(2))
        elif m := _SAVED.match(line):
            r.saved, r.saved_arguments = int(m.group(1)), int(m.group(2))
        elif m := _OFFLOADED.match(line):
            r.offloaded = int(m.group(1))
        else:
            raise ValueError(f"unknown line in a moe-plan-memory report: {line!r}")
    return reports


def parse_report(text: str) -> MemoryReport:
    """The first step of a report."""
    reports = parse_reports(text)
    if not reports:
        raise ValueError("empty moe-plan-memory report")
    return reports[0]


def _pyplot():
    try:
        import matplotlib  # noqa: PLC0415
    except ImportError:
        raise MatplotlibMissing(
            "moe_mlir.memory_plot needs matplotlib for the PNG (Debian: apt-get install "
            "python3-matplotlib, or pip install matplotlib); parse_report works without it"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def _unit(nbytes: int):
    for scale, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if nbytes >= 2 * scale:
            return scale, name
    return 1, "B"


def plot_memory_report(
    report: Union[MemoryReport, str], path: str, *, title: Optional[str] = None
) -> str:
    """Writes a PNG of the step to `path`: above, the device bytes live at each op (saved
    tensors apart, host copies dashed) with the peak and the forward/backward boundary; below, the
    functions' arenas (forward's, then backward's), each buffer a box at its offset over its
    lifetime. `report` is a MemoryReport or the report
    text. Returns `path`."""
    if isinstance(report, str):
        report = parse_report(report)
    plt = _pyplot()
    from matplotlib.patches import Rectangle  # noqa: PLC0415

    n = len(report.ops)
    scale, unit = _unit(max(report.arena, report.peak, 1))
    live = report.live_bytes()
    saved = [0] * n
    for b in report.device:
        if b.saved:
            for i in range(b.first, b.last + 1):
                saved[i] += b.size
    xs = list(range(n))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, n * 0.35), 8), sharex=True)
    top.step(xs, [v / scale for v in live], where="mid", color="tab:blue", label="live")
    top.fill_between(
        xs,
        [v / scale for v in saved],
        step="mid",
        color="tab:orange",
        alpha=0.6,
        label="saved for backward",
    )
    if report.host:
        host = [0] * n
        for b in report.host:
            for i in range(b.first, b.last + 1):
                host[i] += b.size
        top.step(
            xs,
            [v / scale for v in host],
            where="mid",
            color="tab:green",
            linestyle="--",
            label="offloaded (host)",
        )
    top.axhline(report.peak / scale, color="tab:red", linestyle=":", linewidth=1)
    top.annotate(
        f"peak {report.peak / scale:.3g} {unit} at op {report.peak_op}",
        (report.peak_op, report.peak / scale),
        textcoords="offset points",
        xytext=(4, 4),
        fontsize=8,
        color="tab:red",
    )
    if report.backward:
        for ax in (top, bottom):
            ax.axvline(report.backward_start - 0.5, color="gray", linestyle="--", linewidth=1)
        top.text(report.backward_start - 0.4, 0, "backward", fontsize=8, color="gray", va="bottom")
    top.set_ylabel(f"device memory ({unit})")
    top.legend(loc="upper left", fontsize=8)
    top.set_title(
        title
        or f"moe-plan-memory: @{report.forward}"
        + (f" + @{report.backward}" if report.backward else "")
    )

    for b in report.in_arenas:
        color = "tab:blue"
        bottom.add_patch(
            Rectangle(
                (b.first - 0.45, b.offset / scale),
                b.last - b.first + 0.9,
                max(b.size / scale, 1e-9),
                facecolor=color,
                alpha=0.5,
                edgecolor="black",
                linewidth=0.3,
            )
        )
    bottom.set_xlim(-0.5, n - 0.5)
    bottom.set_ylim(0, max(report.arena, 1) / scale)
    bottom.set_ylabel(f"arena offset ({unit})")
    bottom.set_xticks(xs)
    bottom.set_xticklabels(report.ops, rotation=90, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: python3 -m moe_mlir.memory_plot REPORT PNG", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        report = parse_report(f.read())
    report.check()
    try:
        plot_memory_report(report, argv[1])
    except MatplotlibMissing as exc:
        print(f"memory_plot: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
