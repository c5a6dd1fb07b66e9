"""A kernel's time as the sum of its work: a per-device linear prior the trees start from.

Trees regress log time well among the programs they saw and poorly for a program they did not:
a new program is a new mix of ops, and a tree cannot add up the costs of its parts.  A kernel's
time nearly does: launches, bytes moved per memory level, FLOPs per opcode, elements through
exp-family ops and divides, and (``_nest``) what one core runs of each kind of statement, each
at some cost per unit on a device.  ``WorkPrior`` fits those
costs (non-negative least squares of the relative error, per device and storage dtype) on the
training rows; the trees' level learns what it misses and both boosters read it (``_gbdt``).
CPU dataset, programs held out (5 folds, 300 trees of 63 leaves, AMD EPYC): the level's log
error sd 0.952 -> 0.848, the model's MAPE 0.820 -> 0.671, tau 0.419 -> 0.416; the prior alone
has log error sd 1.007 (docs/costmodel.md).  GraphSAGE started from it did worse (MAPE 0.654
-> 0.805), so it stays with the trees.

A Kernel Tuner configuration has no µGraph, so no work to count: its prior is nan (LightGBM
treats that as missing).  Costs are fitted only from a device's rows of ``MIN_PROGRAMS``
programs or more (the H100 sweep's 10 are too few: the model trained on it keeps no prior); a
device without costs borrows those of the device of its kind (cpu, cuda, hip) with the most
rows.  The prior stays within 10x of the device's fastest and slowest measured rows.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from scipy.optimize import nnls

from ._devices import spec_for_key
from ._features import (
    DTYPES,
    GRAPH_BYTES,
    GRAPH_DIV,
    GRAPH_DTYPE,
    GRAPH_EXP,
    GRAPH_FLOPS,
    GRAPH_KERNELS,
    GRAPH_LAUNCHES,
    GRAPH_NEST,
    LEVELS,
    NODE_BYTES,
    NODE_FLOPS,
    NODE_LEVEL,
    OPCODES,
    Sample,
)
from ._nest import WORK

MIN_ROWS = 50  # a device's own costs are fitted from at least this many µGraph rows,
MIN_PROGRAMS = 30  # of at least this many programs: on the H100 sweep's 9 training programs a
# fold's costs sent a held-out program's MAPE from 8 to 336 (ntrans), and with only the 7
# totals (call, launches, kernels, bytes, FLOPs, exp and divide elements) another's from 0.6 to
# 16 (mqa): a sum of costs learned from so few programs is a guess
STRETCH = math.log(10.0)  # the prior stays within 10x of the device's fastest / slowest rows


def _linear(log2: np.ndarray | float) -> np.ndarray:
    return np.exp2(log2) - 1.0


def work(s: Sample) -> np.ndarray | None:
    """The sample's units of work, per storage dtype (zeros in the other dtypes' slots);
    None for a sample with no µGraph (a Kernel Tuner configuration)."""
    if not (s.estimate_s > 0 and math.isfinite(s.estimate_s)):
        return None
    g = s.graph
    units = [1.0, float(g[GRAPH_LAUNCHES]), float(g[GRAPH_KERNELS]),
             *_linear(g[[GRAPH_BYTES, GRAPH_FLOPS, GRAPH_EXP, GRAPH_DIV]]),
             *_linear(g[GRAPH_NEST:GRAPH_NEST + len(WORK)])]  # what one core runs
    flops = np.bincount(s.opcodes, weights=_linear(s.nodes[:, NODE_FLOPS]),
                        minlength=len(OPCODES))
    level = np.argmax(s.nodes[:, NODE_LEVEL:NODE_LEVEL + len(LEVELS)], 1)
    moved = np.bincount(level, weights=_linear(s.nodes[:, NODE_BYTES]), minlength=len(LEVELS))
    row = np.concatenate([units, flops, moved])
    dtype = int(np.argmax(g[GRAPH_DTYPE:GRAPH_DTYPE + len(DTYPES)]))
    out = np.zeros(len(DTYPES) * len(row))
    out[dtype * len(row):(dtype + 1) * len(row)] = row
    return out


class WorkPrior:
    """Per device, non-negative costs per unit of work (``work``), fitted to relative error."""

    def __init__(self) -> None:
        # device -> (costs, log shift, (lowest, highest) log seconds it may give)
        self.costs: dict[str, tuple[np.ndarray, float, tuple[float, float]]] = {}
        self.rows: dict[str, int] = {}

    def fit(self, samples: Sequence[Sample]) -> WorkPrior:
        by_device: dict[str, list[tuple[Sample, np.ndarray]]] = defaultdict(list)
        for s in samples:
            w = work(s)
            if w is not None and s.seconds > 0 and math.isfinite(s.seconds):
                by_device[s.device].append((s, w))
        for device, rows in by_device.items():
            if len(rows) < MIN_ROWS or len({s.program for s, _ in rows}) < MIN_PROGRAMS:
                continue
            x = np.stack([w for _, w in rows])
            t = np.asarray([s.seconds for s, _ in rows])
            a = x / t[:, None]  # each row's error relative to its own time
            scale = a.std(0) + 1e-12
            coef, _ = nnls(a / scale, np.ones(len(t)), maxiter=20 * a.shape[1])
            coef = coef / scale
            pred = np.maximum(x @ coef, 1e-12)
            # relative least squares sits below the times; centre it in log space
            shift = float(np.median(np.log(t) - np.log(pred)))
            logt = np.log(t)
            self.costs[device] = (coef, shift,
                                  (float(logt.min()) - STRETCH, float(logt.max()) + STRETCH))
            self.rows[device] = len(rows)
        return self

    def _costs_for(self, device: str) -> tuple[np.ndarray, float, tuple[float, float]] | None:
        if device in self.costs:
            return self.costs[device]
        kind = spec_for_key(device).kind
        kin = [d for d in self.costs if spec_for_key(d).kind == kind]
        return self.costs[max(kin, key=self.rows.__getitem__)] if kin else None

    def log_prior(self, samples: Sequence[Sample]) -> np.ndarray:
        """Log seconds the work model gives each sample (nan: no µGraph, or no device of its
        kind fitted)."""
        out = np.full(len(samples), np.nan)
        per_device: dict[str, tuple[np.ndarray, float, tuple[float, float]] | None] = {}
        for i, s in enumerate(samples):
            if s.device not in per_device:
                per_device[s.device] = self._costs_for(s.device)
            costs = per_device[s.device]
            w = work(s) if costs is not None else None
            if costs is not None and w is not None:
                low, high = costs[2]
                out[i] = min(max(math.log(max(float(w @ costs[0]), 1e-12)) + costs[1], low),
                             high)
        return out
