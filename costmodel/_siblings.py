"""A device the model never trained on, ranked by how its siblings ranked the same configs.

A model trained on five GPUs learns little from five device-feature vectors about which GPU a
sixth resembles; the measurements it was trained on say it directly: a launch config that is
fast on an RTX A6000 is mostly fast on an RTX A4000 (Kendall tau 0.82 on the convolution
caches), while an A6000 and a W7800 agree at 0.02.  ``MeasuredRanks`` keeps each training
config's rank per device (as a normal score); for a device outside training it returns the
affinity-weighted mean over the other devices that measured the same program and config, and
``blend`` mixes that order into the model's own.

Affinity is what the devices' specs say about sharing code paths: devices of another kind
(vendor runtime: cuda, hip, cpu) count nothing, the same kind counts 1 and the same
architecture (``sm_86``, ``gfx1100``) ``SAME_ARCH``.  Leave-one-GPU-out zero-shot, 400 trees of
63 leaves, AMD EPYC: 0.567 -> 0.688 tau (convolution), 0.605 -> 0.668 (dedispersion); the
rules tried beside it are in docs/costmodel.md.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from scipy.stats import norm, rankdata

from ._devices import spec_for_key
from ._features import Sample

SAME_ARCH = 4.0  # an identical architecture's weight against 1 for the same vendor runtime
BLEND = 0.75  # the siblings' share of the order where they measured the config (0.5 .. 1.0
# gave 0.661-0.690 / 0.657-0.668 on the folds above; 0.75 of 0, .25, .5, .75, 1)


def affinity(a: str, b: str) -> float:
    """How much device ``b``'s ranking says about device ``a``'s (device keys)."""
    sa, sb = spec_for_key(a), spec_for_key(b)
    if sa.kind != sb.kind:
        return 0.0
    return SAME_ARCH if sa.arch == sb.arch else 1.0


def _config_key(s: Sample) -> tuple | None:
    if not s.config:
        return None
    return (s.program, tuple(sorted((str(k), str(v)) for k, v in s.config.items())))


def _standard(x: np.ndarray) -> np.ndarray:
    return (x - x.mean()) / (x.std() + 1e-9)


class MeasuredRanks:
    """Per (program, config): each training device's rank of it in its group, as a normal
    score (the quantile of a standard normal at that rank)."""

    def __init__(self, samples: Sequence[Sample]) -> None:
        rows: dict[str, list[int]] = defaultdict(list)
        for i, s in enumerate(samples):
            if _config_key(s) is not None and s.seconds > 0 and math.isfinite(s.seconds):
                rows[s.group].append(i)
        self.z: dict[tuple, dict[str, float]] = defaultdict(dict)
        for idx in rows.values():
            if len(idx) < 2:
                continue
            # normal scores of the ranks, not standardised log times: a sibling's few very
            # slow configs would otherwise outweigh its order (tau 0.676 -> 0.688, 0.661 -> 0.668)
            z = norm.ppf((rankdata([samples[i].seconds for i in idx]) - 0.5) / len(idx))
            for i, v in zip(idx, z, strict=True):
                self.z[_config_key(samples[i])][samples[i].device] = float(v)  # type: ignore[index]
        self.z = dict(self.z)

    def ranks(self, samples: Sequence[Sample]) -> np.ndarray:
        """The other devices' affinity-weighted mean normal score of each sample's config
        (nan where no device of any affinity measured it)."""
        out = np.full(len(samples), np.nan)
        weight: dict[tuple[str, str], float] = {}
        for i, s in enumerate(samples):
            key = _config_key(s)
            seen = self.z.get(key) if key is not None else None
            if not seen:
                continue
            num = den = 0.0
            for device, z in seen.items():
                if device == s.device:
                    continue
                w = weight.get((s.device, device))
                if w is None:
                    w = weight[(s.device, device)] = affinity(s.device, device)
                num, den = num + w * z, den + w
            if den > 0:
                out[i] = num / den
        return out


def blend(shape: np.ndarray, sibling: np.ndarray, groups: Sequence[np.ndarray]) -> np.ndarray:
    """Per group, the model's order and the siblings' order (both as standardised ranks)
    mixed ``BLEND`` to the siblings where they measured the config; elsewhere the model's."""
    out = shape.astype(np.float64).copy()
    for idx in groups:
        if len(idx) < 2:
            continue
        own = _standard(rankdata(shape[idx]))
        have = ~np.isnan(sibling[idx])
        mixed = own.copy()
        if have.sum() > 1:
            theirs = _standard(rankdata(sibling[idx][have]))
            mixed[have] = BLEND * theirs + (1 - BLEND) * own[have]
        out[idx] = mixed
    return out
