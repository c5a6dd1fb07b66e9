"""A launch's sampler for one device: the registry's kind, with the cost model found for it.

``auto`` (the default) decides per device: the stored model when its held-out Kendall tau on
that device (``costmodel.train`` measures it on rows it held out) is at least
``AUTO_MIN_TAU``; on a device it never trained on, the model where other devices' measurements
ranked the devices it trained on at least that well (``zero_shot_tau``; per study, TPE where
no other device measured a candidate: ``SiblingsOrTpe``); TPE otherwise; ``model`` uses the stored model whatever its record.  Either
way the choice is said in the log and kept on the factory (``chosen``) for the summary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .registry import AUTO_MIN_TAU, SAMPLERS, make_sampler

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
    """The stored model's held-out Kendall tau on ``device_key`` (None: never measured)."""
    tau = (record.metrics.get("held_out") or {}).get(device_key, {}).get("kendall_tau")
    return None if tau is None else float(tau)


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

    from .model import ModelSampler, SiblingsOrTpe

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
    model, record = found
    what = (f"cost model {record.id} ({record.kind}, trained on "
            f"{record.trained_on.get('rows', '?')} measurements)")
    if kind.auto:
        tau = held_out_tau(record, device_key)
        zero = None if device_key in record.trained_on.get("devices", ()) else \
            zero_shot_tau(record, device_key)
        if tau is None and zero is not None and zero >= AUTO_MIN_TAU:
            log(f"sampler auto: {what} ranks each space on {device_key}, a device it never "
                f"trained on, by other devices' measurements of the same configs (their "
                f"order ranked the devices it trained on at tau {zero:.2f} >= {AUTO_MIN_TAU}, "
                "each left out); a study whose candidates no other device measured gets TPE")
            return SamplerFactory(lambda: SiblingsOrTpe(model, seed=seed or 0, log=log),
                                  f"model {record.id} (siblings' zero-shot tau {zero:.2f}; TPE for "
                                  "a study they measured none of)")
        if tau is None or tau < AUTO_MIN_TAU:
            figure = "no held-out figure on this device" if tau is None else \
                f"held-out tau {tau:.2f} < {AUTO_MIN_TAU}"
            if tau is None and zero is not None:
                figure += (f", and other devices' measurements ranked the devices it trained "
                           f"on at tau {zero:.2f} < {AUTO_MIN_TAU}")
            log(f"sampler auto: TPE on {device_key}: {what} has {figure}")
            return SamplerFactory(lambda: make_sampler(name, seed), f"tpe ({figure})")
        log(f"sampler auto: {what} ranks each space on {device_key} (held-out tau {tau:.2f} "
            f">= {AUTO_MIN_TAU})")
        return SamplerFactory(lambda: ModelSampler(model, seed=seed or 0, log=log),
                              f"model {record.id} (held-out tau {tau:.2f})")
    log(f"sampler model: {what} ranks each space")
    return SamplerFactory(lambda: ModelSampler(model, seed=seed or 0, log=log),
                          f"model {record.id}")
