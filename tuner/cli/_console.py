"""What the commands print while they work: progress on stderr.

``Progress`` is the one progress display: a tqdm bar per phase when stderr is a terminal,
plain lines otherwise (logs, CI, a pipe), nothing when disabled (``--json``, ``--quiet``).
Times and configs are written by ``tuner.formatting``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from kernels import OK

from ..formatting import config_text, ms

if TYPE_CHECKING:
    from tqdm import tqdm

#: the search progress line of `tuner launch` (`tuner search` passes its own)
SEARCH_LINE = "states {states:,}  verified {verified}  {elapsed_s:.1f}s"


class Progress:
    """Progress of the search and of the tuning trials, and log lines between them.

    On a terminal each phase (``search NAME``, ``tune NAME``) gets a tqdm bar, replaced when
    the next phase starts; otherwise every update is one line on stderr.
    """

    def __init__(self, enabled: bool = True, search_line: str = SEARCH_LINE) -> None:
        self.enabled = enabled
        self.search_line = search_line
        self.tty = sys.stderr.isatty()
        self.bar: tqdm | None = None

    def log(self, message: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)

    def _bar(self, desc: str, unit: str) -> tqdm:
        if self.bar is not None and self.bar.desc == desc:
            return self.bar
        self.close()
        from tqdm import tqdm

        self.bar = tqdm(desc=desc, total=None, unit=unit, file=sys.stderr, leave=False)
        return self.bar

    def search(self, program: str, info: dict[str, Any]) -> None:
        """A search's progress (``info``: states, verified, elapsed_s); ``program`` may be
        empty when the command searches only one."""
        if not self.enabled:
            return
        line = self.search_line.format(**info)
        what = f"search {program}".rstrip()
        if self.tty:
            self._bar(what, " states").set_postfix_str(line)
        else:
            print(f"{what}: {line}", file=sys.stderr, flush=True)

    def trial(self, program: str, structure_hash: str, res: dict[str, Any]) -> None:
        """One measured trial of a tuning study (``res``: status, median_s, config)."""
        if not self.enabled:
            return
        t = res.get("median_s")
        what = ms(t) if res["status"] == OK and t else res["status"]
        config = config_text(res.get("config"))
        if self.tty:
            bar = self._bar(f"tune {program}", " trials")
            bar.update(1)
            bar.set_postfix_str(f"{config}: {what}")
        else:
            print(f"tune {program} [{structure_hash[:10]}] {config}: {what}",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
