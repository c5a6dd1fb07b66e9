"""``tuner dashboard``: a live, read-only web page over a tuner database and its Ray cluster.

    from tuner.dashboard import create_app, serve
    serve("sqlite:///./tuner.db")                 # http://127.0.0.1:8765/

Pages: jobs, a job (programs × devices, best-so-far and scatter charts), a kernel (the µGraph
drawn, its config, source, timings, verdict), failures, cluster.  See docs/dashboard.md.
Needs the ``dashboard`` extra (Starlette, Jinja2, uvicorn, Pygments).

Inside: ``tables`` (db's and Optuna's tables, the read-only engine), ``reader`` (the queries),
``counts`` and ``series`` (what is kept up to date incrementally), ``views`` (what pages show),
``progress`` (a job's progress and plan), ``params`` (request input), ``app`` (the routes;
the templates draw every table).
"""

from __future__ import annotations

import ipaddress
import sys
from typing import Any

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "RemoteBindRefused", "check_host", "create_app",
           "is_local", "serve"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


class RemoteBindRefused(ValueError):
    """A non-local address was asked for without saying so explicitly."""


def is_local(host: str) -> bool:
    """A loopback address (or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_host(host: str, explicit: bool) -> str | None:
    """None for a loopback address; the warning to print for another one given explicitly;
    ``RemoteBindRefused`` for another one that was not."""
    if is_local(host):
        return None
    if not explicit:
        raise RemoteBindRefused(
            f"refusing to serve the dashboard on {host}, which is not a loopback address, "
            "unless asked explicitly (tuner dashboard --host ADDRESS)")
    return (f"warning: serving on {host}: anyone who can reach this port can read every job, "
            "program, kernel source and failure message in the database (the dashboard has no "
            "login); prefer the default 127.0.0.1 with an SSH tunnel")


def create_app(url: str | None = None, **kwargs: Any) -> Any:
    """The ASGI app (``app.create_app``), imported here lazily: Starlette is an extra."""
    from .app import create_app as make

    return make(url, **kwargs)


def serve(url: str | None = None, *, address: str | None = None, host: str = DEFAULT_HOST,
          port: int = DEFAULT_PORT, explicit_host: bool = False, open_browser: bool = False,
          optuna_dashboard: str | None = None, log: Any = None) -> None:
    """Serve the dashboard until interrupted (see ``check_host`` for ``explicit_host``)."""
    import uvicorn

    from .tables import shown_url

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    warning = check_host(host, explicit_host)
    app = create_app(url, address=address, optuna_dashboard=optuna_dashboard)
    if warning:
        log(warning)
    shown_host = f"[{host}]" if ":" in host else host
    where = f"http://{shown_host}:{port}/"
    log(f"tuner dashboard on {where} reading {shown_url(url)} (read-only)"
        + (f", Ray cluster {address}" if address else "") + "; Ctrl-C to stop")
    if open_browser:
        import threading
        import webbrowser

        threading.Timer(1.0, webbrowser.open, args=(where,)).start()
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
