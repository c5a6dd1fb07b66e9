"""Predicted vs measured: the stored cost model's predictions for what a program x device
measured, with its rank correlation there.

Read-only like every query of the dashboard: the model comes from db's cost-model table, the
measurements from the first timing of each ok trial (at most ``limit``, newest first).  The
prediction lowers each measured config once to featurize it, so the result is cached per
(model, measurements) by the reader that calls this.
"""

from __future__ import annotations

import json
import math
from typing import Any

from sqlalchemy import Engine, desc, select

import db

from .tables import MEASURED, OK, M, P, S, T, models_t, programs_t

C = models_t.c

LIMIT = 1000


def predicted_vs_measured(engine: Engine, program_id: int, device_key: str,
                          limit: int = LIMIT) -> dict:
    """``{model, points, kendall_tau, mape, reason}`` and ``note``: the chart's caption,
    written here so that the page's script formats nothing."""
    out = _predicted(engine, program_id, device_key, limit)
    model, tau, reason = out["model"], out.get("kendall_tau"), out.get("reason")
    parts = [f"model {model['id']} ({model['kind']})"] if model else []
    if tau is not None:
        parts.append(f"Kendall tau {tau:.2f}")
    if reason:
        parts.append(reason)
    out["note"] = " · ".join(parts)
    return out


def _predicted(engine: Engine, program_id: int, device_key: str, limit: int) -> dict:
    import costmodel

    with engine.connect() as conn:
        row = conn.execute(
            select(C.id, C.kind, C.feature_version, C.weights, C.trained_on_json)
            .where(C.device_key.in_([device_key, db.ALL_DEVICES]))
            .order_by((C.device_key == device_key).desc(), desc(C.id))
            .limit(1)).first()
        if row is None or row.feature_version != costmodel.FEATURE_VERSION:
            return {"model": None, "reason": f"no trained cost model for {device_key} "
                    "(`tuner model train` makes one)", "points": []}
        rows = conn.execute(
            select(M.id, T.id.label("trial_id"), P.name, P.program_hash, S.structure_hash,
                   S.structure_json, T.config_json, M.median_s)
            .select_from(MEASURED.join(programs_t, P.id == S.program_id))
            .where(P.id == program_id, M.device_key == device_key, M.status == OK,
                   M.attempt == 0)
            .order_by(desc(M.id)).limit(limit)).all()
    model = costmodel.load_model(row.weights)
    graphs: dict[str, Any] = {}
    training = [db.TrainingRow(r.id, r.name, r.program_hash, r.structure_hash,
                               graphs.setdefault(r.structure_hash, json.loads(r.structure_json)),
                               json.loads(r.config_json), device_key, r.median_s)
                for r in rows]
    info = {"id": row.id, "kind": row.kind,
            "rows": json.loads(row.trained_on_json).get("rows")}
    try:
        samples = costmodel.samples_from_rows(training)
    except (KeyError, ValueError) as err:  # a device the table does not know, a bad graph
        return {"model": info, "reason": f"cannot featurize these trials: {err}",
                "points": []}
    if not samples:
        return {"model": info, "reason": "no ok timing here yet", "points": []}
    predicted = [float(q) for q in model.predict(samples)]
    scores = costmodel.evaluate([x.group for x in samples], [x.seconds for x in samples],
                                predicted)
    points = [{"trial": r.trial_id, "measured": r.median_s, "predicted": float(q)}
              for r, q in zip(rows, predicted, strict=True) if math.isfinite(q)]
    return {"model": info, "points": points,
            "kendall_tau": None if math.isnan(scores["kendall_tau"]) else scores["kendall_tau"],
            "mape": scores["mape"]}
