"""What a compile did: the ops captured, into how many programs, which ran as kernels and
which fell back, and why (``tuner.compile(...).report()``; one line per graph in the log)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

_PATHS = {"direct": "directly (kernels called by address)",
          "inductor": "through Inductor", "eager": "eagerly"}


@dataclass
class RegionReport:
    program: str  # torch_<structural hash>, or "-" where no program could be written
    aten_ops: list[str]  # the region's ATen ops, in graph order (views included)
    ops: int  # the program's compute ops
    status: str  # "kernel" | "fallback"
    reason: str = ""  # why it fell back
    kernel_us: float | None = None  # the compile's race: the kernel's time a call
    torch_us: float | None = None  # and PyTorch's own ops' for the region
    uncertain: str = ""  # the stored best could not be settled by its launch (why)


@dataclass
class GraphReport:
    """One FX graph Dynamo handed over (a model may give several: graph breaks, shapes)."""

    total: int  # ATen compute ops (views, copies and getitem not counted)
    uncaptured: list[tuple[str, str]]  # (ATen op, why it is in no region)
    regions: list[RegionReport] = field(default_factory=list)
    # how the graph runs: "direct" (kernels called by address, no AOT wrappers, no
    # dispatcher), "inductor" or "eager" (the fallback, with kernels as tuner::kernel ops)
    path: str = ""

    @property
    def captured(self) -> int:
        return self.total - len(self.uncaptured)

    def summary(self) -> str:
        kernels = sum(r.status == "kernel" for r in self.regions)
        return (f"tuner: {self.captured} of {self.total} ATen ops captured into "
                f"{len(self.regions)} program(s); {kernels} ran as kernels, "
                f"{len(self.regions) - kernels} fell back"
                + (f"; runs {_PATHS.get(self.path, self.path)}" if self.path else ""))


@dataclass
class Report:
    graphs: list[GraphReport] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(g.total for g in self.graphs)

    @property
    def captured(self) -> int:
        return sum(g.captured for g in self.graphs)

    @property
    def regions(self) -> list[RegionReport]:
        return [r for g in self.graphs for r in g.regions]

    @property
    def kernels(self) -> list[RegionReport]:
        return [r for r in self.regions if r.status == "kernel"]

    @property
    def fallbacks(self) -> list[RegionReport]:
        return [r for r in self.regions if r.status != "kernel"]

    @property
    def uncaptured(self) -> list[tuple[str, str]]:
        return [u for g in self.graphs for u in g.uncaptured]

    def __str__(self) -> str:
        lines = [f"tuner: {len(self.graphs)} graph(s), {self.captured} of {self.total} ATen ops "
                 f"captured into {len(self.regions)} program(s); {len(self.kernels)} ran as "
                 f"kernels, {len(self.fallbacks)} fell back"]
        paths = [g.path for g in self.graphs if g.path]
        if paths:
            lines[0] += "; runs " + ", ".join(_PATHS.get(p, p) for p in paths)
        for r in self.regions:
            ops = ", ".join(o.split(".")[0] for o in r.aten_ops)
            what = "kernel" if r.status == "kernel" else f"fallback: {r.reason}"
            if r.status == "kernel" and r.kernel_us is not None:
                what += f" ({r.kernel_us:.1f} µs a call; PyTorch's ops {r.torch_us:.1f} µs)"
            if r.status == "kernel" and r.uncertain:
                what += f"; stored UNCERTAIN: {r.uncertain.split(';')[0]}"
            lines.append(f"  {r.program} ({r.ops} ops: {ops}): {what}")
        for (op, why), n in Counter(self.uncaptured).items():
            lines.append(f"  not captured: {op} x{n}: {why}")
        return "\n".join(lines)
