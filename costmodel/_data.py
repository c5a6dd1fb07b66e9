"""Training examples: our own measured kernels and real GPU spaces from Kernel Tuner.

Every example is a ``Sample`` with its measured seconds.  Only ``ok`` measurements are
examples: a failed config (a compile error, a wrong result, Kernel Tuner's ``"InvalidConfig"``)
has no time to learn, and Kernel Tuner leaves failed configurations out of its own spaces too,
so the comparison with its strategies is like for like.  (docs/costmodel.md)
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

from kernels import OK, DeviceSpec, replay_key
from search.ir import from_obj

from ._devices import device_profile
from ._features import Sample, StoredConfigs, featurize, featurize_params, group_name


@dataclass(frozen=True)
class KernelTunerSpace:
    """One Kernel Tuner cache file: a tunable kernel on one GPU, every configuration timed."""

    kernel: str
    device: str  # the GPU's name (the file name where the cache has none)
    problem_size: tuple[int, ...]
    keys: tuple[str, ...]  # the tunable parameters, in the cache's order
    configs: tuple[dict, ...]  # parameter values of every configuration
    times_s: tuple[float, ...]  # seconds (nan: the configuration failed on this GPU)
    failures: tuple[str | None, ...] = ()  # Kernel Tuner's marker of a failed configuration

    @property
    def device_key(self) -> str:
        return replay_key(self.device)


class CacheFormatError(ValueError):
    """A Kernel Tuner cache file that cannot be read: the message names the file and why."""


def read_kernel_tuner(path: str | Path) -> KernelTunerSpace:
    """Parse a Kernel Tuner cache file (JSON, gzip or not); raise ``CacheFormatError``."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        doc = json.loads(text)
    except (OSError, EOFError, ValueError) as err:
        raise CacheFormatError(f"{path}: not a readable Kernel Tuner cache "
                               f"(gzip-compressed JSON): {err}") from None
    for key in ("tune_params_keys", "cache"):
        if not isinstance(doc, dict) or key not in doc:
            raise CacheFormatError(f"{path}: no {key!r} key: not a Kernel Tuner cache file")
    keys = doc["tune_params_keys"]
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise CacheFormatError(f"{path}: 'tune_params_keys' must be a list of parameter names")
    if not isinstance(doc["cache"], dict) or not doc["cache"]:
        raise CacheFormatError(f"{path}: 'cache' must be a non-empty object of configurations")
    configs: list[dict] = []
    times: list[float] = []
    failures: list[str | None] = []
    for name, entry in doc["cache"].items():
        if not isinstance(entry, dict) or any(k not in entry for k in keys):
            raise CacheFormatError(f"{path}: cache entry {name!r} lacks the parameters {keys}")
        configs.append({k: entry[k] for k in keys})
        t = entry.get("time")
        if isinstance(t, int | float) and math.isfinite(t) and t > 0:
            times.append(float(t) * 1e-3)  # Kernel Tuner's are milliseconds
            failures.append(None)
        else:
            times.append(math.nan)
            failures.append(str(t))
    size = doc.get("problem_size") or []
    size = size if isinstance(size, list) else [size]
    device = str(doc.get("device_name") or "").strip() or path.name.split(".")[0]
    return KernelTunerSpace(str(doc.get("kernel_name") or path.name.split(".")[0]), device,
                            tuple(int(d) for d in size if isinstance(d, int | float)),
                            tuple(keys), tuple(configs), tuple(times), tuple(failures))


def kernel_tuner_samples(space: KernelTunerSpace) -> list[Sample]:
    """One sample per configuration that ran (failed ones have no time to learn)."""
    profile = device_profile(space.device_key)
    group = group_name(space.kernel, space.device)
    out = []
    for config, seconds in zip(space.configs, space.times_s, strict=True):
        if not math.isnan(seconds):
            s = featurize_params(config, space.keys, space.problem_size, profile.spec,
                                 group=group, program=space.kernel, device=space.device_key,
                                 known_device=profile.known)
            s.seconds = seconds
            out.append(s)
    return out


def _spec_from(meta: dict) -> DeviceSpec:
    known = {f.name for f in fields(DeviceSpec)}
    return DeviceSpec(**{k: v for k, v in meta.items() if k in known})


def sweep_samples(path: str | Path) -> Iterator[Sample]:
    """Samples of the ``ok`` trials of a ``benchmarks/sweep.py`` file (JSON lines, gzip or
    not): every structure is in the file, so features are computed anew."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        records = [json.loads(line) for line in f if line.strip()]
    meta = next(r for r in records if r["kind"] == "meta")
    spec, device = _spec_from(meta["spec"]), meta["device_key"]
    graphs = {(r["program"], r["hash"]): from_obj(r["graph"]) for r in records
              if r["kind"] == "structure"}
    stored = StoredConfigs()
    for r in records:
        if r["kind"] != "trial" or r["status"] != OK:
            continue
        graph = graphs[(r["program"], r["structure"])]
        s = featurize(graph, r["config"], spec,
                      group=group_name(f"{r['program']}/{r['structure'][:12]}", device),
                      program=r["program"], device=device)
        s.config = stored.canonical(graph, r["structure"], spec, s.config)
        s.seconds = float(r["median_s"])
        yield s


def concat(*parts: Iterable[Sample]) -> list[Sample]:
    return [s for part in parts for s in part]
