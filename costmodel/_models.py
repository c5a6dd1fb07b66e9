"""Three models behind one face: the roofline, gradient-boosted trees, GraphSAGE (seed 001).

``fit(samples)`` learns log seconds; ``predict(samples)`` returns seconds; ``to_bytes`` /
``load_model`` move a trained model through the database.  The roofline is the analytical
estimate lowering already makes, with one scale per device fitted on the training rows (it is
a lower bound, so raw its MAPE says little); the trees (LightGBM) read flat features, the
TenSet / MetaSchedule anchor; GraphSAGE reads the op graph as the seed paper does: opcode
embeddings concatenated with node and graph features, SAGE convolutions along the data flow,
mean / max / sum pooling, a feed-forward head, trained on the paper's two objectives at once —
squared error of log time (its fusion task) and a pairwise logistic rank loss between configs
of one group (its tile task).
"""

from __future__ import annotations

import io
import math
import pickle
import time
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
from scipy.stats import kendalltau

from ._features import DEVICE_DIM, FEATURE_VERSION, GRAPH_DIM, NODE_DIM, OPCODES, Sample
from ._siblings import MeasuredRanks, affinity, blend

MODEL_KINDS = ("roofline", "gbdt", "graphsage")


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

    @abstractmethod
    def fit(self, samples: Sequence[Sample], *, progress: Callable[[str], None] | None = None,
            seed: int = 0) -> None: ...

    @abstractmethod
    def predict(self, samples: Sequence[Sample]) -> np.ndarray:
        """Predicted seconds per sample (nan where the model cannot say)."""

    def to_bytes(self) -> bytes:
        return pickle.dumps(self)


def load_model(blob: bytes) -> CostModel:
    """A model from ``to_bytes``; refuses one made for other features."""
    model = pickle.loads(blob)  # noqa: S301 - our own database's blobs
    if getattr(model, "feature_version", None) != FEATURE_VERSION:
        raise ValueError(f"the stored model reads features of version {model.feature_version}, "
                         f"this code makes version {FEATURE_VERSION}: train it again")
    return model


def make_model(kind: str, **options) -> CostModel:
    if kind == "roofline":
        return RooflineModel()
    if kind == "gbdt":
        return GbdtModel(**options)
    if kind == "graphsage":
        return SageModel(**options)
    raise ValueError(f"unknown model kind {kind!r}; use one of {', '.join(MODEL_KINDS)}")


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
        new = [i for i, s in enumerate(samples) if s.device not in self.devices]
        if measured is None or not new:
            return shape
        sibling = np.full(len(samples), np.nan)
        sibling[new] = measured.ranks([samples[i] for i in new])
        if np.isnan(sibling).all():
            return shape
        return blend(shape, sibling, group_rows(samples))

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


class GbdtModel(LearnedModel):
    """LightGBM on flat features (``Sample.flat``): one booster regresses log seconds (the
    level), the other learns the shape — by default (``shape_objective="lambdarank"``) as a
    ranking, LightGBM's lambdarank over queries of one group (a structure or a Kernel Tuner
    space on one device), graded by each config's rank in its group, so a group's scale never
    enters (leave-one-GPU-out zero-shot tau 0.544 -> 0.567 convolution, 0.596 -> 0.605
    dedispersion; CPU programs held out 0.361 -> 0.418; 400 / 300 trees of 63 leaves, same
    folds, docs/costmodel.md); ``"regression"``: the within-group standardised log seconds,
    the rule before.  ``time_budget_s`` stops boosting early (half of it each), for the
    retrain at the end of a launch."""

    kind = "gbdt"

    # 1200 trees of 255 leaves: convolution random split tau 0.87 -> 0.92 over 400 of 63
    # (Intel Xeon, 2 cores, under load; benchmarks/costmodel.py)
    RANK_GRADES = 32  # relevance grades of a lambdarank query: the within-group rank, binned
    RANK_QUERY = 256  # rows per lambdarank query: larger groups are cut into random chunks

    def __init__(self, trees: int = 1200, leaves: int = 255, threads: int | None = None,
                 time_budget_s: float | None = None, shape_objective: str = "lambdarank"
                 ) -> None:
        super().__init__()
        self.trees, self.leaves, self.threads = trees, leaves, threads
        self.time_budget_s = time_budget_s
        if shape_objective not in ("regression", "lambdarank"):
            raise ValueError(f"shape_objective {shape_objective!r}: use regression or "
                             "lambdarank")
        self.shape_objective = shape_objective

    def fit(self, samples: Sequence[Sample], *, progress=None, seed: int = 0) -> None:
        import lightgbm

        x = np.stack([s.flat() for s in samples])
        logt = np.log([s.seconds for s in samples])
        # one thread unless asked: on a loaded 2-core machine OpenMP's barriers cost more than
        # the trees (a 526-row fit: 4.7 s on one thread, over 5 minutes on two)
        threads = self.threads or 1
        params = {"objective": "regression", "num_leaves": self.leaves, "learning_rate": 0.05,
                  "min_data_in_leaf": 5, "bagging_fraction": 0.9, "bagging_freq": 1,
                  "feature_fraction": 0.9, "num_threads": threads, "seed": seed,
                  "verbose": -1}

        def boost(y: np.ndarray, rank: bool = False):
            callbacks = []
            if self.time_budget_s is not None:
                end = time.perf_counter() + self.time_budget_s / 2

                def stop(env) -> None:
                    if time.perf_counter() > end:
                        if progress:
                            progress(f"gbdt: time budget reached at tree {env.iteration + 1}")
                        raise lightgbm.callback.EarlyStopException(env.iteration, [])
                callbacks.append(stop)
            if not rank:
                return lightgbm.train(params, lightgbm.Dataset(x, y), self.trees,
                                      callbacks=callbacks)
            order, sizes, grades = self._queries(logt, group_rows(samples), seed)
            ranked = {**params, "objective": "lambdarank",
                      "label_gain": list(range(self.RANK_GRADES)),
                      "lambdarank_truncation_level": self.RANK_QUERY}
            return lightgbm.train(ranked, lightgbm.Dataset(x[order], grades, group=sizes),
                                  self.trees, callbacks=callbacks)

        self.level = boost(logt)
        if self.shape_objective == "lambdarank":
            self.shape = boost(logt, rank=True)
        else:
            self.shape = boost(within_group(logt, group_rows(samples)))
        self.remember(samples)

    @property
    def ordinal_shape(self) -> bool:
        return getattr(self, "shape_objective", "regression") == "lambdarank"

    def _queries(self, logt: np.ndarray, groups: Sequence[np.ndarray], seed: int
                 ) -> tuple[np.ndarray, list[int], np.ndarray]:
        """Lambdarank's queries: each group (one space on one device) cut into random chunks
        of at most ``RANK_QUERY`` rows (its pairs are O(rows^2): a 10k-config space would be
        10^8 pairs a tree; random chunks sample the same pairs without bias), each row graded
        0 (slowest of its group) .. ``RANK_GRADES`` - 1 (fastest) by its rank in the whole
        group.  Returns (row order, query sizes, grades in that order)."""
        rng = np.random.default_rng(seed)
        order: list[np.ndarray] = []
        sizes: list[int] = []
        grades = np.zeros(len(logt))
        for idx in groups:
            rank = np.argsort(np.argsort(-logt[idx], kind="stable"), kind="stable")
            grades[idx] = np.floor((self.RANK_GRADES - 1) * rank / max(len(idx) - 1, 1))
            shuffled = rng.permutation(idx)
            for start in range(0, len(idx), self.RANK_QUERY):
                chunk = shuffled[start:start + self.RANK_QUERY]
                order.append(chunk)
                sizes.append(len(chunk))
        rows = np.concatenate(order)
        return rows, sizes, grades[rows]

    def _raw(self, samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray]:
        x = np.stack([s.flat() for s in samples])
        shape = np.asarray(self.shape.predict(x))
        if getattr(self, "shape_objective", "regression") == "lambdarank":
            shape = -shape  # a lambdarank score is higher for faster: shape is log-time-like
        return np.asarray(self.level.predict(x)), shape


class SageModel(LearnedModel):
    """GraphSAGE over the op graph (see the module docstring)."""

    kind = "graphsage"

    # defaults from the convolution caches' random split (AMD EPYC, 2 cores): 800 steps of
    # 4 x 64 rows gave tau 0.65, 6000 steps of 2 x 512 rows, 128 wide, lr 5e-3 gave 0.84
    def __init__(self, hidden: int = 128, layers: int = 2, steps: int = 6000,
                 batch_groups: int = 2, group_rows: int = 512, rank_weight: float = 1.0,
                 time_budget_s: float = 540.0, threads: int = 2, lr: float = 5e-3) -> None:
        super().__init__()
        self.lr = lr
        self.hidden, self.layers, self.steps = hidden, layers, steps
        self.batch_groups, self.group_rows = batch_groups, group_rows
        self.rank_weight, self.time_budget_s, self.threads = rank_weight, time_budget_s, threads
        self.state: bytes | None = None

    # ---------------------------------------------------------------- the network
    def _net(self):
        import torch
        from torch import nn
        from torch_geometric.nn import SAGEConv, global_max_pool, global_mean_pool

        hidden, layers = self.hidden, self.layers

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embed = nn.Embedding(len(OPCODES), 16)
                self.inp = nn.Linear(16 + NODE_DIM + GRAPH_DIM, hidden)
                self.convs = nn.ModuleList(SAGEConv(hidden, hidden) for _ in range(layers))
                self.head = nn.Sequential(nn.Linear(3 * hidden + GRAPH_DIM, hidden), nn.ReLU(),
                                          nn.Linear(hidden, 2))

            def forward(self, op, x, edge, batch, g):
                h = torch.relu(self.inp(torch.cat([self.embed(op), x, g[batch]], 1)))
                for conv in self.convs:
                    h = h + torch.relu(conv(h, edge))
                size = g.shape[0]
                summed = torch.zeros(size, h.shape[1]).index_add_(0, batch, h)
                pooled = torch.cat([global_mean_pool(h, batch, size),
                                    global_max_pool(h, batch, size), summed], 1)
                return self.head(torch.cat([pooled, g], 1))  # (level, shape)

        return Net()

    def _batch(self, samples: Sequence[Sample]):
        import torch

        sizes = np.fromiter((len(s.opcodes) for s in samples), np.int64, len(samples))
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        edge_counts = np.fromiter((s.edges.shape[1] for s in samples), np.int64, len(samples))
        edges = np.concatenate([s.edges for s in samples], 1) if edge_counts.any() else \
            np.zeros((2, 0), np.int64)
        edges = edges + np.repeat(starts, edge_counts)  # node ids of each graph, offset
        x = (np.concatenate([s.nodes for s in samples]) - self.node_mu) / self.node_sd
        g = (np.stack([s.graph for s in samples]) - self.graph_mu) / self.graph_sd
        return (torch.from_numpy(np.concatenate([s.opcodes for s in samples])),
                torch.from_numpy(x.astype(np.float32)), torch.from_numpy(edges),
                torch.from_numpy(np.repeat(np.arange(len(samples)), sizes)),
                torch.from_numpy(g.astype(np.float32)))

    # ---------------------------------------------------------------- training
    def fit(self, samples: Sequence[Sample], *, progress=None, seed: int = 0) -> None:
        import torch

        torch.manual_seed(seed)
        torch.set_num_threads(self.threads)
        rng = np.random.default_rng(seed)
        nodes = np.concatenate([s.nodes for s in samples])
        graphs = np.stack([s.graph for s in samples])
        # a feature constant in training (one device's features) stays unscaled: dividing by
        # its zero spread would blow up any other value at prediction
        self.node_mu, self.node_sd = nodes.mean(0), _spread(nodes)
        self.graph_mu, self.graph_sd = graphs.mean(0), _spread(graphs)
        logt = np.log([s.seconds for s in samples])
        self.y_mu, self.y_sd = float(logt.mean()), float(logt.std() + 1e-6)
        y = torch.from_numpy(((logt - self.y_mu) / self.y_sd).astype(np.float32))
        groups = group_rows(samples)
        z = torch.from_numpy(within_group(logt, groups).astype(np.float32))
        weights = np.asarray([len(g) for g in groups], np.float64) ** 0.5
        weights /= weights.sum()
        net = self._net()
        opt = torch.optim.AdamW(net.parameters(), lr=self.lr, weight_decay=1e-4)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, self.steps)
        start, loss_avg = time.perf_counter(), None
        for step in range(self.steps):
            picked = rng.choice(len(groups), size=min(self.batch_groups, len(groups)),
                                replace=False, p=weights)
            idx = np.concatenate([rng.choice(groups[g], size=min(self.group_rows,
                                                                 len(groups[g])),
                                             replace=False) for g in picked])
            out = net(*self._batch([samples[i] for i in idx]))
            pred, target = out[:, 1], z[idx]
            loss = torch.mean((out[:, 0] - y[idx]) ** 2) + torch.mean((pred - target) ** 2)
            if self.rank_weight:
                gid = torch.from_numpy(np.repeat(np.arange(len(picked)), [
                    min(self.group_rows, len(groups[g])) for g in picked]))
                same = gid[:, None] == gid[None, :]
                slower = (target[:, None] - target[None, :]) > 1e-3  # i measured slower than j
                pairs = same & slower
                if pairs.any():
                    diff = pred[:, None] - pred[None, :]
                    loss = loss + self.rank_weight * torch.nn.functional.softplus(-diff)[
                        pairs].mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            value = float(loss.detach())
            loss_avg = value if loss_avg is None else 0.98 * loss_avg + 0.02 * value
            if progress and (step % 250 == 0 or step == self.steps - 1):
                progress(f"graphsage step {step + 1}/{self.steps} loss {loss_avg:.4f}")
            if time.perf_counter() - start > self.time_budget_s:
                if progress:
                    progress(f"graphsage: time budget reached at step {step + 1}")
                break
        buf = io.BytesIO()
        torch.save(net.state_dict(), buf)
        self.state = buf.getvalue()
        self._module = net
        self.remember(samples)

    def _raw(self, samples: Sequence[Sample], batch: int = 4096
             ) -> tuple[np.ndarray, np.ndarray]:
        import torch

        net = getattr(self, "_module", None)
        if net is None:
            if self.state is None:
                raise ValueError("predict before fit: a GraphSAGE model has no weights yet")
            net = self._net()
            net.load_state_dict(torch.load(io.BytesIO(self.state), weights_only=True))
            self._module = net
        net.eval()
        out = []
        with torch.no_grad():
            for i in range(0, len(samples), batch):
                out.append(net(*self._batch(samples[i:i + batch])).numpy())
        both = np.concatenate(out) if out else np.zeros((0, 2), np.float32)
        return both[:, 0] * self.y_sd + self.y_mu, both[:, 1].astype(np.float64)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_module", None)  # the weights travel as ``state`` bytes
        return state
