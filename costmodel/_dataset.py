"""The dataset file: a database's measurements as one compact, versioned file kept in the
repository (``benchmarks/data/dataset_<cpu>.jsonl.gz``), so every machine trains on them.

Format (JSON lines, gzip; ``FORMAT_VERSION``), one object a line, ``kind`` first:

- ``header`` (the first line): ``format`` ("tuner-dataset"), ``version``, ``cpu`` (model
  name), ``isa``, ``device_key``, ``feature_version`` (of the code that wrote it);
- ``program``: ``key`` (16 hex of the program hash, shapes and dtype), ``hash``, ``shapes``,
  ``dtype``, ``name``, ``graph`` (the reference µGraph or Kernel Tuner object);
- ``structure``: ``program`` (its key), ``hash``, ``graph`` — once per structure;
- ``m`` (a measurement, the bulk): ``p`` program key, ``s`` structure hash, ``c`` config,
  ``d`` device key, ``st`` status, ``t`` median seconds (ok only), ``msg`` (failed only).

Every program and structure line comes before the first measurement that names it.  A later
export appends a gzip member holding only what the file lacks (measurements are identified by
program, structure, config and device), so a run adds to the file rather than rewriting it;
``read_dataset`` checks every line before ``import_dataset`` writes anything.  A
``benchmarks/sweep.py`` file (its first line a ``meta`` record) is read as the same records.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import db
from kernels import INVALID, KNOBS, MEASUREMENT_STATUSES, OK, device_key
from kernels.machine import cpu_name, cpu_vector_isa
from search.ir import GraphFormatError, from_obj, load_program, structural_hash

from ._features import FEATURE_VERSION

FORMAT = "tuner-dataset"
FORMAT_VERSION = 1
SIZE_BUDGET_BYTES = 5 * 1024 * 1024  # for 20,000 measurements (docs/costmodel.md)


class DatasetFormatError(ValueError):
    """A dataset file that cannot be read: the message names the file, the line and why."""


@dataclass
class Dataset:
    """A dataset file's content: programs and structures by key, measurements in order."""

    header: dict
    programs: dict[str, dict] = field(default_factory=dict)
    structures: dict[tuple[str, str], dict] = field(default_factory=dict)
    measurements: list[dict] = field(default_factory=list)
    symbols: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # µGraph structures'
    # a sweep's trials of configs the lowering refused (``invalid``): nothing was measured
    not_measured: int = 0

    def keys(self) -> set[tuple]:
        """What identifies each measurement (program, structure, config, device)."""
        return {_mkey(m) for m in self.measurements}


def _mkey(m: dict) -> tuple:
    return (m["p"], m["s"], db.config_hash(m["c"]), m["d"])


def program_key(program_hash: str, shapes: Any, dtype: str) -> str:
    text = json.dumps([program_hash, db.shapes_key(shapes), dtype])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def local_header() -> dict:
    """The header of a dataset of this machine's CPU."""
    return {"kind": "header", "format": FORMAT, "version": FORMAT_VERSION, "cpu": cpu_name(),
            "isa": cpu_vector_isa()[1], "device_key": device_key("cpu"),
            "feature_version": FEATURE_VERSION}


def default_path(directory: str | Path = "benchmarks/data") -> Path:
    """``benchmarks/data/dataset_<cpu>.jsonl.gz``, the CPU named as a file name can hold."""
    slug = "".join(c if c.isalnum() else "-" for c in cpu_name().lower()).strip("-")
    while "--" in slug:
        slug = slug.replace("--", "-")
    return Path(directory) / f"dataset_{slug}.jsonl.gz"


# ---------------------------------------------------------------- reading


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        raw = path.read_bytes()
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        decoded = text.decode()
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile, UnicodeDecodeError) as err:
        raise DatasetFormatError(f"{path}: not a readable dataset file (gzip JSON lines): "
                                 f"{err}") from None
    for n, line in enumerate(decoded.splitlines(), 1):
        if line.strip():
            yield n, line


def read_dataset(path: str | Path) -> Dataset:
    """Parse and check a dataset (or ``benchmarks/sweep.py``) file, every line; raise
    ``DatasetFormatError`` naming the file, the line and what is wrong."""
    path = Path(path)
    records = []
    for n, line in _lines(path):
        try:
            rec = json.loads(line)
        except ValueError as err:
            raise DatasetFormatError(f"{path}:{n}: not JSON: {err}") from None
        if not isinstance(rec, dict) or "kind" not in rec:
            raise DatasetFormatError(f"{path}:{n}: each line is an object with a 'kind'")
        records.append((n, rec))
    if not records:
        raise DatasetFormatError(f"{path}: empty: no header line")
    first = records[0][1]
    if first["kind"] == "meta":
        return _from_sweep(path, records)
    if first["kind"] != "header" or first.get("format") != FORMAT:
        raise DatasetFormatError(f"{path}:{records[0][0]}: the first line must be the header "
                                 f"{{\"kind\": \"header\", \"format\": \"{FORMAT}\", ...}}")
    if first.get("version") != FORMAT_VERSION:
        raise DatasetFormatError(f"{path}:{records[0][0]}: format version "
                                 f"{first.get('version')!r}; this code reads {FORMAT_VERSION}")
    data = Dataset(first)
    for n, rec in records[1:]:
        _add(data, path, n, rec)
    return data


def _need(rec: dict, path: Path, n: int, keys: dict[str, type | tuple]) -> None:
    for k, t in keys.items():
        if k not in rec:
            raise DatasetFormatError(f"{path}:{n}: {rec['kind']} line lacks {k!r}")
        if not isinstance(rec[k], t):
            raise DatasetFormatError(f"{path}:{n}: {rec['kind']} {k!r} has the wrong type "
                                     f"({type(rec[k]).__name__})")


def _add(data: Dataset, path: Path, n: int, rec: dict) -> None:
    kind = rec["kind"]
    if kind == "header":  # an appended member repeats it
        return
    if kind == "program":
        _need(rec, path, n, {"key": str, "hash": str, "shapes": (dict, list), "dtype": str,
                             "name": str, "graph": dict})
        data.programs.setdefault(rec["key"], rec)
    elif kind == "structure":
        _need(rec, path, n, {"program": str, "hash": str, "graph": dict})
        if rec["program"] not in data.programs:
            raise DatasetFormatError(f"{path}:{n}: structure of program {rec['program']!r}, "
                                     "which no earlier line defines")
        if "kernel_tuner" not in rec["graph"]:
            try:
                graph = from_obj(rec["graph"])
            except (GraphFormatError, ValueError, KeyError, TypeError) as err:
                raise DatasetFormatError(f"{path}:{n}: structure {rec['hash'][:16]}: not a "
                                         f"µGraph: {err}") from None
            data.symbols.setdefault((rec["program"], rec["hash"]), graph.symbols())
        data.structures.setdefault((rec["program"], rec["hash"]), rec)
    elif kind == "m":
        _need(rec, path, n, {"p": str, "s": str, "c": dict, "d": str, "st": str})
        if (rec["p"], rec["s"]) not in data.structures:
            raise DatasetFormatError(f"{path}:{n}: measurement of structure {rec['s'][:16]}, "
                                     "which no earlier line defines")
        if (rec["p"], rec["s"]) in data.symbols:
            _check_config(rec["c"], data.symbols[rec["p"], rec["s"]], path, n)
        if rec["st"] not in MEASUREMENT_STATUSES:
            raise DatasetFormatError(f"{path}:{n}: status {rec['st']!r}; one of "
                                     f"{', '.join(MEASUREMENT_STATUSES)}")
        t = rec.get("t")
        if rec["st"] == OK and not (isinstance(t, int | float) and math.isfinite(t) and t > 0):
            raise DatasetFormatError(f"{path}:{n}: an ok measurement needs a time t > 0 "
                                     f"(seconds), got {t!r}")
        data.measurements.append(rec)
    else:
        raise DatasetFormatError(f"{path}:{n}: unknown kind {kind!r} (header, program, "
                                 "structure, m)")


def _check_config(config: dict, symbols: set[str], path: Path, n: int) -> None:
    """A µGraph config: whole numbers, binding the structure's symbols (or none of them: the
    AStitch default) beside the mapping knobs, as ``kernels.lower`` takes it."""
    bad = [k for k, v in config.items() if type(v) is not int]
    if bad:
        raise DatasetFormatError(f"{path}:{n}: config {config}: {bad[0]!r} is not a whole "
                                 "number")
    bound = set(config) - set(KNOBS)
    if bound and bound != symbols:
        raise DatasetFormatError(f"{path}:{n}: config {config} binds {sorted(bound)}; the "
                                 f"structure's symbols are {sorted(symbols)} (knobs: "
                                 f"{', '.join(KNOBS)})")


def _from_sweep(path: Path, records: list[tuple[int, dict]]) -> Dataset:
    """A ``benchmarks/sweep.py`` file as dataset records: its programs built from the suite at
    the file's shapes (so they land where a launch of them would), its trials as measurements."""
    meta = records[0][1]
    data = Dataset({"kind": "header", "format": FORMAT, "version": FORMAT_VERSION,
                    "cpu": None, "isa": None, "device_key": meta.get("device_key"),
                    "feature_version": None, "from": "benchmarks/sweep.py"})
    keys: dict[str, str] = {}
    for n, rec in records[1:]:
        try:
            if rec["kind"] == "structure":
                if rec["program"] not in keys:
                    program = load_program(rec["program"], rec["shapes"])
                    phash = structural_hash(program.build())
                    pkey = program_key(phash, rec["shapes"], rec["dtype"])
                    keys[rec["program"]] = pkey
                    _add(data, path, n, {"kind": "program", "key": pkey, "hash": phash,
                                         "shapes": rec["shapes"], "dtype": rec["dtype"],
                                         "name": rec["program"],
                                         "graph": _graph_obj(program.build())})
                _add(data, path, n, {"kind": "structure", "program": keys[rec["program"]],
                                     "hash": rec["hash"], "graph": rec["graph"]})
            elif rec["kind"] == "trial" and rec.get("status") == INVALID:
                data.not_measured += 1  # refused before anything was built: no measurement
            elif rec["kind"] == "trial":
                _add(data, path, n, {"kind": "m", "p": keys[rec["program"]],
                                     "s": rec["structure"], "c": rec["config"],
                                     "d": meta["device_key"], "st": rec["status"],
                                     "t": rec.get("median_s"), "msg": rec.get("message")})
        except (KeyError, TypeError, ValueError) as err:
            if isinstance(err, DatasetFormatError):
                raise
            raise DatasetFormatError(f"{path}:{n}: sweep {rec['kind']} record: {err!r}") from None
    return data


def _graph_obj(graph: Any) -> dict:
    from search.ir import to_obj

    return to_obj(graph)


# ---------------------------------------------------------------- the database


def import_dataset(database: db.Database, data: Dataset, host: str | None = None) -> dict:
    """Store a checked dataset: per structure x device, one idempotent measured space
    (``db.record_measured_space``); what is stored already is left alone."""
    spaces: dict[tuple[str, str, str], list[db.MeasuredConfig]] = {}
    for m in data.measurements:
        spaces.setdefault((m["p"], m["s"], m["d"]), []).append(db.MeasuredConfig(
            m["c"], m["st"], m.get("t") if m["st"] == OK else None,
            None if m["st"] == OK else (m.get("msg") or None)))
    added = 0
    for (pkey, shash, device), configs in spaces.items():
        p, s = data.programs[pkey], data.structures[(pkey, shash)]
        new, _ = db.record_measured_space(
            database, program_hash=p["hash"], shapes=p["shapes"], dtype=p["dtype"],
            name=p["name"], graph=p["graph"], structure_hash=shash, structure=s["graph"],
            device_key=device, configs=configs, host=host)
        added += new
    return {"measurements": len(data.measurements), "added": added,
            "not_measured": data.not_measured,
            "programs": len(data.programs), "structures": len(data.structures),
            "devices": sorted({m["d"] for m in data.measurements})}


def export_dataset(database: db.Database, path: str | Path, *,
                   device_prefix: str | None = None, header: dict | None = None) -> dict:
    """Append the database's measurements (of devices whose key starts with
    ``device_prefix``) that ``path`` lacks, as one new gzip member; create the file with
    ``header`` (default: this CPU's) when there is none.  Returns counts and the file size."""
    path = Path(path)
    have = read_dataset(path) if path.exists() else None
    known = have.keys() if have else set()
    programs = set(have.programs) if have else set()
    structures = set(have.structures) if have else set()
    lines: list[str] = [] if have else [json.dumps(header or local_header(), sort_keys=True)]
    added = 0
    for r in db.dataset_rows(database, device_prefix):
        pkey = program_key(r.program_hash, r.shapes, r.dtype)
        m: dict[str, Any] = {"kind": "m", "p": pkey, "s": r.structure_hash, "c": r.config,
                             "d": r.device_key, "st": r.status}
        if r.status == OK:
            m["t"] = r.median_s
        elif r.message:
            m["msg"] = r.message[:200]
        if _mkey(m) in known:
            continue
        if pkey not in programs:
            programs.add(pkey)
            lines.append(json.dumps({"kind": "program", "key": pkey, "hash": r.program_hash,
                                     "shapes": r.shapes, "dtype": r.dtype, "name": r.program,
                                     "graph": r.program_graph}, sort_keys=True))
        if (pkey, r.structure_hash) not in structures:
            structures.add((pkey, r.structure_hash))
            lines.append(json.dumps({"kind": "structure", "program": pkey,
                                     "hash": r.structure_hash, "graph": r.structure},
                                    sort_keys=True))
        known.add(_mkey(m))
        lines.append(json.dumps(m, sort_keys=True))
        added += 1
    if added or not have:
        with gzip.open(path, "at", compresslevel=9) as f:  # a new member: earlier ones stay
            f.write("\n".join(lines) + "\n")
    total = len(known)
    return {"file": str(path), "added": added, "measurements": total,
            "bytes": path.stat().st_size, "budget_bytes": SIZE_BUDGET_BYTES}
