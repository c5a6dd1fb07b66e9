"""What the cost model sees: a kernel as a graph of ops with features, plus the device.

Seed 001's model reads each kernel as a graph: per node an opcode (embedded) and scalar
features (shapes, layout), per kernel the tiling and static counts (FLOPs, bytes), and the
data flow as edges.  Ours, from what lowering already computes (``kernels.lower`` and
``kernels.estimate``):

- a node per compute op of the bound µGraph — a predefined kernel op, or an op of a
  graph-defined kernel's block graph — with its output shape (log2, right-aligned), its stage
  (before, in, after the for-loop), the AStitch memory level lowering chose for it (local,
  regional, global), bytes and FLOPs per block, and the features of the kernel it runs in
  (blocks, threads, lanes, split, vpack, for-loop range, shared memory, barrier, how much of
  the device its grid fills);
- edges along the data flow;
- graph features: total bytes, FLOPs, launches, the roofline estimate, the loop nests' work
  per core (``_nest``: what each core runs, by kind of statement), and the device (peak
  bandwidth and FLOP/s, SMs or cores, caches, kind) from the device table.

A Kernel Tuner configuration has no µGraph: it is one node whose features are the tunable
parameters' values (log2) and the problem size, on the same device features.  Every vector
has a fixed width, so one model reads both.  ``FEATURE_VERSION`` changes whenever a vector's
meaning does; a stored model is only used with features of its version.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels import (
    ConfigSpace,
    DeviceSpec,
    KernelPlan,
    Level,
    concretize,
    config_space,
    estimate,
    lower,
)
from search.ir import MAX_RANK, OPS, KernelGraph

from ._nest import DIV_OPS, EXP_OPS, NEST_DIM, nest_features

FEATURE_VERSION = 7  # 7: the loop nests' work per core (``_nest``): CPU programs held out
# tau 0.542 -> 0.623, MAPE 0.479 -> 0.318 (300 x 63 trees, AMD EPYC); 6: the dialect a GPU plan is printed in (Triton or CUDA C), its
# pipelining stages and split-K, and the GPU estimate charging CUDA-C matmuls (unseen before:
# on an H100 the same structure ran 1.07 ms in CUDA C and 0.064 ms in Triton); 5: the
# program's storage dtype, its elements through exp-family ops and through divides / square
# roots; each kernel's loop schedule (register tiles, row-by-row matmuls,
# streamed stores, prefetches, lane-tree sums, forks threads or not) and its load balance over
# the device's cores / SMs: 26% of the CPU dataset's rows had the features of another config
# of their structure (the tile_rows knob was invisible); 4: a flag for a device the table lacks (its sibling's speeds); 3: opcodes
# of add_scalar, neg, rsqrt and tanh (OPCODES is the sorted op table: the others moved); 2: µGraph
# node rows padded to NODE_DIM (they were 2 short)
OPCODES = ["<pad>", "kt_config", *sorted(k for k in OPS if k not in ("input", "output")),
           "input", "output"]
OPCODE = {name: i for i, name in enumerate(OPCODES)}
KT_PARAMS = 12  # Kernel Tuner parameters kept per configuration (more are dropped)
STAGES = ("kernel", "pre", "body", "post")
LEVELS = (Level.LOCAL, Level.REGIONAL, Level.GLOBAL)
KERNEL_DIM = 18
NODE_DIM = MAX_RANK + 1 + len(STAGES) + len(LEVELS) + 2 + 2 + KERNEL_DIM + KT_PARAMS + 3
DEVICE_DIM = 10
DTYPES = ("float32", "float16", "bfloat16")  # the program's storage dtype (one-hot)
GRAPH_DIM = 8 + len(DTYPES) + 3 + NEST_DIM + DEVICE_DIM  # the device's features come last
# where featurize puts what the work prior (_work) counts: node rows hold the memory level's
# one-hot, then log2 bytes and log2 FLOPs; the graph vector log2 bytes moved, log2 FLOPs,
# launches, ..., kernels, log2 exp-family and divide elements, then the dtype's one-hot
NODE_LEVEL = MAX_RANK + 1 + len(STAGES)
NODE_BYTES, NODE_FLOPS = NODE_LEVEL + len(LEVELS), NODE_LEVEL + len(LEVELS) + 1
GRAPH_BYTES, GRAPH_FLOPS, GRAPH_LAUNCHES, GRAPH_KERNELS = 0, 1, 2, 5
GRAPH_EXP, GRAPH_DIV, GRAPH_DTYPE = 6, 7, 8
GRAPH_DIALECT = GRAPH_DTYPE + len(DTYPES)  # 1 for a Triton plan, log2 of its stages, of split-K
GRAPH_NEST = GRAPH_DIALECT + 3  # ``_nest``'s values, in NEST_NAMES' order


@dataclass
class Sample:
    """One measured (or to be predicted) kernel: its graph, the group it is ranked within,
    and its time.  ``group`` is what configs are compared inside (a structure, or a Kernel
    Tuner space, on one device); ``program`` what a held-out split keeps apart."""

    group: str
    program: str
    device: str
    opcodes: np.ndarray  # (n,) int64
    nodes: np.ndarray  # (n, NODE_DIM) float32
    edges: np.ndarray  # (2, e) int64, node indices
    graph: np.ndarray  # (GRAPH_DIM,) float32
    seconds: float = math.nan
    estimate_s: float = math.nan  # the roofline's (nan where there is none)
    config: Mapping | None = None

    def flat(self) -> np.ndarray:
        """Graph features, pooled node features and an opcode histogram: what the
        gradient-boosted trees read."""
        hist = np.bincount(self.opcodes, minlength=len(OPCODES)).astype(np.float32)
        return np.concatenate([self.graph, self.nodes.mean(0), self.nodes.max(0),
                               self.nodes.sum(0), hist]).astype(np.float32)


def group_name(structure: str, device: str) -> str:
    """The group a sample is ranked within: one structure (a µGraph's hash, a Kernel Tuner
    kernel's name) on one device.  The part before ``@`` is also how the siblings' ranks
    (``_siblings``) tell "the same config" on two devices, so every caller that featurizes
    configs to train on or to predict names its groups here: a sampler that named them
    otherwise found no sibling's measurement of any config and ranked a device it never
    trained on by the trees alone."""
    return f"{structure}@{device}"


def group_structure(group: str) -> str:
    """The structure of a ``group_name``."""
    return group.split("@", 1)[0]


def _log2(x: float) -> float:
    return math.log2(1.0 + max(0.0, float(x)))


def device_features(spec: DeviceSpec, known: bool = True) -> list[float]:
    """Peak bandwidth and FLOP/s, parallel units, caches and kind, log-scaled, and whether
    these are the device's own figures (``known``) or its closest sibling's
    (``costmodel._devices``): the trees can then tell a guessed device from a listed one."""
    return [math.log10(max(spec.mem_bandwidth_gbs, 1e-3)), math.log10(spec.peak_fp32_flops),
            math.log10(max(spec.peak_fp16_tensor_flops, 1.0)), _log2(spec.sm_count),
            _log2(spec.l1_bytes), _log2(spec.l2_bytes), _log2(spec.llc_bytes),
            float(spec.kind == "cpu"), float(spec.kind != "cpu"), float(not known)]


def _shape(shape: Sequence) -> list[float]:
    dims = [_log2(int(d)) for d in shape][-MAX_RANK:]
    return [0.0] * (MAX_RANK - len(dims)) + dims + [_log2(math.prod(int(d) for d in shape))]


def _one_hot(value, choices) -> list[float]:
    return [float(value == c) for c in choices]


def _kernel_features(plan: KernelPlan, spec: DeviceSpec) -> dict[int, list[float]]:
    """Per kernel-graph op index, the features of the (first) kernel lowering made of it."""
    out: dict[int, list[float]] = {}
    for k in plan.kernels:
        op = int(k.name.rsplit("_k", 1)[1].split("_")[0])
        if op in out:
            continue
        m = k.mapping
        loops = [lp for ph in k.phases for lp in ph.loops]
        n = max(len(loops), 1)
        units = max(spec.sm_count, 1)
        waves = -(-k.blocks // units)
        out[op] = [_log2(k.blocks), _log2(m.threads), _log2(m.lanes), _log2(m.split),
                   _log2(m.vpack), _log2(k.forloop), _log2(k.smem_bytes),
                   float(k.barrier != "none"), float(len(k.phases)),
                   min(1.0, k.blocks / spec.sm_count),
                   # how its loops run (lowering's schedule: what the tile_rows / stream
                   # knobs change without changing the grid)
                   _log2(max((lp.tile_rows for lp in loops), default=0)),
                   sum(lp.tile_rows > 0 for lp in loops) / n,
                   sum(lp.matmul_rows for lp in loops) / n,
                   sum(lp.stream for lp in loops) / n,
                   _log2(sum(len(lp.prefetch) for lp in loops)),
                   sum(lp.tree_sum for lp in loops) / n,
                   float(k.parallel),
                   # the last wave's share of the cores / SMs: 1 when the blocks divide evenly
                   k.blocks / (waves * units)]
    return out


def _levels(plan: KernelPlan) -> dict[tuple[int, int], Level]:
    """(kernel-graph op index, block tensor id) -> the level its tile was given."""
    out: dict[tuple[int, int], Level] = {}
    for k in plan.kernels:
        op = int(k.name.rsplit("_k", 1)[1].split("_")[0])
        for name, b in k.buffers.items():
            if name.startswith(("b_t", "p_t")) and name[3:].isdigit():
                out.setdefault((op, int(name[3:])), b.level)
    return out


class StoredConfigs:
    """The kernel a stored µGraph config built, named as a launch stores it now
    (``ConfigSpace.canonical``), so that "the same config on two devices" (``_siblings``)
    is the same kernel: rows measured before a dialect's unread knobs were made canonical (a
    CUDA C config at each ``stages``, a Triton one at each ``lanes``) matched no canonical
    candidate of a device the model never trained on (the H100 sweep's lora: 23 of the 61
    kernels it measured).  Their features stay those of the config as stored: the trees
    fitted to the canonical ones did worse on the sweep's held-out programs (0.585 -> 0.528
    on ``sweep_h100_4052033``).  One space per structure and device."""

    def __init__(self) -> None:
        self._spaces: dict[tuple[str, str], ConfigSpace] = {}

    def canonical(self, structure: KernelGraph, name: str, spec: DeviceSpec,
                  config: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """``config`` of ``structure`` (``name``: its hash) on ``spec``, canonical (a
        structure without parameters: None, as it was)."""
        if config is None:
            return None
        key = (name, spec.name)  # a device the table lacks: a sibling's row, its own name
        space = self._spaces.get(key) or self._spaces.setdefault(key,
                                                                 config_space(structure, spec))
        return space.canonical(config)


def featurize(structure: KernelGraph, config: Mapping[str, int] | None, spec: DeviceSpec, *,
              group: str = "", program: str = "", device: str = "",
              known_device: bool = True, binds: dict | None = None) -> Sample:
    """The sample of ``structure`` bound by ``config`` on ``spec`` (lowered once);
    ``known_device`` False: ``spec`` is a sibling's row (``costmodel._devices``); ``binds``:
    a caller's cache of ``structure``'s bound graphs (``concretize``), one per structure."""
    # bound once: the lowering and the estimate take the bound graph (each bound it again:
    # a model-guided launch featurizes every candidate of a study, ~7,000 in four programs)
    bound, symbols, knobs = concretize(structure, config, spec, binds)
    plan = lower(bound, {**symbols, **knobs}, spec, "cm")
    kfeat, levels = _kernel_features(plan, spec), _levels(plan)
    est = estimate(bound, plan.config, spec, plan)
    opcodes: list[int] = []
    nodes: list[list[float]] = []
    edges: list[tuple[int, int]] = []
    producer: dict[int, int] = {}  # kernel tensor id -> node that produced it
    special = [0.0, 0.0]  # elements through exp-family ops, through divides / square roots

    def node(kind: str, shape, stage: str, level, nbytes: float, flops: float,
             kern: list[float]) -> int:
        opcodes.append(OPCODE[kind])
        special[0] += flops if kind in EXP_OPS else 0.0
        special[1] += flops if kind in DIV_OPS else 0.0
        row = [*_shape(shape), *_one_hot(stage, STAGES), *_one_hot(level, LEVELS),
               _log2(nbytes), _log2(flops), *kern]
        # zeros up to NODE_DIM: the Kernel Tuner slots sit where featurize_params puts them
        nodes.append(row + [0.0] * (NODE_DIM - len(row)))
        return len(nodes) - 1

    index = 0
    for op in bound.ops:
        if op.kind == "input":
            t = op.outputs[0]
            producer[t] = node("input", bound.tensors[t].shape, "kernel", Level.GLOBAL,
                               4 * _elems(bound.tensors[t].shape), 0, [0.0] * KERNEL_DIM)
            continue
        if op.kind == "output":
            out = node("output", bound.tensors[op.inputs[0]].shape, "kernel", Level.GLOBAL, 0,
                       0, [0.0] * KERNEL_DIM)
            edges.append((producer[op.inputs[0]], out))
            continue
        kern = kfeat.get(index, [0.0] * KERNEL_DIM)
        if op.kind != "graph_kernel":
            shape = bound.tensors[op.outputs[0]].shape
            n = node(op.kind, shape, "kernel", Level.GLOBAL,
                     4 * sum(_elems(bound.tensors[t].shape) for t in op.inputs + op.outputs),
                     _flops(op.kind, [bound.tensors[t].shape for t in op.inputs], shape), kern)
            edges += [(producer[t], n) for t in op.inputs]
            producer[op.outputs[0]] = n
        else:
            _block_nodes(op, bound, index, kern, levels, node, edges, producer)
        index += 1
    graph = [_log2(est.bytes_moved), _log2(est.flops), float(est.launches),
             math.log10(max(est.seconds, 1e-9)), min(r[-1] for r in kfeat.values()) if kfeat
             else 1.0, float(len(plan.kernels)), _log2(special[0]), _log2(special[1]),
             *_one_hot(plan.dtype, DTYPES),
             float(plan.dialect == "triton"),
             _log2(float(plan.config.get("stages", 0))) if plan.dialect == "triton" else 0.0,
             math.log2(max((k.splitk for k in plan.kernels), default=1)),
             *nest_features(plan, spec), *device_features(spec, known_device)]
    return Sample(group, program, device, np.asarray(opcodes, np.int64),
                  np.asarray(nodes, np.float32),
                  np.asarray(edges, np.int64).T.reshape(2, -1), np.asarray(graph, np.float32),
                  estimate_s=est.seconds, config=dict(plan.config))


def _block_nodes(op, bound: KernelGraph, index: int, kern: list[float], levels, node, edges,
                 producer) -> None:
    """Nodes and edges of one graph-defined kernel's block graph."""
    bg = op.attrs["block_graph"]
    local: dict[int, int] = {}
    outs = iter(op.outputs)
    for bop in bg.ops:
        if bop.kind == "input":
            t = bop.outputs[0]
            shape = bg.tensors[t].shape
            reads = int(bg.forloop_range) if bop.attrs["fmap"] >= 0 else 1
            n = node("input", shape, "pre" if reads == 1 else "body", Level.GLOBAL,
                     4 * math.prod(shape) * reads, 0, kern)
            src = op.inputs[bop.attrs["index"]]
            edges.append((producer[src], n))
            local[t] = n
            continue
        if bop.kind == "output":
            shape = bg.tensors[bop.inputs[0]].shape
            n = node("output", shape, "post", Level.GLOBAL, 4 * math.prod(shape), 0, kern)
            edges.append((local[bop.inputs[0]], n))
            producer[next(outs)] = n
            continue
        t = bop.outputs[0]
        tensor = bg.tensors[t]
        shape = tensor.shape
        times = int(bg.forloop_range) if tensor.stage == "body" else 1
        flops = _flops(bop.kind, [bg.tensors[i].shape for i in bop.inputs], shape) * times
        n = node(bop.kind, shape, tensor.stage, levels.get((index, t), Level.LOCAL), 0,
                 flops, kern)
        edges += [(local[i], n) for i in bop.inputs]
        local[t] = n


def _elems(shape: Sequence[Any]) -> int:
    """Elements of a bound (concrete) shape."""
    return math.prod(int(d) for d in shape)


def _flops(kind: str, in_shapes: list, out_shape) -> float:
    out = math.prod(int(d) for d in out_shape) if out_shape else 1
    if kind == "matmul":
        return 2.0 * out * int(in_shapes[0][-1])
    if kind in ("sum", "mean", "rms_norm", "accum"):
        return float(math.prod(int(d) for d in in_shapes[0]))
    return float(out)


def featurize_params(params: Mapping[str, float], keys: Sequence[str],
                     problem_size: Sequence[int], spec: DeviceSpec, *, group: str,
                     program: str, device: str, known_device: bool = True) -> Sample:
    """A Kernel Tuner configuration as a one-node graph: its parameters (in ``keys``' order,
    log2 of 1 + value) and the problem size, on ``spec``'s device features."""
    values = [_log2(float(params[k])) for k in keys][:KT_PARAMS]
    size = [_log2(d) for d in list(problem_size)[:3]]
    vec = [0.0] * (NODE_DIM - KT_PARAMS - 3) + values + [0.0] * (KT_PARAMS - len(values)) + \
        size + [0.0] * (3 - len(size))
    graph = [0.0] * (GRAPH_DIM - DEVICE_DIM) + device_features(spec, known_device)
    return Sample(group, program, device, np.asarray([OPCODE["kt_config"]], np.int64),
                  np.asarray([vec], np.float32), np.zeros((2, 0), np.int64),
                  np.asarray(graph, np.float32), config=dict(params))
