"""``tuner dashboard``: registered by tuner.cli with the other command families."""

from __future__ import annotations

import argparse

from db import DEFAULT_URL

from . import DEFAULT_HOST, DEFAULT_PORT


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dashboard", help="a live web page over the database (and Ray cluster)")
    p.add_argument("--db", metavar="URL", help=f"database URL (default {DEFAULT_URL})")
    p.add_argument("--address", help="the Ray cluster to show (as given to tuner launch)")
    p.add_argument("--host", help=f"address to bind (default {DEFAULT_HOST}; anything but "
                                  "a loopback address prints a warning)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default %(default)s)")
    p.add_argument("--open", action="store_true", help="open the page in a web browser")
    p.add_argument("--optuna-dashboard", metavar="URL",
                   help="where optuna-dashboard serves this database's studies, to link to")
    p.set_defaults(func=cmd_dashboard)


def cmd_dashboard(args: argparse.Namespace) -> int:
    from ..api import InputError

    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401

        from . import serve
    except ImportError as err:
        raise InputError(f"the dashboard needs its extra: pip install 'mugraph-tuner[dashboard]'"
                         f" ({err})") from None
    if not 0 <= args.port <= 65535:
        raise InputError(f"--port {args.port}: give a port 0-65535")
    link = args.optuna_dashboard
    if link and not link.startswith(("http://", "https://")):
        raise InputError(f"--optuna-dashboard {link!r}: give its http:// or https:// URL")
    from sqlalchemy.exc import OperationalError

    from . import RemoteBindRefused

    try:
        serve(args.db, address=args.address, host=args.host or DEFAULT_HOST, port=args.port,
              explicit_host=args.host is not None, open_browser=args.open,
              optuna_dashboard=args.optuna_dashboard)
    except RemoteBindRefused as err:
        raise InputError(str(err)) from None
    except OperationalError as err:  # words, and the URL without its password
        from .tables import shown_url

        why = str(err.orig or err).strip().splitlines()[0]
        raise InputError(f"cannot read the database {shown_url(args.db)}: {why}") from None
    except KeyboardInterrupt:
        pass
    return 0
