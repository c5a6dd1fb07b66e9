"""benchmarks/strategies.py: the model strategy's shortcuts (a memo of the model's raw
predictions, correction sums kept from step to step) pick the same configs as the rule
written plainly, and the script runs end to end on small caches."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys

import numpy as np
import pytest
from support import REPO, guided_correction, kernel_tuner_cache, load_script

from tuner.samplers.model import MAIN_EFFECTS_FROM, MAIN_EFFECTS_RIDGE

SCRIPT = REPO / "benchmarks" / "strategies.py"


def _load():
    return load_script("benchmarks/strategies.py")


GPUS = {  # three GPUs of one toy kernel, each with its own optimum
    "A100": ("NVIDIA A100-PCIE-40GB",
             lambda a, b: (math.log2(a) - 3) ** 2 + 0.5 * math.log2(b) + 1),
    "A4000": ("NVIDIA RTX A4000",
              lambda a, b: (math.log2(a) - 4) ** 2 + 0.3 * math.log2(b) + 1),
    "MI250X": ("MI250X", lambda a, b: (math.log2(a) - 2) ** 2 + abs(math.log2(b) - 2) + 1),
}


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("caches")
    (root / "toy").mkdir()
    for name, (device, times) in GPUS.items():
        kernel_tuner_cache(root / "toy", name, times, device)
    return root


def _plain_rule(space, model, samples, seed, budget):
    """The rule as the sampler writes it: sums afresh every step, no memo."""
    model = copy.copy(model)
    model.offsets, model.mixes = dict(model.offsets), dict(model.mixes)
    predicted = np.log(model.predict(samples))
    noise = np.random.default_rng(seed).normal(0.0, 0.01, len(predicted))
    measured = np.zeros(len(predicted), bool)
    order: list[int] = []
    for _ in range(min(budget, len(predicted))):
        if len(order) in (4, 8, 16):
            shots = []
            for i in order:
                shot = copy.copy(samples[i])
                shot.seconds = float(space.times[i])
                shots.append(shot)
            model.adapt(shots)
            predicted = np.log(model.predict(samples))
        correction = guided_correction(space.codes, predicted,
                                       [(i, float(space.times[i])) for i in order],
                                       MAIN_EFFECTS_FROM, MAIN_EFFECTS_RIDGE)
        i = int(np.argmin(np.where(measured, np.inf, predicted + noise + correction)))
        order.append(i)
        measured[i] = True
    return order


def test_model_strategy_shortcuts_pick_the_same_configs(caches):
    bench = _load()
    spaces = [bench.Space(p) for p in sorted((caches / "toy").glob("*.json.gz"))]
    target = next(s for s in spaces if s.path.name.startswith("A100."))
    model = bench.model_for_target(spaces, target, "gbdt")
    samples = bench.target_samples(target)
    plain = [_plain_rule(target, model, samples, seed, 30) for seed in range(3)]
    bench.memoize_raw(model)
    fast = [bench.run_model(target, model, samples, seed, 30) for seed in range(3)]
    again = [bench.run_model(target, model, samples, seed, 30) for seed in range(3)]
    assert fast == plain == again
    assert all(len(set(o)) == 30 for o in fast)


def test_script_runs_end_to_end(caches, tmp_path):
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--caches", str(caches), "--spaces", "toy",
         "--seeds", "2", "--budget", "8", "--ours", "random,model", "--kt", "",
         "--gpus", "A100", "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["gpu"] for r in rows] == ["NVIDIA A100-PCIE-40GB"]
    assert set(rows[0]) == {"space", "gpu", "configs", "random", "model"}
    assert rows[0]["configs"] == 48  # the config that did not run is left out
    assert len(rows[0]["model"]["hits"]) == 2
    bad = subprocess.run([sys.executable, str(SCRIPT), "--ours", "cmaes"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown strategies" in bad.stderr
