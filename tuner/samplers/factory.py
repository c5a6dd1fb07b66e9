"""A launch's sampler for one device: the registry's kind, with the cost model found for it.

``auto`` (the default) decides per device (``_auto``): of the device's own model and the model
of every device, the one with the better figure there, when it is at least ``AUTO_MIN_TAU``:
its held-out Kendall tau on the device (``costmodel.train`` measures it on rows it held out;
on at least ``MIN_HELD_OUT`` configs), or, on a device it never trained on, how well other
devices' measurements ranked the devices it trained on (``zero_shot_tau``; per study, TPE
where no other device measured a candidate: ``SiblingsOrTpe``); TPE otherwise.  ``model``
uses the stored model whatever its record.  Either way the choice is said in the log and
kept on the factory (``chosen``) for the summary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .registry import AUTO_MIN_TAU, MIN_HELD_OUT, SAMPLERS, make_sampler

if TYPE_CHECKING:
    import db


@dataclass
class SamplerFactory:
    """Makes a fresh sampler per study; ``chosen`` says which and why (one line)."""

    make: Callable[[], Any]
    chosen: str

    def __call__(self) -> Any:
        return self.make()


def held_out_tau(record: Any, device_key: str) -> float | None:
    """The stored model's held-out Kendall tau on ``device_key`` (None: never measured, or
    measured on fewer than ``MIN_HELD_OUT`` configs)."""
    figure = (record.metrics.get("held_out") or {}).get(device_key, {})
    tau = figure.get("kendall_tau")
    if tau is None or figure.get("n", MIN_HELD_OUT) < MIN_HELD_OUT:
        return None
    return float(tau)


def zero_shot_tau(record: Any, device_key: str) -> float | None:
    """On a device the stored model never trained on: how well other devices' measurements
    ranked the devices it did train on, each left out (``costmodel.train``'s ``zero_shot``),
    as the mean over those of ``device_key``'s vendor runtime weighted by their affinity
    (the same architecture counts most).  None: no such figure."""
    from costmodel import affinity

    figures = record.metrics.get("zero_shot") or {}
    kin = [(affinity(device_key, d), float(m["kendall_tau"])) for d, m in figures.items()
           if d != device_key]
    kin = [(w, tau) for w, tau in kin if w > 0]
    if not kin:
        return None
    return sum(w * tau for w, tau in kin) / sum(w for w, _ in kin)


def sampler_factory(name: str, seed: int | None, database: db.Database, device_key: str,
                    log: Callable[[str], None] = lambda _msg: None) -> SamplerFactory:
    """What a launch's studies on ``device_key`` ask for a fresh sampler (module docstring)."""
    kind = SAMPLERS[name]
    if not kind.model:
        return SamplerFactory(lambda: make_sampler(name, seed), name)
    from costmodel import device_profile, model_for

    from .model import ModelSampler

    note = device_profile(device_key).note
    if note:
        log(note)
    found = model_for(database, device_key)
    if found is None:
        why = (f"sampler {name}: no trained cost model for {device_key} in the database "
               "(`tuner model train`); tuning with TPE instead")
        log(why)
        return SamplerFactory(lambda: make_sampler(name, seed), f"tpe (no cost model for "
                              f"{device_key})")
    if kind.auto:
        return _auto(database, device_key, seed, log, found)
    model, record = found
    what = _what(record)
    log(f"sampler model: {what} ranks each space")
    return SamplerFactory(lambda: ModelSampler(model, seed=seed or 0, log=log),
                          f"model {record.id}")


def _what(record: Any) -> str:
    return (f"cost model {record.id} ({record.kind}, trained on "
            f"{record.trained_on.get('rows', '?')} measurements)")


def _auto(database: db.Database, device_key: str, seed: int | None,
          log: Callable[[str], None], own: tuple) -> SamplerFactory:
    """``auto``: of the device's own newest model and the newest model of every device, the
    one with the better figure on ``device_key`` — its held-out tau there, or, where it never
    trained on the device, its siblings' zero-shot tau (``SiblingsOrTpe``) — if that clears
    ``AUTO_MIN_TAU``; TPE otherwise.  The device's own model alone would end the siblings'
    part after one launch: the retrain at its end fits a model on the device's few rows,
    whose held-out figure (4 configs after a 20-trial launch) said nothing.  ``own``: what
    ``model_for`` found for the device."""
    import db
    from costmodel import model_for

    from .model import ModelSampler, SiblingsOrTpe

    options: dict[int, tuple] = {}
    said: list[str] = []
    for found in (own, model_for(database, db.ALL_DEVICES)):
        if found is None or found[1].id in options:
            continue
        model, record = found
        trained = device_key in record.trained_on.get("devices", ())
        tau = held_out_tau(record, device_key) if trained else zero_shot_tau(record, device_key)
        options[record.id] = (tau, trained, model, record)
        if tau is None:
            figure = "no held-out figure on this device"
        elif trained:
            figure = f"held-out tau {tau:.2f}"
        else:
            figure = (f"no held-out figure on this device, and other devices' measurements "
                      f"ranked the devices it trained on at tau {tau:.2f}")
        said.append(f"{_what(record)} has {figure}")
    figured = [o for o in options.values() if o[0] is not None]
    best = max(figured, key=lambda o: o[0]) if figured else None
    if best is None or best[0] < AUTO_MIN_TAU:
        why = "; ".join(said)
        log(f"sampler auto: TPE on {device_key}: {why} (a model is used from tau "
            f"{AUTO_MIN_TAU})")
        short = said[0].split(" has ", 1)[1] if len(said) == 1 else "no figure >= " \
            f"{AUTO_MIN_TAU}"
        return SamplerFactory(lambda: make_sampler("tpe", seed), f"tpe ({short})")
    tau, trained, model, record = best
    if trained:
        log(f"sampler auto: {_what(record)} ranks each space on {device_key} (held-out tau "
            f"{tau:.2f} >= {AUTO_MIN_TAU})")
        return SamplerFactory(lambda: ModelSampler(model, seed=seed or 0, log=log),
                              f"model {record.id} (held-out tau {tau:.2f})")
    log(f"sampler auto: {_what(record)} ranks each space on {device_key}, a device it never "
        f"trained on, by other devices' measurements of the same configs (their order ranked "
        f"the devices it trained on at tau {tau:.2f} >= {AUTO_MIN_TAU}, each left out); a "
        "study whose candidates no other device measured gets TPE")
    return SamplerFactory(lambda: SiblingsOrTpe(model, seed=seed or 0, log=log),
                          f"model {record.id} (siblings' zero-shot tau {tau:.2f}; TPE for a "
                          "study they measured none of)")
