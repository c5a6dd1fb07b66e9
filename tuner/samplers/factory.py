"""A launch's sampler for one device: the registry's kind, with the cost model found for it.

``auto`` (the default) decides per device (``_auto``): of the device's own model and the model
of every device, the one with the better figure there, when it clears the bar: its held-out
Kendall tau on the device at least ``AUTO_MIN_TAU`` (``costmodel.train`` measures it on rows
it held out; on at least ``MIN_HELD_OUT`` configs), or, on a device it never trained on, how
other devices' measurements ranked the devices it trained on (per study, TPE where no other
device measured a candidate: ``SiblingsOrTpe``): a tau at least ``AUTO_MIN_TAU``
(``zero_shot_tau``), or the first configs of their order nearer the optimum than as many
random draws (``zero_shot_first``: the top of the order is what a tuner measures; tau weighs
the whole space); TPE otherwise.  ``model`` weighs the same two models the same way but uses
the better one whatever its figure (the device's own where neither has one), TPE only where
no model is stored.  Either way the choice is said in the log and kept on the factory
(``chosen``) for the summary.
"""

from __future__ import annotations

import math
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


def _kin_mean(record: Any, device_key: str, value: Callable[[dict], float | None]
              ) -> float | None:
    """The affinity-weighted mean of ``value`` of the stored model's zero-shot figures on
    the devices of ``device_key``'s vendor runtime (the same architecture counts most)."""
    from costmodel import affinity

    figures = record.metrics.get("zero_shot") or {}
    num = den = 0.0
    for device, m in figures.items():
        w, v = affinity(device_key, device), value(m)
        if device != device_key and w > 0 and v is not None:
            num, den = num + w * v, den + w
    return num / den if den > 0 else None


def zero_shot_tau(record: Any, device_key: str) -> float | None:
    """On a device the stored model never trained on: how well other devices' measurements
    ranked the devices it did train on, each left out (``costmodel.train``'s ``zero_shot``),
    as the mean over those of ``device_key``'s vendor runtime weighted by their affinity.
    None: no such figure."""
    return _kin_mean(record, device_key, lambda m: float(m["kendall_tau"]))


def zero_shot_first(record: Any, device_key: str) -> tuple[float, float, int] | None:
    """The top of that order, which a tuner measures first: how near the optimum the best
    of its first k configs came on those devices, and the best of k random draws does
    (slowdowns; geometric means over the kin, weighted as ``zero_shot_tau``), and k.
    None: no figure (a model stored before it, or no space of more than k configs)."""
    def log1p_of(key: str) -> Callable[[dict], float | None]:
        return lambda m: math.log1p(m["first"][key]) if "first" in m else None

    first = _kin_mean(record, device_key, log1p_of("first_slowdown"))
    rand = _kin_mean(record, device_key, log1p_of("random_slowdown"))
    if first is None or rand is None:
        return None
    k = next(m["first"]["k"] for m in (record.metrics.get("zero_shot") or {}).values()
             if "first" in m)
    return math.expm1(first), math.expm1(rand), int(k)


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
    options = _weigh(database, device_key, found)
    if kind.auto:
        return _auto(device_key, seed, log, options)
    figured = [(o.tau, i) for i, o in enumerate(options) if o.tau is not None]
    best = options[max(figured, key=lambda f: (f[0], -f[1]))[1] if figured else 0]
    why = f" (of {'; '.join(o.said for o in options)})" if len(options) > 1 else ""
    log(f"sampler model: {_what(best.record)} ranks each space{why}")
    which = "held-out" if best.trained else "siblings' zero-shot"
    figure = "" if best.tau is None else f" ({which} tau {best.tau:.2f})"
    return SamplerFactory(lambda: ModelSampler(best.model, seed=seed or 0, log=log),
                          f"model {best.record.id}{figure}")


def _what(record: Any) -> str:
    return (f"cost model {record.id} ({record.kind}, trained on "
            f"{record.trained_on.get('rows', '?')} measurements)")


@dataclass
class _Option:
    """A stored model a launch weighs, with its figure on the device (``_weigh``)."""

    model: Any
    record: Any
    trained: bool  # on the device: ``tau`` is held out there; else its siblings' zero-shot
    tau: float | None
    first: tuple[float, float, int] | None  # ``zero_shot_first`` (untrained only)

    @property
    def beats_random(self) -> bool:
        """The siblings' first k configs came nearer the optimum than k random draws."""
        return self.first is not None and self.first[0] < self.first[1]

    @property
    def clears(self) -> bool:
        """``auto`` takes it: tau at least ``AUTO_MIN_TAU``, or, on a device it never
        trained on, the top of its siblings' order beat random on their kin."""
        return (self.tau is not None and self.tau >= AUTO_MIN_TAU) or self.beats_random

    @property
    def said(self) -> str:
        if self.tau is None:
            figure = "no held-out figure on this device"
        elif self.trained:
            figure = f"held-out tau {self.tau:.2f}"
        else:
            figure = (f"no held-out figure on this device, and other devices' measurements "
                      f"ranked the devices it trained on at tau {self.tau:.2f}")
            if self.first is not None:
                first, rand, k = self.first
                figure += (f", their first {k} configs within {100 * first:.1f}% of the "
                           f"optimum where {k} random draws come within {100 * rand:.1f}%")
        return f"{_what(self.record)} has {figure}"


def _weigh(database: db.Database, device_key: str, own: tuple) -> list[_Option]:
    """The models a launch on ``device_key`` weighs: its own newest (``own``, what
    ``model_for`` found) and the newest model of every device, each with its figure there —
    its held-out tau on the device, or, where it never trained on the device, its siblings'
    zero-shot figures.  The device's own model alone would end the siblings' part after one
    launch on a new GPU: the retrain at its end fits a model on the device's few rows, whose
    held-out figure (4 configs after a 20-trial launch) says nothing."""
    import db
    from costmodel import model_for

    options: dict[int, _Option] = {}
    for found in (own, model_for(database, db.ALL_DEVICES)):
        if found is None or found[1].id in options:
            continue
        model, record = found
        trained = device_key in record.trained_on.get("devices", ())
        if trained:
            options[record.id] = _Option(model, record, True, held_out_tau(record, device_key),
                                         None)
        else:
            options[record.id] = _Option(model, record, False, zero_shot_tau(record, device_key),
                                         zero_shot_first(record, device_key))
    return list(options.values())


def _auto(device_key: str, seed: int | None, log: Callable[[str], None],
          options: list[_Option]) -> SamplerFactory:
    """``auto``: of the models ``_weigh`` found that clear the bar (``_Option.clears``), the
    one with the better tau on ``device_key`` (``SiblingsOrTpe`` where it never trained on
    the device); TPE where none does."""
    from .model import ModelSampler, SiblingsOrTpe

    clearing = [o for o in options if o.clears]
    if not clearing:
        why = "; ".join(o.said for o in options)
        log(f"sampler auto: TPE on {device_key}: {why} (a model is used from tau "
            f"{AUTO_MIN_TAU}, or on a new device where its siblings' first configs beat "
            "random draws)")
        short = options[0].said.split(" has ", 1)[1] if len(options) == 1 else \
            f"no figure >= {AUTO_MIN_TAU}"
        return SamplerFactory(lambda: make_sampler("tpe", seed), f"tpe ({short})")
    best = max(clearing, key=lambda o: -1.0 if o.tau is None else o.tau)
    tau, record = best.tau, best.record
    if best.trained:
        log(f"sampler auto: {_what(record)} ranks each space on {device_key} (held-out tau "
            f"{tau:.2f} >= {AUTO_MIN_TAU})")
        return SamplerFactory(lambda: ModelSampler(best.model, seed=seed or 0, log=log),
                              f"model {record.id} (held-out tau {tau:.2f})")
    by_tau = tau is not None and tau >= AUTO_MIN_TAU
    why = f"{tau:.2f}" + (f" >= {AUTO_MIN_TAU}" if by_tau else "")
    if best.first is not None:
        first, rand, k = best.first
        why += (f"; their first {k} configs came within {100 * first:.1f}% of the optimum, "
                f"{k} random draws within {100 * rand:.1f}%")
    log(f"sampler auto: {_what(record)} ranks each space on {device_key}, a device it never "
        f"trained on, by other devices' measurements of the same configs (their order ranked "
        f"the devices it trained on at tau {why}, each left out); a study whose candidates no "
        "other device measured gets TPE")
    short = f"{tau:.2f}" + ("" if by_tau or best.first is None else
                            f", its first {best.first[2]} configs beat random draws")
    return SamplerFactory(lambda: SiblingsOrTpe(best.model, seed=seed or 0, log=log),
                          f"model {record.id} (siblings' zero-shot tau {short}; TPE for a "
                          "study they measured none of)")
