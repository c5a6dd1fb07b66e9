"""The config space of a structure on a device: what the tuner may choose, and what is legal.

A structure fixes the µGraph and leaves its grid sizes and for-loop ranges as symbols; a config
binds them and may set the mapping knobs of ``kernels.mapping`` (``split`` on row-wise kernels
everywhere; ``block`` and ``lanes`` on GPUs, where a block has threads; ``smem_kb``, the
shared-memory budget that decides which tiles stay Regional and which go Global, on GPUs
wherever the default plan has a Regional tile).  Every parameter is a
small set of discrete choices, always including the AStitch default, so a sampler can start from
the rule and the space can be enumerated for an exhaustive comparison.  ``estimate`` gives the
roofline lower bound of one config, used to skip configs that cannot beat the best so far.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product

from kernels.hardware import DeviceSpec, roofline
from kernels.lowering import (
    STREAM_ROW_MAX,
    STREAM_ROW_MIN,
    Kernel,
    KernelPlan,
    Level,
    default_config,
    divisibility_constraints,
    divisors,
    is_row_form,
    lower,
    resolve_spec,
    triton_default_config,
)
from search.ir import DTYPE_BYTES, KernelGraph, ShapeError, SymDim, bind_dim, op_flops

MAX_SPLIT = 16  # blocks per row beyond this only add partial sums on any device we know
GPU_BLOCKS = (64, 128, 256, 512, 1024)
# What the estimate charges a CUDA-C matmul FLOP (a dot product per thread: no register tile,
# no tensor cores).  Measured on an H100 (2026-11-27, benchmarks/sweep.py) such matmuls ran at
# 0.08-0.5 TFLOP/s of the 67 peak; of the charges tried on sweep_h100_76096fd's CUDA-C trials
# (1, 20, 60, 200) 20 gives the scaled roofline its smallest error (MAPE 1.188; 1.418 with
# none; tau within programs 0.379 vs 0.399) and still ranks the Triton dialect first for every
# suite program with a matmul, as the measurements do (17x faster on rmsnorm_matmul)
CUDA_C_MATMUL_SLOWDOWN = 20.0
TRITON_STAGES = (2, 3, 4)  # software-pipelining depths offered to the Triton dialect
TRITON_TILES = (16, 32, 64, 128, 256)  # tile extents a GPU space always offers
# split-K (the Triton dialect): programs per virtual block sharing its for-loop; not yet
# measured on a GPU (docs/devices.md, "The Triton dialect")
SPLITK = (1, 2, 4, 8, 16)
# knobs added after configs were stored: a config without one means the behaviour it was
# measured with (split-K's epilogue in a second launch), so stored configs keep their kernel
ABSENT_MEANS = {"splitk_launches": 2}


@dataclass(frozen=True)
class Estimate:
    """What one config moves and computes, and the roofline time that implies."""

    bytes_moved: int
    flops: int
    launches: int
    seconds: float


def _member_key(config: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """A config as ``ConfigSpace.members`` holds it."""
    return tuple(sorted((str(k), int(v)) for k, v in config.items()))


@dataclass
class ConfigSpace:
    """Discrete parameters of one structure on one device; ``default`` is the AStitch rule's."""

    params: dict[str, tuple[int, ...]]
    default: dict[str, int]
    constraints: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    row_len: int = 0
    # per graph-defined kernel, the row its blocks' output tile holds (a size, or a size over
    # the grid symbol that cuts the row: 64/g1): ``split`` must divide each once bound
    row_tiles: tuple[int | SymDim, ...] = ()
    # other rules' starting points (on a GPU the Triton dialect's default: tl.dot tiles that
    # fill the SMs), tried right after ``default``; see ``tuner.pipeline.tune.warm_start``
    alternates: list[dict[str, int]] = field(default_factory=list)
    alternate_first: bool = False
    # the for-loop range of every graph-defined kernel (a symbol or a size): ``splitk``
    # must divide each
    forloops: tuple[str | int, ...] = ()
    # the configs that exist, where a record lists them (a Kernel Tuner cache: its file's
    # configs, a third to a half of the product of its parameters' values); None: every
    # config the rules allow
    members: frozenset[tuple[tuple[str, int], ...]] | None = None

    @classmethod
    def listed(cls, configs: Sequence[Mapping[str, int]]) -> ConfigSpace:
        """The space of the configs a record lists (non-empty): each parameter over the
        values it takes there, the first config the default, the others not members."""
        names = sorted({str(k) for c in configs for k in c})
        params = {k: tuple(sorted({int(c[k]) for c in configs})) for k in names}
        return cls(params, {k: int(v) for k, v in configs[0].items()},
                   members=frozenset(_member_key(c) for c in configs))

    def check(self, config: Mapping[str, int]) -> str | None:
        """None when ``config`` is legal, else why not (divisibility or knob rules)."""
        for name in self.params:
            if name not in config and name not in ABSENT_MEANS:
                return f"{name} is not set"
        if self.members is not None and _member_key(config) not in self.members:
            return f"not one of the {len(self.members)} configs the record lists"
        for size, syms in self.constraints:
            if size % math.prod(int(config[s]) for s in syms):
                return f"{' x '.join(syms)} must divide {size}"
        split = int(config.get("split", 1))
        if split > 1 and self.row_len % split:
            return f"split={split} must divide the row length {self.row_len}"
        for tile in self.row_tiles if split > 1 else ():
            cols = bind_dim(tile, config)
            if cols % split:
                return (f"split={split} must divide the row of {cols} a block's tile holds "
                        f"({tile} under this config)")
        if split > 1 and int(config.get("triton", 0)):
            return "triton=1 cannot split rows across blocks (split > 1)"
        splitk = int(config.get("splitk", 1))
        if splitk > 1 and not int(config.get("triton", 0)):
            return f"splitk={splitk} needs triton=1 (split-K is printed by the Triton dialect)"
        for f in self.forloops if splitk > 1 else ():
            if int(config.get(f, 0) if isinstance(f, str) else f) % splitk:
                return f"splitk={splitk} must divide the for-loop range {f}"
        block, lanes = config.get("block"), config.get("lanes")
        if block is not None and lanes is not None and int(block) % int(lanes):
            return f"lanes={lanes} must divide block={block}"
        return None

    def canonical(self, config: Mapping[str, int]) -> dict[str, int]:
        """``config`` with the knobs its dialect never reads set as the default sets them, so
        configs that build one kernel have one hash and the tuner measures it once: the
        Triton dialect reads neither ``lanes`` nor ``smem_kb`` (its tiles stay in registers;
        on an H100 a lora sweep measured the same Triton kernel under many of them), nor
        ``splitk_launches`` without split-K; the CUDA C dialect does not read ``stages``
        (software pipelining is Triton's: each CUDA C config was measured once per depth);
        a stored config without ``splitk_launches`` gets the value it was measured with
        (``ABSENT_MEANS``)."""
        out = dict(config)
        if "splitk_launches" in self.params:  # read only where split-K splits the loop
            if int(out.get("splitk", 1)) > 1:
                out.setdefault("splitk_launches", ABSENT_MEANS["splitk_launches"])
            else:
                out["splitk_launches"] = self.default["splitk_launches"]
        if not int(out.get("triton", 0)):
            if "stages" in out and "stages" in self.default:  # the pipeliner is Triton's
                out["stages"] = self.default["stages"]
            return out
        if "smem_kb" in out and "smem_kb" in self.default:
            out["smem_kb"] = self.default["smem_kb"]
        if "lanes" in out and "lanes" in self.default:
            lanes, block = int(self.default["lanes"]), int(out.get("block", 0))
            out["lanes"] = lanes if not block or block % lanes == 0 else block
        return out

    def configs(self) -> Iterator[dict[str, int]]:
        """Every legal config (the exhaustive space), in a stable order."""
        names = sorted(self.params)
        for values in product(*(self.params[n] for n in names)):
            config = dict(zip(names, values, strict=True))
            if self.check(config) is None:
                yield config

    @property
    def size(self) -> int:
        return sum(1 for _ in self.configs())


def config_space(structure: KernelGraph, device: str | DeviceSpec) -> ConfigSpace:
    """The parameters a tuner may set for ``structure`` on ``device``."""
    spec = resolve_spec(device)
    default = default_config(structure, spec) if structure.symbols() else {}
    constraints = divisibility_constraints(structure)
    params: dict[str, tuple[int, ...]] = {}
    for sym in sorted(structure.symbols()):
        g = 0
        for size, syms in constraints:
            if sym in syms:
                g = math.gcd(g, size)
        # on a GPU also every binding that leaves a power-of-two tile of 16-256 along the dim
        # (the tensor-core tiles of the Triton dialect: rmsnorm_matmul's 6144 columns in 96,
        # 192 or 384 tiles, which fill 132 SMs where 48 or 128 do not)
        tiles = tuple(g // t for t in TRITON_TILES if g and g % t == 0) \
            if spec.kind != "cpu" else ()
        choices = set(divisors(g or 1, keep=12, include=tiles))
        if sym in default:
            choices.add(default[sym])
        params[sym] = tuple(sorted(choices))
    bgs = structure.block_graphs()
    row_len, row_tiles = 0, ()  # type: tuple[int, tuple[int | SymDim, ...]]
    if bgs and all(is_row_form(bg) for bg in bgs):
        out = structure.tensors[structure.ops_of("graph_kernel")[0].outputs[0]].shape
        row_len = int(out[-1])
        row_tiles = tuple(bg.tensors[bg.ops_of("output")[0].inputs[0]].shape[-1] for bg in bgs)
        splits = {d for d in divisors(row_len) if d <= MAX_SPLIT} | {default.get("split", 1)}
        if len(splits) > 1:
            params["split"] = tuple(sorted(splits))
    if spec.kind != "cpu" and bgs:
        blocks = {b for b in GPU_BLOCKS if b <= spec.max_threads_per_block}
        params["block"] = tuple(sorted(blocks | {default.get("block", 128)}))
        params["lanes"] = tuple(sorted({32, 64, 128, 256} | {default.get("lanes", 32)}))
    # The memory level as a choice: on a GPU, Regional tiles cost shared memory and so
    # occupancy, and moving them to Global can win; on a CPU "Regional" is a cache-resident
    # arena with nothing to trade, so Global only adds traffic and is not offered.
    regional = _regional_bytes(structure, default, spec) if spec.kind != "cpu" else 0
    if regional:
        budget = spec.smem_per_block_default // 1024
        params["smem_kb"] = (0, budget) if regional > 1024 * budget // 2 else (0, budget // 2,
                                                                              budget)
        default = {**default, "smem_kb": budget}
    if spec.kind == "cpu" and bgs:
        default = {**default, **_schedule_knobs(structure, default, spec, params)}
    if spec.kind != "cpu" and bgs:
        # the dialect as a choice: Triton tile programs (tensor cores, pipelined loads) or
        # CUDA C (AStitch's thread mapping, grid barriers); the tuner measures both
        params["triton"], params["stages"] = (0, 1), TRITON_STAGES
        default = {**default, "triton": 0, "stages": 3}
    forloops = tuple(bg.forloop_range for bg in bgs)
    if spec.kind != "cpu" and bgs and all(f != 1 for f in forloops):
        # split-K where some binding of every for-loop range is divisible (check: each one)
        ranges = [params.get(f, ()) if isinstance(f, str) else (int(f),) for f in forloops]
        splitk = [s for s in SPLITK if all(any(r % s == 0 for r in rs) for rs in ranges)]
        if len(splitk) > 1 and _splitk_refused(structure, params, splitk[1], spec):
            splitk = [1]  # the loop carries more than sums (attention's running max)
        if len(splitk) > 1:
            # and how the part after the loop runs: by the last program (one launch) or an
            # epilogue launch (measured on an H100 first; the tuner measures both)
            params["splitk"], params["splitk_launches"] = tuple(splitk), (1, 2)
            default = {**default, "splitk": 1, "splitk_launches": 1}
    knobs = {k: default[k] for k in ("split", "block", "lanes", "smem_kb", "tile_rows",
                                     "stream", "triton", "stages", "splitk", "splitk_launches")
             if k in params and k in default}
    chosen = {k: v for k, v in default.items() if k in structure.symbols()} | knobs
    if "lanes" in params and "lanes" not in chosen:
        # the rule left lanes to the lowering (a matmul's tile mapping): the default states
        # what it chose, so that the default and its one-parameter moves are complete configs
        # (without it every move of rmsnorm_matmul's default failed check: "lanes is not set")
        lanes = lower(structure, chosen, spec, "lanes").kernels[0].mapping.lanes
        params["lanes"] = tuple(sorted({*params["lanes"], lanes}))
        chosen["lanes"] = lanes
    space = ConfigSpace(params, chosen, constraints, row_len, row_tiles=row_tiles,
                        forloops=forloops)
    if spec.kind != "cpu" and bgs:
        try:
            rule = triton_default_config(structure, spec)
        except ShapeError:
            rule = {}
        alternate = {**chosen, **{k: int(v) for k, v in rule.items() if k in params}}
        if rule and alternate != chosen and space.check(alternate) is None \
                and legal(structure, alternate, spec) is None:
            space.alternates.append(alternate)
            # tried first where the estimate says it is faster (every matmul program on a GPU)
            space.alternate_first = estimate(structure, alternate, spec).seconds < \
                estimate(structure, chosen, spec).seconds
    return space


def _splitk_refused(structure: KernelGraph, params: Mapping[str, tuple[int, ...]], s: int,
                    spec: DeviceSpec) -> bool:
    """Whether lowering refuses split-K for what the structure's loops carry (not for one
    binding): one probe, grid symbols at 1 and each for-loop at a range ``s`` divides."""
    probe = {sym: next((v for v in params[sym] if v % s == 0), 1)
             if any(bg.forloop_range == sym for bg in structure.block_graphs()) else 1
             for sym in structure.symbols()}
    try:
        lower(structure, {**probe, "triton": 1, "splitk": s}, spec, "probe")
    except (ShapeError, ValueError) as err:
        return "cannot split" in str(err)
    return False


def _schedule_knobs(structure: KernelGraph, default: Mapping[str, int], spec: DeviceSpec,
                    params: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """The CPU schedule's choices worth tuning, added to ``params``; returns their defaults.

    ``tile_rows`` where the default plan tiles a matmul in registers (0: rows one at a time, 4
    or 8 at most per tile; 8 lets the rule pick by B's size against L1), ``stream`` where a
    kernel could stream its output rows and its data is at least a quarter of the last-level
    cache (the rule streams above half of it; near the line either can win)."""
    try:
        plan = lower(structure, default or None, spec, "space")
    except (ShapeError, ValueError):
        return {}
    loops = [lp for k in plan.kernels for ph in k.phases for lp in ph.loops]
    out = {}
    if any(lp.tile_rows > 1 for lp in loops):
        params["tile_rows"], out["tile_rows"] = (0, 4, 8), 8
    data = max((sum(math.prod(plan.globals[p].shape) * 4 for p in k.params)
                for k in plan.kernels), default=0)
    if any(lp.stream for lp in loops) or (data >= spec.llc_bytes // 4 and any(
            STREAM_ROW_MIN <= lp.cols <= STREAM_ROW_MAX and not lp.chunked for lp in loops)):
        params["stream"], out["stream"] = (0, 1), int(any(lp.stream for lp in loops))
    return out


def _regional_bytes(structure: KernelGraph, default: Mapping[str, int],
                    spec: DeviceSpec) -> int:
    """Bytes of movable Regional tiles in the default plan (0: no memory level to choose)."""
    try:
        plan = lower(structure, default or None, spec, "space")
    except (ShapeError, ValueError):
        return 0
    return sum(b.nbytes for k in plan.kernels for b in k.buffers.values()
               if b.level is Level.REGIONAL and b.role != "scratch")


def estimate(structure: KernelGraph, config: Mapping[str, int] | None,
             device: str | DeviceSpec, plan: KernelPlan | None = None) -> Estimate:
    """Roofline lower bound of ``structure`` bound by ``config`` on ``device``.

    Bytes count every tile a block reads from or writes to global memory (once per for-loop
    iteration for tiles the loop walks), so a config with more blocks re-reading a shared
    operand moves more; launches are the plan's kernels (task splitting may add some).  A
    kernel whose blocks cannot fill the device (fewer than its SMs or cores) reaches only that
    share of its bandwidth and FLOP/s: on an H100 the search's 2-block attention structures
    took 6-37 ms against 0.5 ms for the hand-written one's 64 blocks, which the plain roofline
    ranked the other way (sweep_h100_76096fd: Kendall tau 0.02 between estimate and time).
    ``plan``: the same structure, config and device already lowered (the cost model's
    features lower each candidate once for both).
    """
    spec = resolve_spec(device)
    if plan is None:
        plan = lower(structure, config, spec, "estimate")
    bound = structure.bind({k: int(v) for k, v in plan.config.items()
                            if k in structure.symbols()}) if structure.symbols() else structure
    share = _fill(plan, spec)
    moved = flops = 0
    # split-K: one more launch (the epilogue) and the workspace partials, written by each of
    # the ``splitk`` programs (atomic adds), read once and zeroed once by the epilogue
    launches = sum(len(k.programs) for k in plan.kernels)
    partials: dict[int, int] = {}
    for k in plan.kernels:
        if k.splitk > 1:
            slots = sum(b.nbytes for b in k.buffers.values() if b.role == "splitk")
            op = _op_index(k)
            partials[op] = partials.get(op, 0) + slots * k.vblocks * (k.splitk + 2)
    seconds = launches * spec.launch_overhead_s
    # a GPU stores the program's dtype (the C++ dialect float32); the Triton dialect's tl.dot
    # on float16 / bfloat16 tiles runs on the tensor cores
    width = DTYPE_BYTES.get(plan.dtype, 4) if spec.kind != "cpu" else 4
    tensor = plan.dialect == "triton" and plan.dtype in ("float16", "bfloat16")
    # the CUDA-C dialect's matmul: a float32 dot product per output element per thread
    slow = CUDA_C_MATMUL_SLOWDOWN if spec.kind != "cpu" and plan.dialect != "triton" else 1.0
    for i, op in enumerate(op for op in bound.ops if op.kind not in ("input", "output")):
        b, f, mm = _op_traffic(bound, op, width)
        b += partials.get(i, 0)
        moved, flops = moved + b, flops + f
        charged = f + (slow - 1.0) * mm
        seconds += roofline(b, charged, 0, spec, tensor_cores=tensor) / share.get(i, 1.0)
    return Estimate(moved, flops, launches, seconds)


def _op_index(k: Kernel) -> int:
    """The kernel-graph op a kernel was lowered from (its name: ``<plan>_k<op>[_p<phase>]``)."""
    return int(k.name.rsplit("_k", 1)[1].split("_")[0])


def _fill(plan: KernelPlan, spec: DeviceSpec) -> dict[int, float]:
    """Per kernel-graph op, the share of the device its kernels' blocks can keep busy (the
    smallest over its kernels: a phase split into kernels runs one after the other); a
    split-K kernel's for-loop runs on ``splitk`` programs per block."""
    out: dict[int, float] = {}
    for k in plan.kernels:
        op = _op_index(k)
        share = min(1.0, k.blocks * k.splitk / spec.sm_count)
        out[op] = min(out.get(op, 1.0), share)
    return out


def _op_traffic(bound: KernelGraph, op, width: int = 4) -> tuple[int, int, int]:
    """(bytes moved, FLOPs, of which matmul FLOPs) of one kernel-graph op of a bound graph,
    ``width`` bytes an element."""
    if op.kind != "graph_kernel":
        f = op_flops(op.kind, [bound.tensors[t].shape for t in op.inputs],
                     bound.tensors[op.outputs[0]].shape)
        return (width * sum(math.prod(bound.tensors[t].shape) for t in op.inputs + op.outputs),
                f, f if op.kind == "matmul" else 0)
    bg = op.attrs["block_graph"]
    blocks = math.prod(int(g) for g in bg.grid)
    iters = int(bg.forloop_range)
    moved = flops = matmul = 0
    for bop in bg.ops:
        out_shape = bg.tensors[bop.outputs[0]].shape if bop.outputs else ()
        if bop.kind == "input":
            reads = iters if bop.attrs["fmap"] >= 0 else 1
            moved += width * math.prod(out_shape) * blocks * reads
        elif bop.kind == "output":
            moved += width * math.prod(bg.tensors[bop.inputs[0]].shape) * blocks
        else:
            times = iters if bg.tensors[bop.outputs[0]].stage == "body" else 1
            f = blocks * times * op_flops(
                bop.kind, [bg.tensors[t].shape for t in bop.inputs], out_shape)
            flops += f
            matmul += f if bop.kind == "matmul" else 0
    return moved, flops, matmul


def legal(structure: KernelGraph, config: Mapping[str, int], device: str | DeviceSpec
          ) -> str | None:
    """None when ``config`` lowers for ``device``, else the lowering's reason."""
    try:
        lower(structure, config, resolve_spec(device), "check")
    except (ShapeError, ValueError) as err:
        return str(err)
    return None


def rank_structures(structures: Sequence[KernelGraph], device: str | DeviceSpec) -> list[int]:
    """Indices of ``structures`` from the fastest roofline estimate of its AStitch default
    config on ``device`` to the slowest; among equal estimates the one with fewer FLOPs first
    (a memory-bound roofline cannot see extra work: every lora structure the search verified
    computing X·(W + A·B), twice X·W + (X·A)·B's FLOPs, tied at one estimate), FLOPs equal to
    2 digits counting as equal, then their order (the search's ranking: smaller tiles first);
    structures that do not lower go last.  Without that tolerance the for-loop's own adds
    (0.8% of gated_mlp's FLOPs) put its 20 structures that take all of K at once ahead of the
    for-loop one the search ranked first, and a cpu launch tuned three of them (8.5 ms against
    3.3 for the for-loop structure, AMD EPYC).

    The search ranks by kernels and by the bytes of each tensor, which cannot see a grid
    whose blocks all re-read one operand or recompute a shared prefix: six of mha's
    verified structures tie there and took 7.7-140 ms on this CPU; the estimate puts the
    two fast ones (heads on the grid) first.
    """
    spec = resolve_spec(device)

    dialects = ({}, {"triton": 1}) if spec.kind != "cpu" else ({},)

    def key(i: int) -> tuple[float, float, int]:
        ests = []
        for knobs in dialects:  # on a GPU the faster of its two dialects
            try:
                ests.append(estimate(structures[i], knobs or None, spec))
            except (ShapeError, ValueError, NotImplementedError):
                continue
        if not ests:
            return math.inf, math.inf, i
        est = min(ests, key=lambda e: e.seconds)
        # equal to 4 digits (seconds) and 2 digits (FLOPs): a tie
        return float(f"{est.seconds:.4g}"), float(f"{est.flops:.2g}"), i

    return sorted(range(len(structures)), key=key)
