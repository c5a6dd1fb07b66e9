"""A kernel's source for its page: the stored one of a best kernel, or rendered now by the
same lowering and renderer the launch used; highlighted by Pygments when it is installed."""

from __future__ import annotations

from typing import Any


def _kind(device_key: Any) -> str | None:
    """The kind of device a stored key names (``kernels.device_kind``); None for a key that
    names none."""
    from kernels import device_kind

    try:
        return device_kind(str(device_key))
    except ValueError:
        return None


def kernel_source(data: dict[str, Any]) -> tuple[str | None, str]:
    """The kernel's source: the stored one for a best kernel, else rendered now from its
    structure and config (the same lowering and renderer the launch used)."""
    if data["best"] is not None and data["best"]["source"]:
        return data["best"]["source"], "stored with the best kernel"
    kind = _kind(data["device_key"])
    try:
        from kernels import DEVICE_KINDS, get_device
        from search import from_obj

        if kind not in DEVICE_KINDS:
            return None, f"no renderer for {data['device_key']} (a recorded space's timings)"
        device = get_device(kind)
        config = {k: int(v) for k, v in (data["config"] or {}).items()}
        plan = device.lower(from_obj(data["structure"]), config, str(data["program"]))
        return device.render(plan), f"rendered now for {kind} (not a best kernel, so not stored)"
    except Exception as err:  # noqa: BLE001 - shown on the page
        return None, f"could not render the source: {type(err).__name__}: {err}"


def highlighted(source: str, device_key: str) -> str | None:
    """The source as highlighted HTML (None without Pygments: the page shows it plain)."""
    try:
        from markupsafe import Markup
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import CppLexer, CudaLexer
    except ImportError:
        return None
    lexer = CudaLexer() if _kind(device_key) == "cuda" else CppLexer()
    # Pygments escapes the source itself; the markup is safe to insert
    return Markup(highlight(source, lexer, HtmlFormatter(cssclass="hl", linenos="table")))
