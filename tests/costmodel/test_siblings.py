"""A GPU the model never trained on is ranked by how its siblings ranked the same configs
(issue 20, item 4: leave-one-GPU-out zero-shot): the same vendor counts, another does not."""

from __future__ import annotations

import numpy as np
from scipy.stats import kendalltau

import costmodel
from costmodel._siblings import MeasuredRanks, affinity

A4000, A6000, A100 = ("replay:NVIDIA RTX A4000", "replay:NVIDIA RTX A6000",
                      "replay:NVIDIA A100-PCIE-40GB")
MI250X, W7800 = "replay:MI250X", "replay:AMD Radeon PRO W7800"
CONFIGS = [{"block": b, "tile": t} for b in (32, 64, 128, 256, 512) for t in (1, 2, 3, 4, 6, 8)]


def nvidia_time(c: dict) -> float:  # NVIDIA GPUs: big blocks, small tiles are fast
    return 1e-3 * (1 + 0.3 * abs(np.log2(c["block"]) - 8) + 0.1 * c["tile"])


def amd_time(c: dict) -> float:  # AMD GPUs: the other way round
    return 1e-3 * (1 + 0.3 * abs(np.log2(c["block"]) - 5) + 0.1 * (9 - c["tile"]))


def space(device: str, time=None) -> list[costmodel.Sample]:
    spec = costmodel.spec_for_key(device)
    out = []
    for c in CONFIGS:
        s = costmodel.featurize_params(c, ["block", "tile"], [4096], spec, group=f"k@{device}",
                                       program="k", device=device)
        if time is not None:
            s.seconds = time(c)
        out.append(s)
    return out


def trained() -> costmodel.CostModel:
    """Small trees on two NVIDIA GPUs (an sm_86 and an sm_80) and one AMD GPU."""
    model = costmodel.make_model("gbdt", trees=40, leaves=7)
    model.fit(space(A4000, nvidia_time) + space(A100, nvidia_time) + space(MI250X, amd_time))
    return model


def test_affinity_is_vendor_then_architecture() -> None:
    assert affinity(A6000, A4000) == 4.0  # both sm_86
    assert affinity(A6000, A100) == 1.0  # sm_80: same vendor runtime
    assert affinity(A6000, MI250X) == 0.0
    assert affinity(W7800, MI250X) == 1.0


def test_measured_ranks_never_use_the_device_itself() -> None:
    ranks = MeasuredRanks(space(A4000, nvidia_time) + space(MI250X, amd_time))
    # the A4000's own configs: only the MI250X measured them too, and it is another vendor
    assert np.isnan(ranks.ranks(space(A4000))).all()
    mine = ranks.ranks(space(A6000))
    assert kendalltau(mine, [nvidia_time(c) for c in CONFIGS]).statistic > 0.99


def test_a_gpu_never_trained_on_ranks_like_its_own_vendors_gpus() -> None:
    model = trained()
    for device, time in ((A6000, nvidia_time), (W7800, amd_time)):
        pred = model.predict(space(device))
        truth = [time(c) for c in CONFIGS]
        assert kendalltau(pred, truth).statistic > 0.8, device
    # a device it trained on keeps the model's own order (its measurements taught it)
    pred = model.predict(space(A4000))
    assert kendalltau(pred, [nvidia_time(c) for c in CONFIGS]).statistic > 0.8


def test_shots_of_a_gpu_with_measured_siblings_refit_its_level_not_its_order() -> None:
    model = trained()
    before = model.predict(space(A6000))
    shots = space(A6000, lambda c: 3 * nvidia_time(c))[:8]  # 3x slower than its siblings
    info = model.adapt(shots)[A6000]
    assert A6000 not in model.mixes and info["shape_from"] == f"{A6000} (zero-shot)"
    assert MI250X not in info["tau"]  # another vendor's ranking was no candidate
    after = model.predict(space(A6000))
    assert np.array_equal(np.argsort(after), np.argsort(before))
    truth = np.asarray([3 * nvidia_time(c) for c in CONFIGS])
    assert np.abs(np.log(after / truth)).mean() < np.abs(np.log(before / truth)).mean()


def test_an_outlier_sibling_counts_less_than_those_that_agree_with_the_others() -> None:
    """Three same-vendor GPUs of three architectures (affinity 1 each): two rank alike, the
    third mostly by another knob.  A fourth GPU that ranks like the two (the more likely case:
    from training alone, they agree with more devices) is ranked as they rank, not pulled
    towards the outlier by an equal share (tau 0.75 with equal weights, 0.98 here)."""
    a, b, outlier, new = ("cuda:GPU A:sm_70", "cuda:GPU B:sm_75", "cuda:GPU C:sm_80",
                          "cuda:GPU D:sm_89")

    def odd_time(c: dict) -> float:  # the block size the other way, mildly
        return 1e-3 * (1 + 0.1 * abs(np.log2(c["block"]) - 5) + 0.1 * c["tile"])

    ranks = MeasuredRanks(space(a, lambda c: nvidia_time(c) * (1 + 0.02 * (c["block"] == 128)))
                          + space(b, lambda c: nvidia_time(c) * (1 + 0.02 * (c["tile"] == 3)))
                          + space(outlier, odd_time))
    assert ranks.typicality("k", outlier) < min(ranks.typicality("k", a),
                                                ranks.typicality("k", b))
    w = ranks.weights("k", new)
    assert w[outlier] < 0.1 * (w[a] + w[b])
    tau = kendalltau(ranks.ranks(space(new)), [nvidia_time(c) for c in CONFIGS]).statistic
    assert tau > 0.9


def test_a_model_stored_before_the_typicality_weights_still_ranks() -> None:
    import pickle

    ranks = MeasuredRanks(space(A4000, nvidia_time) + space(A100, nvidia_time)
                          + space(MI250X, amd_time))
    want = ranks.ranks(space(A6000))
    old = MeasuredRanks.__new__(MeasuredRanks)
    # what a pickle of the earlier class held: ranks keyed by (program, config)
    old.__dict__.update(z={(k[0], k[2]): v for k, v in ranks.z.items()})
    again = pickle.loads(pickle.dumps(old))
    assert np.allclose(again.ranks(space(A6000)), want)


def test_a_model_stored_when_groups_held_16_characters_of_the_hash_still_ranks() -> None:
    """Our rows' groups once held a structure hash's first 16 characters, while the sampler
    named its configs by the whole hash (so it found no sibling's rank); groups are now
    ``costmodel.group_name`` everywhere, and a model stored then looks its ranks up by the
    first 16 characters."""
    import pickle

    structure = "0123456789abcdef" * 4  # a sha256 hex digest's length

    def named(samples: list[costmodel.Sample]) -> list[costmodel.Sample]:
        for s in samples:
            s.group = costmodel.group_name(structure, s.device)
        return samples

    ranks = MeasuredRanks(named(space(A4000, nvidia_time) + space(A100, nvidia_time)))
    want = ranks.ranks(named(space(A6000)))
    assert np.isfinite(want).all()
    old = MeasuredRanks.__new__(MeasuredRanks)
    old.__dict__.update(z={(k[0], k[1][:16], k[2]): v for k, v in ranks.z.items()},
                        keyed_by="structure", agree=ranks.agree)
    again = pickle.loads(pickle.dumps(old))
    assert np.allclose(again.ranks(named(space(A6000))), want)


def test_two_structures_of_one_program_keep_their_own_orders() -> None:
    """Two µGraph structures of one program share the knob names (``F``, ``g0``) but rank
    them in opposite orders; a new device's configs of each are ranked by its siblings'
    measurements of that structure, not of the other (one key for both mixed them)."""
    def structure_space(device: str, structure: str, sign: int, time: bool) -> list:
        spec = costmodel.spec_for_key(device)
        out = []
        for c in CONFIGS:
            s = costmodel.featurize_params(c, ["block", "tile"], [4096], spec,
                                           group=f"{structure}@{device}", program="p",
                                           device=device)
            if time:
                s.seconds = 1e-3 * (20 + sign * (np.log2(c["block"]) + c["tile"] / 8))
            out.append(s)
        return out

    ranks = MeasuredRanks([s for d in (A4000, A100) for st, sign in (("s1", 1), ("s2", -1))
                           for s in structure_space(d, st, sign, True)])
    for structure, sign in (("s1", 1), ("s2", -1)):
        new = structure_space(A6000, structure, sign, False)
        truth = [1e-3 * (20 + sign * (np.log2(c["block"]) + c["tile"] / 8)) for c in CONFIGS]
        assert kendalltau(ranks.ranks(new), truth).statistic > 0.99, structure


def test_a_known_device_keeps_its_own_prediction_beside_a_new_one() -> None:
    """Predicting a trained-on GPU's configs together with a new GPU's gives the trained-on
    GPU what it gets alone: only the new device's groups take the siblings' order (the mixed
    call re-ranked every group before)."""
    model = costmodel.make_model("gbdt", trees=40, leaves=7, shape_objective="regression")
    model.fit(space(A4000, nvidia_time) + space(A100, nvidia_time) + space(MI250X, amd_time))
    alone = model.predict(space(A4000))
    together = model.predict(space(A4000) + space(A6000))
    assert np.allclose(together[:len(CONFIGS)], alone)
