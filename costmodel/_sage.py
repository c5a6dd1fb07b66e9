"""GraphSAGE over the op graph, as seed 001 (the TPU learned performance model) does."""

from __future__ import annotations

import io
import time
from collections.abc import Sequence

import numpy as np

from ._features import GRAPH_DIM, NODE_DIM, OPCODES, Sample
from ._models import LearnedModel, _spread, group_rows, within_group


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
