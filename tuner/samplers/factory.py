"""A launch's sampler for one device: the registry's kind, with the cost model found for it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .registry import SAMPLERS, make_sampler

if TYPE_CHECKING:
    import db


def sampler_factory(name: str, seed: int | None, database: db.Database, device_key: str,
                    log: Callable[[str], None] = lambda _msg: None) -> Callable[[], Any]:
    """What a launch's studies on ``device_key`` ask for a fresh sampler: for ``model``, the
    cost model stored for the device (TPE, said in ``log``, where none is trained)."""
    if not SAMPLERS[name].model:
        return lambda: make_sampler(name, seed)
    from costmodel import model_for

    from .model import ModelSampler

    found = model_for(database, device_key)
    if found is None:
        log(f"sampler model: no trained cost model for {device_key} in the database "
            "(`tuner model train`); tuning with TPE instead")
        return lambda: make_sampler(name, seed)
    model, record = found
    log(f"sampler model: cost model {record.id} ({record.kind}, trained on "
        f"{record.trained_on.get('rows', '?')} measurements) ranks each space")
    return lambda: ModelSampler(model, seed=seed or 0)
