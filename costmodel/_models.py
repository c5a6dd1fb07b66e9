"""Three models behind one face: the roofline, gradient-boosted trees (``_gbdt``), GraphSAGE
(``_sage``, seed 001).

``fit(samples)`` learns log seconds; ``predict(samples)`` returns seconds; ``to_bytes`` /
``_kinds.load_model`` move a trained model through the database.  The roofline is the analytical
estimate lowering already makes, with one scale per device fitted on the training rows (it is
a lower bound, so raw its MAPE says little); the trees (LightGBM) read flat features, the
TenSet / MetaSchedule anchor; GraphSAGE reads the op graph as the seed paper does: opcode
embeddings concatenated with node and graph features, SAGE convolutions along the data flow,
mean / max / sum pooling, a feed-forward head, trained on the paper's two objectives at once —
squared error of log time (its fusion task) and a pairwise logistic rank loss between configs
of one group (its tile task).
"""

from __future__ import annotations

import math
import pickle
import zlib
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
from scipy.stats import kendalltau

from ._features import DEVICE_DIM, FEATURE_VERSION, Sample
from ._siblings import MeasuredRanks, affinity, blend


class CostModel(ABC):
    kind: str

    def __init__(self) -> None:
        self.feature_version = FEATURE_VERSION
        # what each device's own measurements taught (``adapt``): log-time offset, and the
        # mix of known devices' features whose rankings match its measured configs
        self.offsets: dict[str, float] = {}
        self.mixes: dict[str, list[tuple[float, np.ndarray]]] = {}
        self.devices: dict[str, np.ndarray] = {}  # device key -> its features, from training

    def adapt(self, measured: Sequence[Sample]) -> dict[str, dict]:
        """Learn each device of ``measured`` (samples with seconds) from its own few
        measurements, without retraining: see ``LearnedModel.adapt``.  The roofline learns
        nothing this way."""
        return {}

    def siblings_measured(self, samples: Sequence[Sample]) -> int | None:
        """How many of ``samples`` other devices measured, where that ranks them: see
        ``LearnedModel.siblings_measured``.  None: the roofline ranks by no measurement."""
        return None

    def sibling_configs(self, program: str, structure: str, device: str) -> list[dict]:
        """The configs of ``program``'s ``structure`` (a µGraph hash, as ``group_name`` takes
        it) that devices other than ``device`` measured in the training data, which rank
        them on a device the model never trained on: a sampler or ``tuner model predict``
        that samples a large space keeps them among its candidates.  The roofline: none."""
        return []

    @abstractmethod
    def fit(self, samples: Sequence[Sample], *, progress: Callable[[str], None] | None = None,
            seed: int = 0) -> None: ...

    @abstractmethod
    def predict(self, samples: Sequence[Sample]) -> np.ndarray:
        """Predicted seconds per sample (nan where the model cannot say)."""

    def to_bytes(self) -> bytes:
        """A zlib-compressed pickle: LightGBM's trees are text, and a 1,200-tree model of 78 MB
        stores in 30 MB at level 1 (0.8 s to compress, 0.3 s to read back; higher levels save
        little more for several times the seconds)."""
        return zlib.compress(pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL), 1)


def _spread(x: np.ndarray) -> np.ndarray:
    sd = x.std(0)
    return np.where(sd > 1e-3, sd, 1.0)


def group_rows(samples: Sequence[Sample]) -> list[np.ndarray]:
    """Row indices of each group (a structure or Kernel Tuner space on one device)."""
    rows: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        rows[s.group].append(i)
    return [np.asarray(v) for v in rows.values()]


def within_group(logt: np.ndarray, groups: Sequence[np.ndarray]) -> np.ndarray:
    """Log times standardised inside each group: the shape of a space, not its level."""
    out = np.zeros_like(logt)
    for idx in groups:
        v = logt[idx]
        out[idx] = (v - v.mean()) / (v.std() + 1e-6) if len(idx) > 1 else 0.0
    return out


def combine(level: np.ndarray, shape: np.ndarray, groups: Sequence[np.ndarray],
            ordinal: bool = False) -> np.ndarray:
    """Predicted log times: each group keeps the mean and spread of the level prediction and
    takes its order from the within-group prediction.  A model learns the order of configs
    on a GPU it never saw much better from the shape of other GPUs' spaces than from their
    absolute times (leave-one-GPU-out tau 0.38 -> 0.54 on the convolution caches).
    ``ordinal``: the shape is only an order (a ranking objective's scores have no scale), so
    each group's level predictions, sorted, are dealt out in the shape's order: the group keeps
    the level's whole distribution, not only its mean and spread."""
    out = level.copy()
    for idx in groups:
        if len(idx) > 1 and ordinal:
            out[idx[np.argsort(shape[idx], kind="stable")]] = np.sort(level[idx])
        elif len(idx) > 1:
            z = shape[idx]
            z = (z - z.mean()) / (z.std() + 1e-9)
            out[idx] = level[idx].mean() + level[idx].std() * z
    return out


class RooflineModel(CostModel):
    """The roofline estimate times one scale per device (the median measured / estimated
    ratio of the training rows; 1 for a device it never saw)."""

    kind = "roofline"

    def fit(self, samples: Sequence[Sample], *, progress=None, seed: int = 0) -> None:
        ratios: dict[str, list[float]] = defaultdict(list)
        for s in samples:
            if s.estimate_s > 0 and math.isfinite(s.estimate_s):
                ratios[s.device].append(s.seconds / s.estimate_s)
        self.scale = {d: float(np.median(r)) for d, r in ratios.items()}

    def predict(self, samples: Sequence[Sample]) -> np.ndarray:
        return np.asarray([s.estimate_s * self.scale.get(s.device, 1.0) for s in samples])


def with_device(samples: Sequence[Sample], vec: np.ndarray) -> list[Sample]:
    """``samples`` as if run on the device whose features are ``vec``."""
    return [replace(s, graph=np.concatenate([s.graph[:-DEVICE_DIM], vec]).astype(np.float32))
            for s in samples]


class LearnedModel(CostModel):
    """A model that predicts a level and a shape (``_raw``), learns per-device offsets and
    mixes from few measurements (``adapt``) and combines them (``predict``)."""

    SWITCH_SE = 2.0  # a known device replaces the device's own features when it ranks the
    # measured configs better by more than this many standard errors of Kendall's tau

    @abstractmethod
    def _raw(self, samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray]:
        """(level: log seconds, shape: within-group standardised log seconds) per sample."""

    def remember(self, samples: Sequence[Sample]) -> None:
        """Keep each training device's features (the candidates ``adapt`` chooses from) and
        its measured ranks of each config (what ranks a device never trained on)."""
        self.devices = {s.device: s.graph[-DEVICE_DIM:].copy() for s in samples}
        self.measured = MeasuredRanks(samples)

    def _shape(self, samples: Sequence[Sample], shape: np.ndarray) -> np.ndarray:
        """The model's shape, with the siblings' measured order blended in for the devices
        it never trained on (``_siblings``); a device it trained on keeps the model's."""
        measured = getattr(self, "measured", None)
        unseen = [idx for idx in group_rows(samples) if samples[idx[0]].device not in self.devices]
        if measured is None or not unseen:
            return shape
        sibling = np.full(len(samples), np.nan)
        for idx in unseen:
            sibling[idx] = measured.ranks([samples[i] for i in idx])
        return blend(shape, sibling, unseen)

    def adapt(self, measured: Sequence[Sample]) -> dict[str, dict]:
        """Per device of ``measured`` (at least 3 configs): rank its measured configs as the
        zero-shot prediction does (its own features, the siblings' measured order blended in:
        ``_siblings``) and as each known device of its vendor runtime would (its features
        substituted; any known device where none is of its vendor), and take the known device
        that ranks them best in place of its own features for its shape from now on — only
        when it beats the zero-shot ranking's Kendall tau there by more than ``SWITCH_SE``
        standard errors of tau on that many configs (0.37 at 16: the shots are chosen near the
        model's predicted best, so their tau is noisy; mixing the three best by tau^4, the
        rule before, made the convolution W7800's 16-shot tau 0.07 against 0.45 zero-shot).
        Where the known devices measured these configs, the order stays the zero-shot one
        and only the level learns.  Its level is shifted by the mean measured - predicted log
        time.  (docs/costmodel.md: Any device)"""
        by_device: dict[str, list[Sample]] = defaultdict(list)
        for s in measured:
            if s.seconds > 0 and math.isfinite(s.seconds):
                by_device[s.device].append(s)
        out = {}
        for device, rows in by_device.items():
            if len(rows) < 3:
                continue
            logt = np.log([s.seconds for s in rows])
            own = rows[0].graph[-DEVICE_DIM:].copy()
            known = [(k, v) for k, v in self.devices.items() if k != device]
            # another vendor's ranking is no candidate where the vendor has one of its own:
            # on 16 shots near the predicted best it could look better by chance (the
            # dedispersion W6600 took the A6000's: 0.53 -> 0.43 on the rest of its space)
            kin = [(k, v) for k, v in known if affinity(device, k) > 0]
            candidates = [(device + " (zero-shot)", own)] + (kin or known)
            taus = []
            for n, (_, vec) in enumerate(candidates):
                shape = self._raw(with_device(rows, vec))[1]
                if n == 0:  # the zero-shot order, siblings' measurements blended in
                    shape = self._shape(rows, shape)
                tau = kendalltau(shape, logt).statistic
                taus.append(0.0 if math.isnan(tau) else float(tau))
            best = int(np.argmax(taus))
            n = len(rows)
            se = math.sqrt(2 * (2 * n + 5) / (9 * n * (n - 1)))
            chosen = best if taus[best] - taus[0] > self.SWITCH_SE * se else 0
            if self._has_siblings(rows):
                # the zero-shot order already draws on the known devices' measurements of
                # these configs; shots near the predicted best rarely tell which device this
                # one follows (docs/costmodel.md: few-shot), so only the level is refitted
                chosen = 0
            self.mixes.pop(device, None)
            if chosen:
                self.mixes[device] = [(1.0, candidates[chosen][1])]
            level = self._levels(rows)
            self.offsets[device] = float(np.mean(logt - level))
            out[device] = {"shots": n, "offset": round(self.offsets[device], 4),
                           "shape_from": candidates[chosen][0],
                           "tau": {name: round(t, 3) for (name, _), t in zip(candidates, taus,
                                                                               strict=True)}}
        return out

    def siblings_measured(self, samples: Sequence[Sample]) -> int | None:
        """How many of ``samples`` (configs on one device) the training devices measured:
        on a device this model never trained on, those are ranked by the siblings' order
        blended with the trees', the rest by the trees alone (``_siblings``).  None where
        the model trained on the device (or keeps no measurements)."""
        measured = getattr(self, "measured", None)
        if measured is None or not samples or samples[0].device in self.devices:
            return None
        return int(np.isfinite(measured.ranks(samples)).sum())

    def sibling_configs(self, program: str, structure: str, device: str) -> list[dict]:
        measured = getattr(self, "measured", None)
        return [] if measured is None else measured.configs_of(program, structure, device)

    def _has_siblings(self, samples: Sequence[Sample]) -> bool:
        measured = getattr(self, "measured", None)
        return measured is not None and not np.isnan(measured.ranks(samples)).all()

    def _levels(self, samples: Sequence[Sample]) -> np.ndarray:
        level, _ = self._raw(samples)
        return level

    def predict(self, samples: Sequence[Sample]) -> np.ndarray:
        if not samples:  # as every model: no samples, no predictions
            return np.zeros(0)
        level, shape = self._raw(samples)
        level = level + np.asarray([self.offsets.get(s.device, 0.0) for s in samples])
        shape = self._shape(samples, shape)
        by_device: dict[str, list[int]] = defaultdict(list)
        for i, s in enumerate(samples):
            if s.device in self.mixes:
                by_device[s.device].append(i)
        for device, idx in by_device.items():
            sub = [samples[i] for i in idx]
            shape[idx] = sum(w * self._raw(with_device(sub, v))[1]
                             for w, v in self.mixes[device])
        return np.exp(combine(level, shape, group_rows(samples), self.ordinal_shape))

    @property
    def ordinal_shape(self) -> bool:
        """Whether the shape prediction is an order only (see ``combine``)."""
        return False

