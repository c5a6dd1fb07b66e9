"""Lowering: a µGraph (structure + config, or a bound graph) → a ``KernelPlan`` for a device.

Every kernel-graph op becomes one kernel: a graph-defined kernel from its block graph, a
predefined op from the one-op block graph ``predefined`` writes for it, so multi-kernel graphs
(reference programs included) run end to end.  Tensors between kernels are Global buffers of
the plan's workspace; that edge is always a kernel split.  Inside each kernel ``stitch`` and
``fuse`` choose loops and levels, ``mapping`` the thread mapping, and this module assembles
them: split phases, lifetimes, shared-memory offsets with downgrades, workspace layout, and the
choice between a grid barrier (all blocks in one wave) and a kernel split.
"""

from __future__ import annotations

import math
from collections.abc import Mapping as MappingT

from kernels.hardware import DeviceSpec, get_spec
from search.ir import BlockGraph, KernelGraph, ShapeError

from ._fuse import Fuser
from ._mapping import (
    KNOBS,
    TRITON_TILE_VALUES_PER_THREAD,
    astitch_rule,
    blocks_per_wave,
    default_config,
    is_row_form,
    split_config,
    triton_default_config,
    triton_smem_bytes,
    triton_tile_values,
)
from ._plan import (
    Access,
    Buffer,
    Kernel,
    KernelPlan,
    Let,
    Level,
    Loop,
    Mapping,
    Phase,
    Store,
    View,
)
from ._predefined import predefined_block_graph
from ._schedule import schedule
from ._softmax import shift_exponentials
from ._splitk import split_k
from ._stitch import Home, chunk_cols, dense_strides, expand, group_loops, lanes_for, plan_shared

WS_ALIGN = 16  # floats: workspace regions start on 64-byte boundaries
STAGE_ORDER = {"pre": 0, "body": 1, "post": 2}


def resolve_spec(device: str | DeviceSpec) -> DeviceSpec:
    return device if isinstance(device, DeviceSpec) else get_spec(device)


def lower(graph: KernelGraph, config: MappingT[str, int] | None = None,
          device: str | DeviceSpec = "cpu", name: str = "prog") -> KernelPlan:
    """Lower ``graph`` (a structure, bound with ``config``, or already concrete) for ``device``.

    ``config`` holds the structure's symbols (g0, F, ...) and optional mapping knobs: ``block``
    (threads per block), ``lanes`` (threads per row), ``split`` (blocks per row: task
    splitting) and ``vpack`` (work items per block: vertical packing).  Missing entries come
    from the AStitch rule (``mapping.default_config``).
    """
    spec = resolve_spec(device)
    graph, symbols, knobs = concretize(graph, config, spec)
    plan = KernelPlan(name, spec.name, spec.kind, _program_dtype(graph), [], {},
                      config={**symbols, **knobs})
    _globals(graph, plan, spec)
    buf_of = {tid: b.name for tid, b in _tensor_buffers(graph, plan).items()}
    for i, op in enumerate(op for op in graph.ops if op.kind not in ("input", "output")):
        ins = [plan.globals[buf_of[t]] for t in op.inputs]
        outs = [plan.globals[buf_of[t]] for t in op.outputs]
        if op.kind == "graph_kernel":
            bg: BlockGraph = op.attrs["block_graph"]
            what, kn = f"graph-defined kernel #{i}", knobs
        else:
            specs = [(graph.tensors[t].shape, graph.tensors[t].dtype) for t in op.inputs]
            out_shape = tuple(graph.tensors[op.outputs[0]].shape)
            bg = predefined_block_graph(op.kind, dict(op.attrs), specs, out_shape, spec)
            what, kn = f"predefined {op.kind} #{i}", {}
        kernels = lower_block(bg, f"{name}_k{i}", what, ins, outs, spec, kn, plan)
        if knobs.get("splitk", 1) > 1 and op.kind == "graph_kernel":
            if len(kernels) > 1:
                raise ValueError(f"config: splitk={knobs['splitk']} cannot split {what}: its "
                                 "phases are split into kernels")
            for k in kernels:
                split_k(k, int(knobs["splitk"]), what, bool(knobs.get("triton")),
                        int(knobs.get("splitk_launches", 2)))
        plan.kernels += kernels
        if knobs.get("triton") and op.kind == "graph_kernel":
            stages = int(knobs.get("stages", 3))
            need = triton_smem_bytes(bg, plan.dtype, stages)
            if need > spec.smem_per_block_optin:  # refused before a trial is spent on it
                raise ValueError(
                    f"config: triton=1 tiles of {what} need ~{need // 1024} KiB of shared "
                    f"memory with stages={stages}, more than a {spec.name} block's "
                    f"{spec.smem_per_block_optin // 1024} KiB; choose smaller tiles (more "
                    "blocks or for-loop steps) or fewer stages")
            threads = max(k.mapping.threads for k in kernels)
            values = triton_tile_values(bg)
            if spec.kind != "cpu" and values > TRITON_TILE_VALUES_PER_THREAD * threads:
                raise ValueError(
                    f"config: triton=1 tiles of {what} hold up to {values} values over "
                    f"{threads} threads, {values // threads} a thread (at most "
                    f"{TRITON_TILE_VALUES_PER_THREAD}: more spills registers and takes Triton "
                    "minutes to compile); choose smaller tiles (more blocks or for-loop "
                    "steps) or more threads")
    _layout_workspace(plan)
    if knobs.get("triton"):
        _choose_triton(plan)
    return plan


def _choose_triton(plan: KernelPlan) -> None:
    """``triton=1``: the plan is printed as Triton tile programs, which have no grid barrier
    and no blocks sharing one row (task splitting); such a plan is refused, as any illegal
    config is, so the tuner records it and moves on.  Nor may a program store a workspace
    tile and load it back: Triton orders neither the threads (the store and the load get
    different layouts) nor its pipeliner (the load is issued ``stages - 1`` iterations ahead,
    reading the last call's values: qknorm_gqa at g0=1 gave NaN on an H100)."""
    if plan.device_kind == "cpu":
        raise ValueError("config: triton=1 needs a GPU device; the cpu builds C++")
    for k in plan.kernels:
        if k.mapping.split > 1 or k.barrier != "none" or len(k.phases) > 1:
            raise ValueError(f"config: triton=1 cannot run {k.name}: it splits rows across "
                             "blocks (split > 1 or phases joined by a barrier); use triton=0")
        tiles = [b.name for b in k.buffers.values()
                 if b.level is Level.GLOBAL and b.role not in ("splitk", "splitk_count")]
        if tiles:
            raise ValueError(f"config: triton=1 cannot run {k.name}: it stores and reloads "
                             f"the workspace tiles {tiles}; use triton=0")
    plan.dialect = "triton"


def concretize(graph: KernelGraph, config: MappingT[str, int] | None, spec: DeviceSpec,
               binds: dict | None = None) -> tuple[KernelGraph, dict[str, int], dict[str, int]]:
    """(bound graph, symbol bindings, mapping knobs); defaults from the AStitch rule.
    ``binds``: the bound graphs of ``graph`` by their symbols, kept across calls by a caller
    that lowers many configs of one structure (the cost model featurizing a space: configs
    differing only in knobs bind the same symbols)."""
    symbols, knobs = split_config(config)
    structure_symbols = graph.symbols()
    if not structure_symbols:
        return graph, symbols, knobs
    if not symbols:
        rule = triton_default_config if knobs.get("triton") else default_config
        symbols, defaults = split_config(rule(graph, spec))
        knobs = {**defaults, **knobs}
    missing = sorted(structure_symbols - set(symbols))
    extra = sorted(set(symbols) - structure_symbols)
    if missing or extra:
        raise ShapeError(f"lower: config {dict(symbols)} must bind exactly the structure's "
                         f"symbols {sorted(structure_symbols)} (missing {missing}, unknown "
                         f"{extra}; knobs are {', '.join(KNOBS)}); omit the symbols "
                         "to use the AStitch default")
    if binds is None:
        return graph.bind(symbols), symbols, knobs
    key = tuple(sorted(symbols.items()))
    bound = binds.get(key)
    if bound is None:
        bound = binds[key] = graph.bind(symbols)
    return bound, symbols, knobs


def _program_dtype(graph: KernelGraph) -> str:
    dtypes = {graph.tensors[t].dtype for t in graph.input_ids}
    return dtypes.pop() if len(dtypes) == 1 else "float32"


def _globals(graph: KernelGraph, plan: KernelPlan, spec: DeviceSpec) -> None:
    """Inputs and outputs in the entry point's order; other kernel tensors go to workspace."""
    io_dtype = plan.dtype  # kernels read and write the program's dtype (computing in float32)
    outs = graph.output_ids
    if len(set(outs)) != len(outs):
        raise ShapeError("lower: a tensor is marked as an output twice; mark it once")
    for k, tid in enumerate(graph.input_ids):
        t = graph.tensors[tid]
        if tid in outs:
            raise ShapeError(f"lower: input {t.name or tid} is also an output; copy it "
                             "with an op (e.g. mul_scalar 1.0) so a kernel produces it")
        layout = graph.input_layout(tid)
        plan.globals[_gname(graph, tid, "in")] = Buffer(
            _gname(graph, tid, "in"), tuple(t.shape), Level.GLOBAL, "input", io_dtype,
            io_index=k, doc="program input" + (f" ({layout}: read through its strides)"
                                               if layout != "row" else ""), layout=layout)
    for k, tid in enumerate(outs):
        t = graph.tensors[tid]
        plan.globals[_gname(graph, tid, "out")] = Buffer(
            _gname(graph, tid, "out"), tuple(t.shape), Level.GLOBAL, "output", io_dtype,
            io_index=k, doc="program output")
    for op in graph.ops:
        for tid in op.outputs:
            if op.kind != "input" and tid not in outs:
                t = graph.tensors[tid]
                n = _gname(graph, tid, "g")
                plan.globals[n] = Buffer(n, tuple(t.shape), Level.GLOBAL, "tensor",
                                         doc="between kernels: Global, kernel split")


def _gname(graph: KernelGraph, tid: int, prefix: str) -> str:
    name = graph.tensors[tid].name
    return f"{prefix}_{name}" if name and name.isidentifier() else f"{prefix}_t{tid}"


def _tensor_buffers(graph: KernelGraph, plan: KernelPlan) -> dict[int, Buffer]:
    out = {}
    outs = set(graph.output_ids)
    for op in graph.ops:
        for tid in op.outputs:
            prefix = "in" if op.kind == "input" else "out" if tid in outs else "g"
            out[tid] = plan.globals[_gname(graph, tid, prefix)]
    return out


# ---------------------------------------------------------------- one block graph


def _mapping(bg: BlockGraph, out_shape: tuple[int, ...], tile: tuple[int, ...],
             spec: DeviceSpec, knobs: MappingT[str, int]) -> Mapping:
    row_form = is_row_form(bg)
    rows, row_len = math.prod(out_shape[:-1]), out_shape[-1]
    rule = astitch_rule(rows, row_len, spec) if row_form else None
    split = knobs.get("split", rule.split if rule else 1)
    if split > 1 and not row_form:
        raise ShapeError(f"lower: split={split} needs a row-wise kernel (elementwise ops and "
                         "last-dim reductions, no for-loop); this block graph is not one")
    gpu = spec.kind != "cpu"
    tile_rows = math.prod(tile[:-1])
    if not gpu:
        threads = lanes = 1
    elif rule:
        lanes = knobs.get("lanes", rule.lanes)
        want = rule.threads if split > 1 else -(-min(rule.threads, tile_rows * lanes) // 32) * 32
        threads = knobs.get("block", max(32, want))
    else:
        threads = knobs.get("block", math.prod(int(b) for b in bg.block))
        lanes = knobs.get("lanes", min(32, 1 << max(0, math.ceil(math.log2(tile[-1])))))
    lanes = min(lanes, threads)
    if gpu and (threads % 32 or threads > spec.max_threads_per_block):
        raise ShapeError(f"lower: block={threads} threads must be a multiple of 32 and ≤ "
                         f"{spec.max_threads_per_block} on {spec.name}")
    if lanes & (lanes - 1) or threads % lanes:
        raise ShapeError(f"lower: lanes={lanes} must be a power of two dividing block={threads}")
    scheme = "split" if split > 1 else (rule.scheme if rule else "tile")
    chosen = {"block": threads, "lanes": lanes, "split": split}
    if rule and all(chosen[k] == getattr(rule, "threads" if k == "block" else k)
                    for k in chosen if k in knobs):
        reason = rule.reason
    elif knobs:
        reason = f"from the config {dict(knobs)}"
    else:
        reason = "tile kernel: lanes over the output's last dim, block size of the structure"
    return Mapping(scheme, threads, lanes, split, knobs.get("vpack", 1), reason)


def _tile_offsets(shape: tuple[int, ...], tile: tuple[int, ...], gmap: tuple[int, ...],
                  fmap: int, strides: tuple[int, ...]) -> tuple[tuple[int, int, int], int]:
    block = tuple(tile[m] * strides[m] if m >= 0 else 0 for m in gmap)
    it = tile[fmap] * strides[fmap] if fmap >= 0 else 0
    return block, it  # type: ignore[return-value]


def lower_block(bg: BlockGraph, name: str, what: str, ins: list[Buffer], outs: list[Buffer],
                spec: DeviceSpec, knobs: MappingT[str, int], plan: KernelPlan) -> list[Kernel]:
    """Lower one concrete block graph; returns one kernel, or one per phase (kernel split)."""
    ops, shapes, in_comments = expand(bg)
    f = int(bg.forloop_range)
    views: list[View] = []
    homes: dict[str, Home] = {}
    for op in bg.ops_of("input"):
        v, buf = f"t{op.outputs[0]}", ins[op.attrs["index"]]
        st = buf.strides  # a transposed input: its tiles are read through swapped strides
        block, it = _tile_offsets(buf.shape, shapes[v], op.attrs["imap"], op.attrs["fmap"], st)
        views.append(View(f"{buf.name}_{v}", buf.name, block, it if f > 1 else 0))
        homes[v] = Home(views[-1].name, st)
    out_homes, out_ops = [], bg.ops_of("output")
    for k, op in enumerate(out_ops):
        v, buf = f"t{op.inputs[0]}", outs[k]
        st = dense_strides(buf.shape)
        block, _ = _tile_offsets(buf.shape, shapes[v], op.attrs["omap"], -1, st)
        views.append(View(f"{buf.name}_o{k}", buf.name, block))
        out_homes.append(Home(views[-1].name, st))
    tile = shapes[f"t{out_ops[0].inputs[0]}"]
    mapping = _mapping(bg, outs[0].shape, tile, spec, knobs)
    split = mapping.split
    if split > 1:
        chunk_cols(tile[-1], split)
    uses: dict[str, int] = {}
    for op in ops:
        for x in op.ins:
            uses[x] = uses.get(x, 0) + 1
    inplace = {}
    for op in ops:
        if op.kind == "output":
            src = next((o for o in ops if o.out == op.ins[0]), None)
            if src and src.kind == "acc" and uses[src.out] == 1 and \
                    outs[op.attrs["index"]].dtype == "float32":
                inplace[src.out] = op.attrs["index"]
    fuser = Fuser(shapes, homes, out_homes, tile[-1], split, inplace)
    for op in ops:
        fuser.add(op)
    # execution order: before the for-loop, every iteration, after it (the fuser emits loops
    # in op order, and a body op may come before a pre one).  Loop indices are time for the
    # lifetimes below, so shared memory is only reused between buffers that are never live
    # together (qknorm_gqa's winner had rms_norm(Q), made before the loop and read in every
    # iteration, overwritten by rms_norm(V)'s row norms inside it)
    loops = sorted(fuser.finish(), key=lambda lp: STAGE_ORDER[lp.stage])
    buffers = dict(fuser.tiles)
    out_views = {v.name for v in views if v.buffer in {b.name for b in outs}}
    if split > 1:
        loops = _split_rows(loops, split, buffers)
    for lp in loops:
        lp.lanes = lanes_for(lp.cols // split if lp.chunked else lp.cols, mapping.lanes)
        for st in (*lp.col, *lp.row):
            if isinstance(st, Store) and split > 1 and not lp.chunked and \
                    st.access.view in out_views:
                st.guard = "j == 0"  # every chunk computed the row; one writes it
    phases = group_loops(loops, split)
    notes = _levels(phases, buffers, f)
    if spec.kind != "cpu" and any(lp.reductions and lp.lanes > 32 for lp in loops):
        buffers["red"] = Buffer("red", (mapping.threads // 32,), Level.REGIONAL, "scratch",
                                live=(0, len(loops)), doc="partial sums of multi-warp rows")
    limit = spec.smem_per_block_default
    if "smem_kb" in knobs:  # a tuned budget: fewer Regional tiles, more Global traffic
        limit = min(limit, 1024 * knobs["smem_kb"])
    # Triton: Regional buffers are register tiles the compiler places (its shared memory is
    # triton_smem_bytes's check), never downgraded: a Global tile would be stored and loaded
    # back by one program, which Triton does not order (_choose_triton)
    triton = bool(plan.config.get("triton"))
    smem, more = plan_shared(list(buffers.values()), math.inf if triton else limit)
    notes += more
    wave = blocks_per_wave(spec, mapping.threads)
    items = math.prod(bg.concrete_grid()) * split
    if len(phases) > 1 and "vpack" not in knobs and items > wave:
        mapping.vpack = -(-items // wave)
        mapping.scheme += "+vertical"
    views += [View(b.name, b.name) for b in buffers.values()]
    params = [b.name for b in (*ins, *outs) if b.role in ("input", "output")]
    params = list(dict.fromkeys(params))
    kernel = Kernel(name, f"{what}: {len(ops)} primitive ops", bg.concrete_grid(), f, mapping,
                    phases, views, buffers, params, smem_bytes=smem, notes=notes)
    if len(phases) == 1:
        kernels = [kernel]
    elif kernel.blocks <= wave:
        kernel.barrier, kernel.barrier_index = "grid", plan.barriers
        plan.barriers += 1
        kernel.notes.append(f"{len(phases)} phases joined by a grid barrier: {kernel.blocks} "
                            f"blocks ≤ {wave} per wave")
        kernels = [kernel]
    else:
        kernel.notes.append(f"{len(phases)} phases split into kernels: {kernel.blocks} blocks "
                            f"> {wave} per wave, a grid barrier could deadlock")
        kernels = [Kernel(f"{name}_p{p}", kernel.comment + f" (phase {p})", kernel.grid, f,
                          mapping, [ph], views, buffers, params, smem_bytes=smem,
                          notes=kernel.notes) for p, ph in enumerate(phases)]
    for k in kernels:
        schedule(k, plan, spec, knobs)
        shift_exponentials(k, limit if spec.kind != "cpu" else None)
    return kernels


def _split_rows(loops: list[Loop], split: int, buffers: dict[str, Buffer]) -> list[Loop]:
    """Task splitting: a chunked loop's row sums become partials in Global memory; what used to
    run per row after them moves to a new loop after the phase boundary, which first combines
    the ``split`` partials of each row."""
    out = []
    for lp in loops:
        out.append(lp)
        if not (lp.chunked and lp.reductions):
            continue
        lead = lp.shape[:-1]
        nxt = Loop((*lead, 1), lp.stage, comment="combine split row sums")
        stores: list[Let | Store] = []
        for red in lp.reductions:
            pname = f"p_{red.dst[2:]}"
            buffers[pname] = Buffer(pname, (*lead, split), Level.GLOBAL, "partial",
                                    per_vblock=True, doc=f"{red.dst[2:]}: per-chunk row sums "
                                    "(task splitting makes the row sum Global)")
            st = dense_strides((*lead, split))
            rows = tuple(st[d] if lead[d] > 1 else 0 for d in range(len(lead)))
            stores.append(Store(red.dst, Access(pname, rows, 1, col_index="j"),
                                comment=red.comment))
            nxt.hoisted.append(Let(red.dst, "combine", access=(Access(pname, rows, 0, red=1),),
                                   attrs={"n": split}, comment=red.comment))
        nxt.hoisted[:0] = _carried(lp.hoisted, lp.row)
        nxt.col, lp.row = lp.row, stores
        out.append(nxt)
    return out


def _carried(hoisted: list[Let], moved: list[Let | Store]) -> list[Let]:
    """The per-row values of ``hoisted`` (and what they need) that statements ``moved`` to
    the next phase read: computed again there, since a phase's variables end at its grid
    barrier (``t5 = mul(t4, W)`` after a split row sum had lost its load of W: g++ "'v_t1' was
    not declared", random_4818 of the dataset)."""
    needed = {a for st in moved if isinstance(st, Let) for a in st.args} | \
        {st.var for st in moved if isinstance(st, Store)}
    keep = []
    for h in reversed(hoisted):
        if h.var in needed:
            keep.append(h)
            needed |= set(h.args)
    return keep[::-1]


def _levels(phases: list[Phase], buffers: dict[str, Buffer], f: int) -> list[str]:
    """Lifetimes (loop indices) of tile buffers; those crossing a phase boundary go Global."""
    notes: list[str] = []
    touch: dict[str, list[tuple[int, int]]] = {}
    body: list[int] = []
    i = 0
    for p, ph in enumerate(phases):
        for lp in ph.loops:
            if lp.stage == "body":
                body.append(i)
            for st in (*lp.hoisted, *lp.col, *lp.row):
                accs = st.access if isinstance(st, Let) else (st.access,)
                for a in accs:
                    touch.setdefault(a.view, []).append((p, i))
            i += 1
    for b in buffers.values():
        if b.name not in touch:
            continue
        idx = [t[1] for t in touch[b.name]]
        lo, hi = min(idx), max(idx)
        inside = [i in body for i in idx]
        if body and (b.role == "accum" or (any(inside) and not all(inside))):
            lo, hi = min(lo, body[0]), max(hi, body[-1])  # live across every iteration
        b.live = (lo, hi)
        if b.level is Level.REGIONAL and len({t[0] for t in touch[b.name]}) > 1:
            b.level = Level.GLOBAL
            b.doc += " [Global: crosses a grid barrier]"
            notes.append(f"{b.name} is read after a grid barrier: Global")
    return notes


def _layout_workspace(plan: KernelPlan) -> None:
    """Offsets (in floats) of kernel tensors and each kernel's Global scratch in one workspace."""
    off = 0
    for b in plan.globals.values():
        if b.role == "tensor":
            b.offset, off = off, off + -(-b.elems // WS_ALIGN) * WS_ALIGN
    seen: set[int] = set()
    for k in plan.kernels:
        for b in k.buffers.values():
            if b.level is not Level.GLOBAL or id(b) in seen:
                continue
            seen.add(id(b))
            b.per_item = -(-b.elems // WS_ALIGN) * WS_ALIGN
            count = k.vblocks if b.per_vblock else k.items
            b.offset, off = off, off + b.per_item * count
    plan.workspace_floats = off
