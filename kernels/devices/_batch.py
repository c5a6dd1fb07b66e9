"""Many configs of one structure measured at once on the cpu: the dataset's fast path.

A trial measured alone pays a compiler start, a job on the isolated worker (arrays written,
the library opened) and three database writes.  ``cpu_trials`` measures a batch of configs
of one structure instead: each is lowered, re-checked in the finite field and rendered as
``run_trial`` does, then the kernels are put into a few translation units (``combine_cpp``:
the shared prelude once, each kernel's own code in a namespace of its own, its entry point
``kernel`` renamed ``kernel_<i>``), compiled by parallel compiler processes (one per core),
and each library is run by one worker job (``IsolatedWorker.run_batch``) that checks and times
its kernels one after the other, on the same inputs and with the same timing loop as a trial
(``TRIAL_TIMING``): ``_cpu.cpu_trials`` puts it together.  A kernel that crashes or hangs the worker is that kernel's
``runtime_error`` / ``timeout``; the worker is replaced and the rest of the batch goes on.
What each trial stores (its ``source``) is the kernel's own translation unit, exactly what
``run_trial`` would have stored and ``tuner.load`` compiles.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ._compile import CompileError, compile_cpp
from ._result import RunResult, _signal_text
from ._status import RUNTIME_ERROR, TIMEOUT

MARKER = "\n// ===== "  # where the cpp renderer's prelude ends and a plan's own code starts
ENTRY = 'extern "C" void kernel('
UNIT = 16  # kernels per translation unit at most


def combine_cpp(sources: Sequence[str]) -> str:
    """One translation unit holding every source (all with one prelude); source ``i``'s
    entry point is ``kernel_<i>``, the rest of its code in ``namespace tuner_b<i>``."""
    prelude = sources[0].split(MARKER, 1)[0]
    parts = [prelude]
    for i, src in enumerate(sources):
        head, sep, body = src.partition(MARKER)
        if head != prelude or not sep or body.count(ENTRY) != 1:
            raise ValueError(f"combine_cpp: source {i} is not a cpp rendering with the "
                             "shared prelude and one entry point")
        body = body.replace(ENTRY, f'extern "C" void kernel_{i}(')
        parts.append(f"namespace tuner_b{i} {{{MARKER}{body}\n}}  // namespace tuner_b{i}")
    return "\n".join(parts) + "\n"


def units(sources: Sequence[str], per_unit: int = UNIT, cores: int | None = None
          ) -> list[list[int]]:
    """Indices of ``sources`` grouped into translation units: one prelude each, at most
    ``per_unit`` kernels, at least one unit per core when there are enough kernels."""
    groups: dict[str, list[int]] = {}
    for i, src in enumerate(sources):
        groups.setdefault(src.split(MARKER, 1)[0], []).append(i)
    cores = cores or os.cpu_count() or 1
    out = []
    for idx in groups.values():
        n = max(-(-len(idx) // per_unit), min(cores, len(idx)))
        size = -(-len(idx) // n)
        out += [idx[k:k + size] for k in range(0, len(idx), size)]
    return out


def compile_units(sources: Sequence[str], groups: list[list[int]], jobs: int | None = None
                  ) -> dict[int, tuple[Path, str] | CompileError]:
    """Compile each group as one library (parallel compilers, ``jobs`` at most): kernel
    ``i`` -> (its library, its entry point), or the compiler's error for that kernel alone (a
    unit that fails is compiled kernel by kernel, to name the culprit)."""
    out: dict[int, tuple[Path, str] | CompileError] = {}

    def build(group: list[int]) -> dict[int, tuple[Path, str] | CompileError]:
        try:
            if len(group) == 1:
                return {group[0]: (compile_cpp(sources[group[0]]), "kernel")}
            lib = compile_cpp(combine_cpp([sources[i] for i in group]))
            return {i: (lib, f"kernel_{k}") for k, i in enumerate(group)}
        except (CompileError, ValueError) as err:
            if len(group) == 1:
                return {group[0]: err if isinstance(err, CompileError)
                        else CompileError(str(err))}
            res: dict[int, tuple[Path, str] | CompileError] = {}
            for i in group:
                res.update(build([i]))
            return res

    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        for part in pool.map(build, groups):
            out.update(part)
    return out


class BatchRunner:
    """``IsolatedWorker.run_batch``'s loop over one library's entry points (see there)."""

    def __init__(self, worker: Any, msg: dict, env: dict, n: int,
                 timeout_s: float) -> None:
        self.worker, self.msg, self.env, self.timeout_s = worker, msg, env, timeout_s
        self.results: list[RunResult | None] = [None] * n

    def next_index(self, start: int) -> int:
        return next((i for i in range(start, len(self.results)) if self.results[i] is None),
                    len(self.results))

    def run(self) -> list[RunResult]:
        start = 0
        while start < len(self.results):
            start = self._serve(start)
        return [r for r in self.results if r is not None]

    def _serve(self, start: int) -> int:
        """One worker process serves the functions from ``start`` on; returns where the next
        process starts (after a crash or a hang, past the function that caused it)."""
        w = self.worker
        try:
            w.start(self.env)
        except RuntimeError as e:
            for i in range(start, len(self.results)):
                self.results[i] = RunResult(RUNTIME_ERROR, str(e))
            return len(self.results)
        log_offset = w._log.stat().st_size if w._log.exists() else 0
        name = Path(self.msg["library"]).name
        try:
            w._conn.send({**self.msg, "start": start})
            while True:
                i = self.next_index(start)
                t0 = time.perf_counter()
                if not w._conn.poll(self.timeout_s):
                    pid = w._proc.pid
                    w._stop()
                    self.results[i] = RunResult(
                        TIMEOUT, f"kernel {self.msg['functions'][i]!r} from {name} did not "
                        f"finish within {self.timeout_s:g} s; worker pid {pid} killed and "
                        "replaced", wall_s=self.timeout_s)
                    return i + 1
                reply = w._conn.recv()
                if reply.get("done"):
                    return len(self.results)
                aborted = "index" not in reply  # the batch stopped on an exception
                index = reply.pop("index", i)
                status, message = reply.pop("status"), reply.pop("message", "")
                self.results[index] = RunResult(status, message, reply,
                                                time.perf_counter() - t0)
                if aborted:
                    return i + 1  # the same process goes on past it
        except (EOFError, OSError, BrokenPipeError):
            i = self.next_index(start)
            w._proc.join(5)
            code = w._proc.exitcode
            w._stop()
            tail = w._log_tail(log_offset)
            said = tail.split("Fatal Python error")[0].strip()
            self.results[i] = RunResult(
                RUNTIME_ERROR, f"kernel {self.msg['functions'][i]!r} from {name} crashed the "
                f"worker ({_signal_text(code)})" + (f"; it printed:\n{said}" if said else ""),
                {"exitcode": code, "log": tail})
            return i + 1
