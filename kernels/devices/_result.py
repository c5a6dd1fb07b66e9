"""What an isolated job comes back as (``RunResult``), and how a dead worker's exit is said."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

from ._status import OK


@dataclass
class RunResult:
    """Outcome of one isolated job. payload: outputs, timing (Timing.as_dict), errors, log."""

    status: str
    message: str
    payload: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == OK


def _signal_text(code: int | None) -> str:
    if code is None:
        return "exit code unknown"
    if code < 0:
        try:
            sig = signal.Signals(-code)
            return f"signal {sig.name} ({signal.strsignal(sig) or ''})".replace(" ()", "")
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
