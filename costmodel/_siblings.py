"""A device the model never trained on, ranked by how its siblings ranked the same configs.

A model trained on five GPUs learns little from five device-feature vectors about which GPU a
sixth resembles; the measurements it was trained on say it directly: a launch config that is
fast on an RTX A6000 is mostly fast on an RTX A4000 (Kendall tau 0.82 on the convolution
caches), while an A6000 and a W7800 agree at 0.02.  ``MeasuredRanks`` keeps each training
config's rank per device (as a normal score); for a device outside training it returns a
weighted mean (below) over the other devices that measured the same program and config, and
``blend`` mixes that order into the model's own.

Affinity is what the devices' specs say about sharing code paths: devices of another kind
(vendor runtime: cuda, hip, cpu) count nothing, the same kind counts 1 and the same
architecture (``sm_86``, ``gfx1100``) ``SAME_ARCH``.  Within that, the measurements say which
siblings to trust: each training device's *typicality*, its mean correlation of normal scores
with the other training devices over the configs both measured, estimates from training alone
how it correlates with a device it never saw (a new device more likely ranks like a sibling
that agrees with many than like an outlier: on convolution the W6600 agrees with the others at
tau 0.33 on average, the W7800 at 0.17, and the held-out MI250X's closest GPU is the W6600).
The weights are those of the linear predictor of the new device's normal score from its kin's
(affinity > 0), beta = R^-1 t (R: the kin's correlation matrix, t: their typicality), negative
ones clipped to 0, times the affinity: two siblings that agree with each other share one
weight instead of outvoting a third.  Leave-one-GPU-out zero-shot, 400 trees of 63 leaves, AMD
EPYC, the same 12 folds: the model alone 0.567 / 0.605 tau (convolution / dedispersion), the
affinity-weighted mean 0.688 / 0.668, with beta 0.702 / 0.682 (top-1 31.6% -> 18.7%, 15.2% ->
12.7%); affinity x typicality 0.697 / 0.672, x typicality^2 0.702 / 0.675 (docs/costmodel.md).
Tried and not kept (fifth session): the model's order and each sibling's weighted by what
their agreement says of them (a one-factor model, no fixed ``BLEND``): tau 0.707 / 0.688 with
the default model, but the trees, fitted to the siblings, agree with all of them and took most
of the weight, and model-guided tuning got worse (12-row mean P 0.896 -> 0.804).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from scipy.stats import norm, rankdata

from ._devices import spec_for_key
from ._features import Sample, group_structure

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
    """What is "the same config" on two devices: the program, the structure
    (``group_structure``: two structures of one program share knob names such as ``F`` or
    ``g0`` and rank them differently) and the config."""
    if not s.config:
        return None
    return (s.program, group_structure(s.group),
            tuple(sorted((str(k), str(v)) for k, v in s.config.items())))


def _value(text: str) -> int | str:
    """A config value of ``_config_key`` (kept as text) as the config held it."""
    try:
        return int(text)
    except ValueError:
        return text


def _standard(x: np.ndarray) -> np.ndarray:
    return (x - x.mean()) / (x.std() + 1e-9)


class MeasuredRanks:
    """Per (program, config): each training device's rank of it in its group, as a normal
    score (the quantile of a standard normal at that rank)."""

    def __init__(self, samples: Sequence[Sample]) -> None:
        self.keyed_by = "structure_id"  # older stored models: ``_key``
        self.z: dict[tuple, dict[str, float]] = self._scores(samples)
        self.agree = _agreement(self.z)
        self._weights: dict[tuple[str, str], dict[str, float]] = {}

    def update(self, samples: Sequence[Sample]) -> None:
        """Take the ranks of ``samples``' groups (each given whole: every row measured) in
        place of those kept for them: a model taught a launch's measurements
        (``GbdtModel.update``).  The agreement of the programs they belong to is measured
        again."""
        for key, seen in self._scores(samples).items():
            self.z.setdefault(key, {}).update(seen)
        programs = {s.program for s in samples}
        self.agree.update(_agreement({k: v for k, v in self.z.items() if k[0] in programs}))
        self._weights = {}

    def _scores(self, samples: Sequence[Sample]) -> dict[tuple, dict[str, float]]:
        """Per config key, each device's normal score of its rank in its group."""
        rows: dict[str, list[int]] = defaultdict(list)
        for i, s in enumerate(samples):
            if _config_key(s) is not None and s.seconds > 0 and math.isfinite(s.seconds):
                rows[s.group].append(i)
        scores: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for idx in rows.values():
            if len(idx) < 2:
                continue
            # normal scores of the ranks, not standardised log times: a sibling's few very
            # slow configs would otherwise outweigh its order (tau 0.676 -> 0.688, 0.661 -> 0.668)
            z = norm.ppf((rankdata([samples[i].seconds for i in idx]) - 0.5) / len(idx))
            for i, v in zip(idx, z, strict=True):
                key = self._key(samples[i])
                scores[key][samples[i].device].append(float(v))  # type: ignore[index]
        # one kernel measured more than once on a device (a config stored before its dialect's
        # unread knobs were made canonical: three CUDA C `stages`): the mean of its scores
        return {key: {d: float(np.mean(v)) for d, v in seen.items()}
                for key, seen in scores.items()}

    def __setstate__(self, state: dict) -> None:
        """Unpickled (a stored model): one stored before the typicality weights derives
        them from its ranks; the weights' cache starts empty."""
        self.__dict__.update(state)
        if "keyed_by" not in state:  # stored before the structure was part of the key
            self.keyed_by = "program"
        if "agree" not in state:
            self.agree = _agreement(self.z)
        self._weights = {}

    def _key(self, s: Sample) -> tuple | None:
        """``_config_key``, as the stored model keyed its ranks: "program" (stored before the
        structure was part of the key: program and config), "structure" (stored before
        ``group_name``: our rows' groups held a structure hash's first 16 characters)."""
        key = _config_key(s)
        if key is None or self.keyed_by == "structure_id":
            return key
        if self.keyed_by == "structure":
            return (key[0], key[1][:16], key[2])
        return (key[0], key[2])

    def configs_of(self, program: str, structure: str, device: str) -> list[dict]:
        """The configs of ``program``'s ``structure`` (a ``group_structure``) that a training
        device other than ``device`` measured, as they were stored (a model stored before the
        structure was part of its key: none)."""
        if self.keyed_by != "structure_id":
            return []
        return [{k: _value(v) for k, v in config} for (p, st, config), seen in self.z.items()
                if p == program and st == structure and any(d != device for d in seen)]

    def typicality(self, program: str, device: str, exclude: str = "") -> float:
        """``device``'s mean correlation with each other training device (but ``exclude``)
        over the configs of ``program`` both measured; nan where it shares none."""
        vals = [r for (a, b), r in self.agree.get(program, {}).items()
                if a == device and b != exclude]
        return float(np.mean(vals)) if vals else math.nan

    def weights(self, program: str, device: str) -> dict[str, float]:
        """Each training device's weight in ``device``'s ranks of ``program``'s configs: its
        affinity times its coefficient in the linear predictor of ``device``'s normal score
        from its kin's (module docstring); the affinity alone where that is undefined."""
        got = self._weights.get((program, device))
        if got is not None:
            return got
        others = sorted({a for a, _ in self.agree.get(program, {})} - {device})
        w = {d: affinity(device, d) for d in others}
        kin = [d for d in others if w[d] > 0]
        t = np.array([self.typicality(program, d, device) for d in kin])
        if len(kin) > 1 and np.isfinite(t).all():
            agree = self.agree[program]
            r = np.array([[1.0 if a == b else agree.get((a, b), 0.0) for b in kin]
                          for a in kin])
            beta = np.clip(np.linalg.lstsq(r, t, rcond=None)[0], 0.0, None)
            if beta.sum() > 0:
                w.update({d: w[d] * float(b) for d, b in zip(kin, beta, strict=True)})
        self._weights[(program, device)] = w
        return w

    def ranks(self, samples: Sequence[Sample]) -> np.ndarray:
        """The other devices' weighted mean normal score of each sample's config (``weights``;
        nan where no device of any affinity measured it)."""
        out = np.full(len(samples), np.nan)
        for i, s in enumerate(samples):
            key = self._key(s)
            seen = self.z.get(key) if key is not None else None
            if not seen:
                continue
            weight = self.weights(s.program, s.device)
            num = den = 0.0
            for device, z in seen.items():
                if device == s.device:
                    continue
                w = weight.get(device)
                if w is None:
                    w = weight[device] = affinity(s.device, device)
                num, den = num + w * z, den + w
            if den > 0:
                out[i] = num / den
        return out


def _agreement(z: dict[tuple, dict[str, float]]) -> dict[str, dict[tuple[str, str], float]]:
    """Per program, per ordered pair of devices: the correlation of their normal scores over
    the configs both measured (a pair with fewer than 3 is left out)."""
    by_program: dict[str, list[dict[str, float]]] = defaultdict(list)
    for (program, *_), seen in z.items():
        by_program[program].append(seen)
    out: dict[str, dict[tuple[str, str], float]] = {}
    for program, rows in by_program.items():
        devices = sorted({d for seen in rows for d in seen})
        m = np.array([[seen.get(d, np.nan) for d in devices] for seen in rows])
        pairs: dict[tuple[str, str], float] = {}
        for a in range(len(devices)):
            for b in range(a + 1, len(devices)):
                both = ~np.isnan(m[:, a]) & ~np.isnan(m[:, b])
                if both.sum() < 3:
                    continue
                c = float(np.corrcoef(m[both, a], m[both, b])[0, 1])
                if math.isfinite(c):
                    pairs[(devices[a], devices[b])] = pairs[(devices[b], devices[a])] = c
        out[program] = pairs
    return out


def blend(shape: np.ndarray, sibling: np.ndarray, groups: Sequence[np.ndarray]) -> np.ndarray:
    """Per group, the model's order and the siblings' order (both as standardised ranks)
    mixed ``BLEND`` to the siblings where they measured the config; elsewhere the model's.
    A group no sibling measured keeps ``shape``."""
    out = shape.astype(np.float64).copy()
    for idx in groups:
        have = ~np.isnan(sibling[idx])
        if len(idx) < 2 or have.sum() < 2:
            continue
        own = _standard(rankdata(shape[idx]))
        mixed = own.copy()
        mixed[have] = BLEND * _standard(rankdata(sibling[idx][have])) + (1 - BLEND) * own[have]
        out[idx] = mixed
    return out
