"""Cached kernels: the best verified kernel of a program, from the database, as a callable.

``best`` answers "what is the fastest kernel we ever found for this program at these shapes on
this device" with one indexed lookup; ``load`` turns the answer into a function on arrays,
compiling the stored source (the compile is cached on disk by source hash, so a second process
pays nothing).  Only kernels that passed every verification layer and the numeric check are in
the best table (``db.Database.update_best`` accepts only 'ok' measurements), so only those are
ever returned.
"""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import db
from kernels import OK
from search import Program, builtin_names, from_obj, graph_program, load_program

from ..api import InputError
from ..formatting import SETTLE
from ..identity import program_key


class UncertainBestWarning(UserWarning):
    """``tuner.load`` served a best stored *uncertain*: its timings could not settle it (a
    loaded or noisy machine, a runner-up within the noise; docs/launch.md, "Uncertain
    bests"), so another config may be faster."""


def resolve_device_key(device: str | None) -> str | None:
    """``cpu`` / ``cuda`` mean this machine's device; anything else is a stored device key."""
    if device in (None, ""):
        return None
    from kernels import DEVICE_KINDS, cuda_available, device_key, parse_device_name

    try:
        kind, index = parse_device_name(device)
    except ValueError:  # a stored device key
        return device
    if kind == "cuda" and not (usable := cuda_available())[0]:
        raise InputError(f"device {device!r} means this machine's GPU, and none is usable "
                         f"here ({usable[1]}); give the stored device key instead (`tuner "
                         "status` lists them)")
    return device_key(kind, index or 0) if kind in DEVICE_KINDS else device


def launch_hint(name: str, shapes: Mapping[str, Sequence[int]], device: str | None = None,
                elsewhere: Sequence[str] = ()) -> str:
    """What to do when nothing is stored for ``name`` at ``shapes`` (on ``device``, when one
    was asked for; ``elsewhere``: the device keys that do have a kernel of it)."""
    sets = " ".join(f"--set {k}={'x'.join(str(d) for d in v)}" for k, v in shapes.items())
    if device and elsewhere:
        return (f"no tuned kernel for {name} ({sets}) on {resolve_device_key(device)!r} in "
                f"this database; it has one on {', '.join(map(repr, elsewhere))}: give one "
                "of those as the device, or none for the fastest")
    return (f"no tuned kernel for {name} ({sets}) in this database; tune it with `tuner launch "
            f"JOB.yaml` (a job listing `{{name: {name}, set: ...}}`; see "
            "examples/quickstart.yaml)")


def tuned_elsewhere(program: Program, device: str | None, database: db.Database | None = None,
                    url: str | None = None) -> list[str]:
    """The device keys with a best kernel of ``program`` at its shapes (none looked up
    without a ``device``: then every device was asked already)."""
    if not device:
        return []
    key = program_key(program)
    own = database is None
    database = database or db.connect(url, migrate_schema=False)
    try:
        return [b.device_key for b in database.best_kernels(key.program_hash, key.shapes,
                                                              key.dtype)]
    finally:
        if own:
            database.close()


def resolve_program(spec: str, overrides: Mapping[str, Any] | None = None,
                    database: db.Database | None = None, url: str | None = None) -> Program:
    """``spec`` as ``load_program`` reads it (a built-in name or a program file), or else the
    program stored in the database (``database``, or the one at ``url``) under that name: a
    PyTorch region (``torch_<hash>``, as the compile's report names it) or a Mirage graph's
    program exist nowhere else.  ``overrides`` (``--set I0=16x512``) then choose among the
    shapes it is stored at; a name stored at several, unchosen, is an error listing them."""
    if spec in builtin_names() or Path(spec).suffix in (".yaml", ".yml") or Path(spec).exists():
        return load_program(spec, overrides)
    if database is None:
        try:
            with db.connect(url, migrate_schema=False) as opened:
                stored = opened.program_graphs(spec)
        except Exception:  # no database there: the name is simply unknown
            stored = []
    else:
        stored = database.program_graphs(spec)
    if not stored:
        return load_program(spec, overrides)  # its error: not a built-in, no such file
    programs = [graph_program(from_obj(graph), spec) for _, _, graph in stored]
    wanted = {k: str(v) for k, v in (overrides or {}).items()}
    chosen = [p for p in programs if all(
        k in p.inputs and "x".join(map(str, p.inputs[k])) == v for k, v in wanted.items())]
    if len(chosen) == 1:
        return chosen[0]
    held = "; ".join(f"{p.dtype} " + " ".join(f"--set {k}={'x'.join(map(str, v))}"
                                              for k, v in p.inputs.items()) for p in programs)
    if not chosen:
        raise InputError(f"{spec}: the database holds it only at other shapes: {held}")
    raise InputError(f"{spec}: the database holds {len(chosen)} programs of that name; choose "
                     f"one with its --set values: {held}")


def best(program: str | Program, overrides: Mapping[str, Any] | None = None, *,
         device: str | None = None, url: str | None = None,
         database: db.Database | None = None) -> db.BestKernel | None:
    """The best stored kernel of ``program`` (a built-in name, a program file, a Program, or
    a name only the database knows: ``resolve_program``) at its shapes (after ``overrides``)
    on ``device`` (a device key, or ``cpu``/``cuda`` for this machine's; None: the fastest on
    any device).  None when nothing was tuned."""
    prog = program if isinstance(program, Program) else \
        resolve_program(program, overrides, database, url)
    key = program_key(prog)
    own = database is None
    database = database or db.connect(url, migrate_schema=False)
    try:
        return database.best_kernel(key.program_hash, key.shapes, key.dtype,
                                    resolve_device_key(device))
    finally:
        if own:
            database.close()


def load(program: str | Program, overrides: Mapping[str, Any] | None = None, *,
         device: str | None = "cpu", url: str | None = None,
         database: db.Database | None = None) -> Callable[..., list]:
    """The best stored kernel of ``program`` as a function ``f(*arrays) -> [outputs]``.

    cpu kernels take and return numpy arrays (or torch CPU tensors) of the program's dtype;
    cuda kernels CuPy arrays.  An input the program declares ``layout: transposed`` is passed
    as stored: the contiguous transpose of its last two dims (``W.t()``'s memory, e.g. a
    Linear weight as PyTorch keeps it).  Raises ``InputError`` (with the launch command to
    run) when nothing was tuned; warns (``UncertainBestWarning``) when the best was stored
    uncertain (``record.uncertain``: its timings could not settle it).
    """
    prog = program if isinstance(program, Program) else \
        resolve_program(program, overrides, database, url)
    record = best(prog, device=device, url=url, database=database)
    if record is None:
        raise InputError(launch_hint(prog.name, prog.inputs, device,
                                     tuned_elsewhere(prog, device, database, url)))
    if record.uncertain:  # served, but never silently
        warnings.warn(f"tuner.load: the best of {prog.name} on {record.device_key} "
                      f"({record.time_s * 1e3:.3f} ms) is UNCERTAIN: {record.uncertain}; "
                      f"another config may be faster: {SETTLE}", UncertainBestWarning,
                      stacklevel=2)
    return kernel_from_record(record, prog.name)


def bests_at_stored_shapes(spec: str, program: Program, database: db.Database,
                           device: str | None = None
                           ) -> list[tuple[Program, db.BestKernel, dict[str, str]]]:
    """The best kernel of the program ``spec`` (loaded as ``program``) at each shapes the
    database holds it at: (the program at those shapes, its best, the ``--set`` values)."""
    import json

    found = []
    for summary in database.programs():
        shapes = json.loads(summary.shapes_key)
        if summary.name != program.name or summary.dtype != program.dtype \
                or not isinstance(shapes, dict):
            continue
        sets = {k: "x".join(map(str, v)) for k, v in shapes.items()}
        try:
            candidate = load_program(spec, sets)
        except Exception:  # shapes this program file no longer accepts
            continue
        record = best(candidate, device=device, database=database)
        if record is not None:
            found.append((candidate, record, sets))
    return found


def tuned_best(database: db.Database, program_hash: str, shapes: Any, dtype: str,
               device_key: str) -> float | None:
    """The fastest tuned kernel's time on ``device_key``, the library path aside: the best
    row's when a kernel holds it, else the lowest median over the trials whose every timing
    passed (None: no kernel passed)."""
    best = database.best_kernel(program_hash, shapes, dtype, device_key)
    if best is not None and not best.library:
        return best.time_s
    timings: dict[int, list] = {}
    for h in database.history(program_hash, shapes, dtype, device_key):
        if not h.structure_hash.startswith(db.LIBRARY_PREFIX):
            timings.setdefault(h.trial_id, []).append(h)
    medians = [statistics.median(h.median_s for h in hs) for hs in timings.values()
               if all(h.status == OK for h in hs)]
    return min(medians, default=None)


def kernel_from_record(record: db.BestKernel, name: str = "kernel") -> Callable[..., list]:
    """Compile a best-kernel record's stored source for its device and wrap it; where the
    library path won, the reference graph op by op (``kernels.LibraryKernel``)."""
    from kernels import device_kind, get_device, library_kernel

    # a cpu key runs on this machine's cpu, any other (cuda, a replayed GPU) on its GPU
    kind = "cpu" if device_kind(record.device_key) == "cpu" else "cuda"
    if record.library:
        return library_kernel(from_obj(record.structure), kind, name)
    structure = from_obj(record.structure)
    config = {k: int(v) for k, v in (record.config or {}).items()}
    device = get_device(kind)
    return device.load(device.lower(structure, config, name), record.source)
