"""How a time or a config is written for a person: one rule for the CLI and the dashboard."""

from __future__ import annotations

import math
from typing import Any


def ms(seconds: float | None, unit: str = " ms", spec: str = ".3f") -> str:
    """``seconds`` in milliseconds (``ms(1.5e-5)`` is ``0.015 ms``); ``-`` for None or NaN.
    Table columns headed "ms" pass ``unit=""``."""
    if seconds is None or math.isnan(seconds):
        return "-"
    return f"{seconds * 1e3:{spec}}{unit}"


def config_text(config: dict[str, Any] | None) -> str:
    """A config as ``F=4 g0=8`` (sorted by name)."""
    return " ".join(f"{k}={v}" for k, v in sorted((config or {}).items()))


# what to do about a best whose timings could not settle it (docs/launch.md, "Uncertain bests")
SETTLE = ("tune again on a quiet machine (a new database, or more tuning.confirm finalists) "
          "to settle it")

__all__ = ["SETTLE", "config_text", "ms"]
