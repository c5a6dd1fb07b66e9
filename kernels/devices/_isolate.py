"""Fault isolation, the parent side: run a compiled kernel in a worker process that may die
instead of us.

A generated kernel can segfault, corrupt the heap or loop forever; the tuner must record that
and carry on. `IsolatedWorker` keeps one 'spawn' process alive across jobs (a fresh process per
job would cost ~0.2 s of Python + numpy start-up each time) and replaces it after a crash or a
timeout. Arrays travel as .npy files in a per-worker directory on /dev/shm (RAM-backed), so no
large pickles cross the pipe and nothing leaks into a shared-memory registry when a worker dies.
The process itself, the calling convention and ``call`` jobs are ``_worker.py``.

A job is validated here (``_validate``: every key, array and shape, with the fix in the error)
and C++ source is compiled here, before the worker sees it.  A call job that answers
`runtime_error` has its worker replaced before the next job.  Environment variables (`env`, per
worker or per job: OMP_NUM_THREADS, ...) are set when the worker process starts.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ._batch import BatchRunner
from ._compile import CompileError, compile_cpp, cpp_flags
from ._result import RunResult, _signal_text
from ._status import COMPILE_ERROR, OK, RUNTIME_ERROR, TIMEOUT, WRONG_RESULT
from ._storage import STORAGE
from ._worker import worker_main

_JOB_KEYS = {"library", "source", "call", "args", "env", "flags", "function", "inputs",
             "outputs", "expected", "slack", "rtol", "atol", "timing", "output_fill",
             "storage"}
_ENV_LOCK = threading.Lock()  # os.environ is patched while a worker process is spawned


def _shm_base() -> str:
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def _validate(job: dict) -> dict:
    """Normalize a job dict; raise ValueError naming the bad field and the fix."""
    if not isinstance(job, dict):
        raise ValueError(f"run_isolated: job must be a dict, got {type(job).__name__}")
    unknown = set(job) - _JOB_KEYS
    if unknown:
        raise ValueError(f"run_isolated: unknown job keys {sorted(unknown)}; "
                         f"allowed: {sorted(_JOB_KEYS)}")
    if sum(k in job for k in ("library", "source", "call")) != 1:
        raise ValueError("run_isolated: give exactly one of job['library'] (path to a .so), "
                         "job['source'] (C++ code) or job['call'] ('module:function')")
    if "call" in job and (not isinstance(job["call"], str) or ":" not in job["call"]):
        raise ValueError(f"run_isolated: job['call']={job['call']!r} must be 'module:function'")
    env = job.get("env") or {}
    if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in env.items()):
        raise ValueError("run_isolated: job['env'] must map variable names to strings (or "
                         "None to unset), e.g. {'OMP_NUM_THREADS': '1'}")

    def f32(name: str) -> list[np.ndarray]:
        arrs = list(job.get(name) or [])
        for i, a in enumerate(arrs):
            if not isinstance(a, np.ndarray) or a.dtype != np.float32:
                what = a.dtype if isinstance(a, np.ndarray) else type(a).__name__
                raise ValueError(f"run_isolated: job[{name!r}][{i}] is {what}; the calling "
                                 "convention takes float32 numpy arrays "
                                 "(convert with np.asarray(x, dtype=np.float32))")
        return arrs

    inputs, expected = f32("inputs"), f32("expected")
    shapes = []
    for i, s in enumerate(job.get("outputs") or []):
        s = (s,) if isinstance(s, int) else tuple(s)
        if not all(isinstance(n, (int, np.integer)) and n >= 0 for n in s):
            raise ValueError(f"run_isolated: job['outputs'][{i}]={s!r} is not a shape "
                             "(a tuple of non-negative ints)")
        shapes.append(tuple(int(n) for n in s))
    if expected and [e.shape for e in expected] != shapes:
        raise ValueError(f"run_isolated: job['expected'] shapes {[e.shape for e in expected]} "
                         f"differ from job['outputs'] {shapes}")
    slack = f32("slack")
    if slack and [s.shape for s in slack] != [e.shape for e in expected]:
        raise ValueError(f"run_isolated: job['slack'] shapes {[s.shape for s in slack]} differ "
                         f"from job['expected'] {[e.shape for e in expected]}: give one "
                         "per-element slack array per expected output (Expected.slack)")
    timing = job.get("timing", {})
    if timing is not None and not isinstance(timing, dict):
        raise ValueError("run_isolated: job['timing'] must be a dict of kernels.devices.measure "
                         "keyword arguments, or None to run once without timing")
    return {
        "library": str(Path(job["library"]).resolve()) if "library" in job else None,
        "call": job.get("call"), "args": dict(job.get("args") or {}), "env": dict(env),
        "source": job.get("source"), "flags": tuple(job.get("flags") or cpp_flags()),
        "function": str(job.get("function", "kernel")),
        "inputs": inputs, "expected": expected, "slack": slack, "output_shapes": shapes,
        "rtol": float(job.get("rtol", 1e-4)), "atol": float(job.get("atol", 1e-5)),
        "timing": timing, "output_fill": float(job.get("output_fill", np.nan)),
        "storage": _storage(job, len(inputs) + len(shapes)),
    }


def _storage(job: dict, n: int) -> list[str]:
    """The storage dtype of each input then output the kernel takes (``job['storage']``,
    default float32): the worker hands a half program's kernel half arrays and reads its
    outputs back as float32."""
    storage = list(job.get("storage") or ["float32"] * n)
    if len(storage) != n or any(d not in STORAGE for d in storage):
        raise ValueError(f"run_isolated: job['storage'] must name one of {sorted(STORAGE)} "
                         f"for each of the {n} inputs and outputs, got {storage!r}")
    return storage


def _save_arrays(jobdir: Path, spec: dict) -> None:
    """A job's inputs, expected outputs and their slack as the files the worker loads
    (``in{i}``, ``exp{i}``, ``slack{i}``)."""
    for i, a in enumerate(spec["inputs"]):
        np.save(jobdir / f"in{i}.npy", np.ascontiguousarray(a))
    for i, a in enumerate(spec["expected"]):
        np.save(jobdir / f"exp{i}.npy", np.ascontiguousarray(a))
    for i, a in enumerate(spec["slack"]):
        np.save(jobdir / f"slack{i}.npy", np.ascontiguousarray(a))


class IsolatedWorker:
    """One persistent worker process; run() jobs on it, it is replaced after a crash or hang.

    ``env`` (name -> value, None unsets) is the worker's environment on top of ours, e.g.
    ``{"OMP_NUM_THREADS": "1"}``; a job's own ``env`` adds to it, and the process is restarted
    whenever the environment a job needs differs from the running one (OpenMP and BLAS read
    their variables once, when they load)."""

    def __init__(self, start_method: str = "spawn", startup_timeout_s: float = 60.0,
                 env: Mapping[str, str | None] | None = None):
        self._ctx = mp.get_context(start_method)
        self.env: dict[str, str | None] = dict(env or {})
        self._running_env: dict[str, str | None] = {}
        self._startup_timeout_s = startup_timeout_s
        self._proc: Any = None
        self._conn: Any = None
        self._lock = threading.Lock()
        self._dir = Path(tempfile.mkdtemp(prefix="tuner-worker-", dir=_shm_base()))
        self._log = self._dir / "worker.log"
        self._jobs = 0
        self.starts = 0  # processes started so far; > 1 means some were replaced

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.is_alive() else None

    def start(self, env: Mapping[str, str | None] | None = None) -> None:
        """Start the process now (otherwise the first run() does it); ``env`` as in a job.

        Raises RuntimeError (with the worker's log) when the process dies or hangs while
        starting."""
        want = {**self.env, **(env or {})}
        if self._proc is not None and self._proc.is_alive() and want == self._running_env:
            return
        self._stop()
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=worker_main, args=(child, str(self._log)),
                                 daemon=True, name="tuner-kernel-worker")
        with _ENV_LOCK:  # a spawned process inherits os.environ as it is at start()
            saved = {k: os.environ.get(k) for k in want}
            try:
                _set_env(want)
                proc.start()
            finally:
                _set_env(saved)
        child.close()
        try:
            if not parent.poll(self._startup_timeout_s):
                proc.kill()
                raise RuntimeError(f"kernel worker did not start within "
                                   f"{self._startup_timeout_s} s")
            parent.recv()
        except (EOFError, OSError):
            proc.join(5)
            raise RuntimeError(f"kernel worker exited while starting "
                               f"({_signal_text(proc.exitcode)}); {self._log_tail(0, 600)}"
                               ) from None
        self._proc, self._conn = proc, parent
        self._running_env = want
        self.starts += 1

    def _stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(5)
        self._proc = self._conn = None
        self._running_env = {}

    def close(self) -> None:
        with self._lock:
            self._stop()
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> IsolatedWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _log_tail(self, offset: int, limit: int = 2000) -> str:
        try:
            with open(self._log, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return text[-limit:].strip()

    def run(self, job: dict, timeout_s: float = 60.0) -> RunResult:
        """Compile if needed, then run the job in the worker; never raises for kernel faults."""
        t0 = time.perf_counter()
        spec = _validate(job)
        if spec["source"] is not None:
            try:
                spec["library"] = str(compile_cpp(spec["source"], flags=spec["flags"]))
            except CompileError as e:
                return RunResult(COMPILE_ERROR, f"{e.message}\n{e.log.strip()}",
                                 {"log": e.log}, time.perf_counter() - t0)
        with self._lock:
            res = self._run_locked(spec, timeout_s)
        res.wall_s = time.perf_counter() - t0
        if spec["library"]:
            res.payload.setdefault("library", spec["library"])
        return res

    def run_batch(self, library: str | Path, functions: list[str], inputs: list[np.ndarray],
                  expected: list[np.ndarray], output_shapes: list[tuple[int, ...]], *,
                  rtol: float, atol: float, timing: dict | None,
                  env: Mapping[str, str | None] | None = None, timeout_s: float = 60.0,
                  storage: list[str] | None = None,
                  slack: list[np.ndarray] | None = None) -> list[RunResult]:
        """Run, check and time every entry point ``functions`` of one compiled ``library`` on
        the same ``inputs`` (one job: the arrays travel once, the library is opened once);
        one ``RunResult`` per function, in order, each judged with the per-element ``slack``
        as well (``Expected.slack``; None: none).  A function that crashes the worker or
        runs past ``timeout_s`` is that function's ``runtime_error`` / ``timeout``; the
        worker is replaced and the functions after it still run."""
        spec = _validate({"library": str(library), "inputs": inputs, "expected": expected,
                          "slack": slack, "outputs": output_shapes, "rtol": rtol, "atol": atol,
                          "timing": timing, "env": dict(env or {}), "storage": storage})
        if not functions:
            return []
        with self._lock:
            self._jobs += 1
            jobdir = self._dir / f"job{self._jobs}"
            jobdir.mkdir()
            try:
                _save_arrays(jobdir, spec)
                msg = {k: spec[k] for k in ("library", "output_shapes", "rtol", "atol",
                                            "timing", "output_fill", "storage")}
                msg.update(dir=str(jobdir), n_inputs=len(spec["inputs"]),
                           n_expected=len(spec["expected"]), n_slack=len(spec["slack"]),
                           functions=list(functions))
                return BatchRunner(self, msg, spec["env"], len(functions), timeout_s).run()
            finally:
                shutil.rmtree(jobdir, ignore_errors=True)

    def _run_locked(self, spec: dict, timeout_s: float) -> RunResult:
        try:
            self.start(spec["env"])
        except RuntimeError as e:
            return RunResult(RUNTIME_ERROR, str(e))
        self._jobs += 1
        jobdir = self._dir / f"job{self._jobs}"
        jobdir.mkdir()
        try:
            _save_arrays(jobdir, spec)
            msg = {k: spec[k] for k in ("library", "call", "args", "function", "output_shapes",
                                        "rtol", "atol", "timing", "output_fill",
                                        "storage")}
            msg.update(dir=str(jobdir), n_inputs=len(spec["inputs"]),
                       n_expected=len(spec["expected"]), n_slack=len(spec["slack"]))
            log_offset = self._log.stat().st_size if self._log.exists() else 0
            what = (f"call {spec['call']}" if spec["call"] else
                    f"kernel {spec['function']!r} from {Path(spec['library']).name}")
            try:
                self._conn.send(msg)
                if not self._conn.poll(timeout_s):
                    pid = self._proc.pid
                    self._stop()
                    return RunResult(TIMEOUT, f"{what} did not finish within {timeout_s:g} s; "
                                     f"worker pid {pid} killed and will be replaced")
                reply = self._conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                self._proc.join(5)
                code = self._proc.exitcode
                self._stop()
                tail = self._log_tail(log_offset)
                # What the kernel or libc printed comes before faulthandler's Python trace.
                said = tail.split("Fatal Python error")[0].strip()
                return RunResult(RUNTIME_ERROR,
                                 f"{what} crashed the worker ({_signal_text(code)})"
                                 + (f"; it printed:\n{said}" if said else ""),
                                 {"exitcode": code, "log": tail})
            if spec["call"] and reply["status"] == RUNTIME_ERROR:
                # a call job's runtime error may have left state behind in the worker that
                # the next job would trip over (a CUDA context stays poisoned after an illegal
                # address): the next job gets a fresh process
                self._stop()
            n_out = reply.pop("n_outputs", len(spec["output_shapes"]))
            payload: dict[str, Any] = {k: v for k, v in reply.items()
                                       if k not in ("status", "message")}
            if reply["status"] in (OK, WRONG_RESULT):
                payload["outputs"] = [np.load(jobdir / f"out{i}.npy") for i in range(n_out)]
            return RunResult(reply["status"], reply["message"], payload)
        finally:
            shutil.rmtree(jobdir, ignore_errors=True)


def _set_env(values: Mapping[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


_default: IsolatedWorker | None = None
_default_lock = threading.Lock()


def default_worker() -> IsolatedWorker:
    """The process-wide worker used by run_isolated (closed at interpreter exit)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = IsolatedWorker()
            atexit.register(_default.close)
        return _default


def run_isolated(job: dict, timeout_s: float = 60.0,
                 worker: IsolatedWorker | None = None) -> RunResult:
    """Run `job` on `worker` (default: a shared persistent one). See IsolatedWorker.run."""
    return (worker or default_worker()).run(job, timeout_s)
