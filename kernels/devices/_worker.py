"""The worker side of fault isolation: the process that runs kernels and may die instead of us.

``worker_main`` serves jobs from the parent (``_isolate.IsolatedWorker``) over a pipe until it
closes; a job's arrays arrive and leave as .npy files in the job's directory.  Calling
convention (see docs/devices.md): ``extern "C" void kernel(float** inputs, float** outputs)``,
every array C-contiguous, float32 or the storage dtype ``job["storage"]`` names (float16, or
bfloat16 as uint16 bits: a half program's kernel reads and writes its arrays as they are), placed where numpy places a user's arrays
(``USER_OFFSET``), outputs pre-filled with NaN so an element the kernel forgets to write shows up
as a wrong result.  A job may instead name a Python function (``"call": "module:function"``) that
the worker runs on the job's arrays: the CUDA device uses this, so an illegal address on the GPU
kills a worker, not the tuner.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._status import OK, RUNTIME_ERROR, WRONG_RESULT
from ._storage import STORAGE, from_storage, to_storage
from ._timing import measure

# Where a user's array starts: numpy's data of every array large enough for glibc to mmap sits
# 16 bytes past a page (the chunk header), so a full-width vector load of each row straddles two
# cache lines.  Kernels are timed there, not on 64-byte aligned buffers: gated_mlp's best as
# timed aligned (6.3 ms) ran 9.6 ms through tuner.load on numpy arrays, and the tuner had
# preferred it to a config that ran 7.7 there (AMD EPYC, AVX-512).  Most of that gap was a
# cache line the matmul's prefetch missed, fixed since (``benchmarks/alignment.py``).
USER_OFFSET = 16


def _aligned_empty(shape: tuple[int, ...], align: int = 64, offset: int = USER_OFFSET,
                   dtype: Any = np.float32) -> np.ndarray:
    """Array (float32 by default) whose data starts ``offset`` bytes past an ``align``-byte
    boundary: by default where numpy puts a large array's data, so timings are what users get."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    buf = np.empty(nbytes + align + offset, dtype=np.uint8)
    off = (-buf.ctypes.data) % align + offset
    return buf[off:off + nbytes].view(dtype).reshape(shape)


def judge_outputs(outs: list[np.ndarray], expected: Sequence[np.ndarray], rtol: float,
                  atol: float, slack: Sequence[np.ndarray] | None = None
                  ) -> tuple[list[float], str, str]:
    """Max abs error per output, a message naming the first output out of tolerance ("" when
    all pass) and a note naming the first output that passed only by its elements' rounding
    slack ("" when none did): an element passes when ``|out - expected| <= atol +
    rtol·|expected| + slack`` (``slack``: per element, ``_check.rounding_slack``; None: 0)."""
    errs: list[float] = []
    msg = note = ""
    for i, (o, e) in enumerate(zip(outs, expected, strict=True)):
        with np.errstate(invalid="ignore"):  # inf - inf: handled below
            diff = np.abs(o.astype(np.float64) - e)
        # where the reference is NaN or infinite, only the same value matches (inf - inf is
        # NaN, which no tolerance admits; rtol x inf admitted any value)
        finite = np.isfinite(e)
        same = ~finite & ((o == e) | (np.isnan(o) & np.isnan(e)))
        base = atol + rtol * np.abs(np.where(finite, e, 0.0))
        room = np.zeros(()) if slack is None else np.asarray(slack[i], np.float64)
        bad = ~np.where(finite, diff <= base + room, same)
        errs.append(float(np.max(np.where(same, 0.0, np.nan_to_num(diff, nan=np.inf, posinf=np.inf)),
                                 initial=0.0)))
        if bad.any() and not msg:
            idx = np.unravel_index(int(np.argmax(bad)), o.shape)
            msg = (f"output {i}: {int(bad.sum())} of {o.size} elements out of tolerance "
                   f"(rtol={rtol}, atol={atol}"
                   + (", plus each element's rounding slack" if slack is not None else "")
                   + f"); max abs error {errs[-1]:.3g}; first at index "
                   f"{tuple(int(j) for j in idx)}: got {float(o[idx])!r}, "
                   f"expected {float(e[idx])!r}" + _slack_said(room, base, idx))
        lucky = finite & ~bad & (diff > base)
        if lucky.any() and not note:
            with np.errstate(divide="ignore", invalid="ignore"):  # atol 0 at a zero
                worst = np.where(lucky, diff / base, 0.0)
            idx = np.unravel_index(int(np.argmax(worst)), o.shape)
            note = (f"output {i}: {int(lucky.sum())} of {o.size} elements within tolerance "
                    f"only by their rounding slack (ill-conditioned: float32 rounding alone "
                    f"moves them that far); the worst at index {tuple(int(j) for j in idx)}: "
                    f"got {float(o[idx])!r}, expected {float(e[idx])!r}, error "
                    f"{float(diff[idx]):.3g} > {float(base[idx]):.3g} (atol + rtol·|expected|),"
                    f" slack {float(room[idx]):.3g}")
    return errs, msg, note


def _slack_said(room: np.ndarray, base: np.ndarray, idx: tuple) -> str:
    """What the first bad element's slack did: nothing worth naming, or not enough."""
    slack = float(room[idx]) if room.ndim else 0.0
    if slack < 0.01 * float(base[idx]):
        return ""
    return (f"; its rounding slack {slack:.3g} (ill-conditioned there: float32 rounding alone "
            f"moves it that far) does not cover the error either")


def compare_outputs(outs: list[np.ndarray], expected: Sequence[np.ndarray], rtol: float,
                    atol: float, slack: Sequence[np.ndarray] | None = None
                    ) -> tuple[list[float], str]:
    """Max abs error per output and a message naming the first output out of tolerance
    (``judge_outputs`` without its note)."""
    errs, msg, _ = judge_outputs(outs, expected, rtol, atol, slack)
    return errs, msg


def checked(outputs: list[np.ndarray], expected: Sequence[np.ndarray] | None, rtol: float,
            atol: float, reply: dict | None = None,
            slack: Sequence[np.ndarray] | None = None) -> dict:
    """A worker's reply after one run: ``ok`` with the outputs' errors (and, as its message,
    a note when an output passed only by its rounding slack), or ``wrong_result`` naming the
    first output out of tolerance (no ``expected``: just ``ok``)."""
    reply = {"status": OK, "message": "", **(reply or {})}
    if expected:
        errs, bad, note = judge_outputs(outputs, expected, rtol, atol, slack)
        reply["max_abs_err"] = errs
        if bad:
            reply.update(status=WRONG_RESULT, message=bad)
        elif note:
            reply["message"] = note
    return reply


def _load_slack(d: Path, msg: dict) -> list[np.ndarray] | None:
    """A job's per-element rounding slack (``slack{i}.npy``), or None when it sent none."""
    n = msg.get("n_slack", 0)
    return [np.load(d / f"slack{i}.npy") for i in range(n)] if n else None


def _run_call(msg: dict) -> dict:
    """A ``call`` job: ``function(inputs, expected, args) -> reply`` with ``reply["outputs"]``
    (arrays, saved for the parent) and the usual status, message and payload keys."""
    d = Path(msg["dir"])
    module, _, name = msg["call"].partition(":")
    fn = getattr(importlib.import_module(module), name)
    inputs = [np.load(d / f"in{i}.npy") for i in range(msg["n_inputs"])]
    expected = [np.load(d / f"exp{i}.npy") for i in range(msg["n_expected"])]
    args = {**msg["args"], "rtol": msg["rtol"], "atol": msg["atol"], "timing": msg["timing"],
            "output_shapes": msg["output_shapes"], "slack": _load_slack(d, msg)}
    reply = dict(fn(inputs, expected, args))
    outputs = reply.pop("outputs", [])
    for i, o in enumerate(outputs):
        np.save(d / f"out{i}.npy", np.asarray(o))
    reply["n_outputs"] = len(outputs)
    reply.setdefault("message", "")
    return reply


def _run_job(msg: dict, libs: dict) -> dict:
    import ctypes

    if msg.get("call"):
        return _run_call(msg)
    d = Path(msg["dir"])
    lib = libs.get(msg["library"])
    if lib is None:
        lib = libs[msg["library"]] = ctypes.CDLL(msg["library"])
    try:
        fn = getattr(lib, msg["function"])
    except AttributeError:
        return {"status": RUNTIME_ERROR, "message": (
            f"function {msg['function']!r} is not exported by {msg['library']}; declare it "
            f"extern \"C\" void {msg['function']}(float** inputs, float** outputs)")}
    fptr = ctypes.POINTER(ctypes.c_float)
    fn.argtypes = [ctypes.POINTER(fptr), ctypes.POINTER(fptr)]
    fn.restype = None
    n = msg["n_inputs"]
    storage = msg.get("storage") or ["float32"] * (n + len(msg["output_shapes"]))
    inputs = []
    for i in range(n):
        src = np.load(d / f"in{i}.npy", mmap_mode="r")  # one copy: file pages -> placed
        a = _aligned_empty(src.shape, dtype=STORAGE[storage[i]])
        a[...] = to_storage(src, storage[i]) if storage[i] != "float32" else src
        inputs.append(a)
    outputs = [_aligned_empty(tuple(s), dtype=STORAGE[dt])
               for s, dt in zip(msg["output_shapes"], storage[n:], strict=True)]
    for o, dt in zip(outputs, storage[n:], strict=True):
        o[...] = to_storage(np.full(o.shape, msg["output_fill"], np.float32), dt)
    in_ptrs = (fptr * max(1, len(inputs)))(*[a.ctypes.data_as(fptr) for a in inputs])
    out_ptrs = (fptr * max(1, len(outputs)))(*[a.ctypes.data_as(fptr) for a in outputs])

    def call() -> None:
        fn(in_ptrs, out_ptrs)

    t0 = time.perf_counter()
    call()
    first_s = time.perf_counter() - t0
    stored = outputs  # what the kernel writes (and timing rewrites): kept alive to the end
    outputs = [from_storage(o, dt) for o, dt in zip(stored, storage[n:], strict=True)]
    for i, o in enumerate(outputs):
        np.save(d / f"out{i}.npy", o)
    expected = [np.load(d / f"exp{i}.npy", mmap_mode="r") for i in range(msg["n_expected"])]
    reply = checked(outputs, expected, msg["rtol"], msg["atol"], {"first_call_s": first_s},
                    _load_slack(d, msg))
    if reply["status"] != OK:
        return reply
    if msg["timing"] is not None:
        reply["timing"] = measure(call, **msg["timing"]).as_dict()
    return reply


def _run_batch(msg: dict, libs: dict, conn: Any) -> dict:
    """A ``batch`` job: many entry points of one library (``functions``) on the same inputs,
    each run once, checked against the same expected outputs and timed; one reply per function
    goes back as soon as it is known (``{"index": i, ...}``), so a kernel that crashes the
    worker is named by the parent (the first index without a reply) and the rest can go on in
    a new worker.  Outputs are not sent back: a trial keeps only their errors."""
    import ctypes

    d = Path(msg["dir"])
    lib = libs.get(msg["library"])
    if lib is None:
        lib = libs[msg["library"]] = ctypes.CDLL(msg["library"])
    fptr = ctypes.POINTER(ctypes.c_float)
    n = msg["n_inputs"]
    storage = msg.get("storage") or ["float32"] * (n + len(msg["output_shapes"]))
    sources = [to_storage(np.load(d / f"in{i}.npy"), dt) if dt != "float32" else
               np.load(d / f"in{i}.npy", mmap_mode="r") for i, dt in enumerate(storage[:n])]
    inputs = [_aligned_empty(src.shape, dtype=STORAGE[dt])
              for src, dt in zip(sources, storage[:n], strict=True)]
    stored = [_aligned_empty(tuple(s), dtype=STORAGE[dt])
              for s, dt in zip(msg["output_shapes"], storage[n:], strict=True)]
    fill = [to_storage(np.full(o.shape, msg["output_fill"], np.float32), dt)
            for o, dt in zip(stored, storage[n:], strict=True)]
    expected = [np.load(d / f"exp{i}.npy") for i in range(msg["n_expected"])]
    slack = _load_slack(d, msg)
    in_ptrs = (fptr * max(1, len(inputs)))(*[a.ctypes.data_as(fptr) for a in inputs])
    out_ptrs = (fptr * max(1, len(stored)))(*[a.ctypes.data_as(fptr) for a in stored])
    for index, name in enumerate(msg["functions"]):
        if index < msg.get("start", 0):
            continue
        try:
            fn = getattr(lib, name)
        except AttributeError:
            conn.send({"index": index, "status": RUNTIME_ERROR,
                       "message": f"function {name!r} is not exported by {msg['library']}"})
            continue
        fn.argtypes = [ctypes.POINTER(fptr), ctypes.POINTER(fptr)]
        fn.restype = None
        for a, src in zip(inputs, sources, strict=True):  # as sent: a kernel before this
            a[...] = src  # one may have written where it should only have read
        for o, f in zip(stored, fill, strict=True):
            o[...] = f

        def call(fn: Any = fn) -> None:
            fn(in_ptrs, out_ptrs)

        t0 = time.perf_counter()
        call()
        first_s = time.perf_counter() - t0
        outputs = [from_storage(o, dt) for o, dt in zip(stored, storage[n:], strict=True)]
        reply = checked(outputs, expected, msg["rtol"], msg["atol"], {"first_call_s": first_s},
                        slack)
        if reply["status"] == OK and msg["timing"] is not None:
            reply["timing"] = measure(call, **msg["timing"]).as_dict()
        conn.send({"index": index, **reply})
    return {"status": OK, "message": "", "done": True}


def worker_main(conn: Any, log_path: str) -> None:
    """Serve jobs until the pipe closes. Output of the kernel (and crash reports) go to a log."""
    import faulthandler

    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    faulthandler.enable()  # a SIGSEGV leaves a Python-side trace in the log
    libs: dict = {}
    conn.send({"ready": os.getpid()})
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = _run_batch(msg, libs, conn) if msg.get("functions") else \
                _run_job(msg, libs)
        except Exception as e:  # ctypes load errors, unreadable files, bad shapes...
            reply = {"status": RUNTIME_ERROR, "message": f"{type(e).__name__}: {e}"}
        conn.send(reply)
