"""The dashboard's ASGI app (Starlette + Jinja2): pages rendered on the server, JSON APIs that
the pages poll to update themselves while a launch runs, static assets shipped in the package.

Read-only by construction: every route is GET (Starlette answers 405 to anything else), and the
database is read through ``reader.Reader``'s read-only engine.  Every table is drawn once, by
the templates here, with Jinja's autoescaping; while a launch runs ``dashboard.js`` fetches
the page again and swaps in the parts marked ``data-live`` (it builds no HTML from data and
formats nothing).  The Content-Security-Policy allows scripts from this server only, so an
injected ``<script>`` could not run even if it got through.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

import db

from .. import formatting
from . import graphsvg
from .cluster import ClusterView
from .progress import all_jobs, job_progress
from .reader import Reader
from .views import duration, iso, shapes_text, when

HERE = Path(__file__).resolve().parent
POLL_MS = 2000
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'")


# ------------------------------------------------------------------------------- formatting


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def api(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(_jsonable(data), status_code=status)


class SecurityHeaders(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: Any) -> Response:
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers.setdefault("Cache-Control", "no-store")
        return response


# ------------------------------------------------------------------------------- the app


def create_app(url: str | None = None, *, address: str | None = None,
               reader: Reader | None = None, cluster: ClusterView | None = None,
               optuna_dashboard: str | None = None) -> Starlette:
    """The dashboard over the database at ``url`` (and the Ray cluster at ``address``)."""
    reader = reader or Reader(url)
    cluster = cluster or ClusterView(address)
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    env = templates.env
    env.filters.update(ms=formatting.ms, config=formatting.config_text, when=when,
                       duration=duration, shapes=shapes_text)
    env.globals.update(db_url=reader.url, poll_ms=POLL_MS, cluster_address=address,
                       optuna_dashboard=optuna_dashboard,
                       failure_statuses=[s for s in db.MEASUREMENT_STATUSES if s != "ok"])

    async def run(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    def page(request: Request, name: str, status: int = 200, **context: Any) -> Response:
        return templates.TemplateResponse(request, name, context, status_code=status)

    def not_found(request: Request, what: str) -> Response:
        return page(request, "missing.html", 404, title="not found", what=what)

    def int_param(request: Request, name: str) -> int | None:
        try:
            return int(request.path_params[name])
        except (KeyError, ValueError):
            return None

    # -- jobs ---------------------------------------------------------------------------

    def jobs_data() -> dict:
        return {"jobs": all_jobs(reader), "now": iso(datetime.now(timezone.utc))}

    async def jobs_page(request: Request) -> Response:
        return page(request, "jobs.html", title="jobs", data=await run(jobs_data))

    async def jobs_api(request: Request) -> Response:
        return api(await run(jobs_data))

    def job_data(job_id: int) -> dict | None:
        job = reader.job(job_id)
        if job is None:
            return None
        prefixes = reader.job_program_hashes([job_id]).get(job_id, [])
        progress, rows = job_progress(reader, job, prefixes, optuna=True)
        stats = reader.search_stats(job_id)
        for r in rows:
            states, shards = stats.get(r.program_hash[:16], (None, 0))
            r.search_states, r.search_shards = states, shards
        return {"job": progress, "timings": job["timings"],
                "programs": [r.as_dict() for r in rows]}

    async def job_page(request: Request) -> Response:
        job_id = int_param(request, "job_id")
        data = None if job_id is None else await run(job_data, job_id)
        if data is None:
            return not_found(request, f"job {request.path_params.get('job_id')}")
        return page(request, "job.html", title=f"job {data['job']['job_key']}", data=data)

    async def job_api(request: Request) -> Response:
        job_id = int_param(request, "job_id")
        data = None if job_id is None else await run(job_data, job_id)
        return api(data) if data is not None else api({"error": "no such job"}, 404)

    # -- programs -------------------------------------------------------------------------

    def program_data(program_id: int) -> dict | None:
        rows = reader.programs(ids=[program_id])
        return None if not rows else {"programs": [rows[0].as_dict()]}

    async def program_page(request: Request) -> Response:
        pid = int_param(request, "program_id")
        data = None if pid is None else await run(program_data, pid)
        if data is None:
            return not_found(request, f"program {request.path_params.get('program_id')}")
        return page(request, "program.html", title=data["programs"][0]["name"], data=data)

    async def program_api(request: Request) -> Response:
        pid = int_param(request, "program_id")
        data = None if pid is None else await run(program_data, pid)
        return api(data) if data is not None else api({"error": "no such program"}, 404)

    async def series_api(request: Request) -> Response:
        pid = int_param(request, "program_id")
        device = request.query_params.get("device", "")
        if pid is None or not device:
            return api({"error": "give /api/programs/ID/series?device=KEY"}, 400)
        return api(await run(reader.series, pid, device))

    predictions: dict[tuple, dict] = {}  # (program, device, ok timings there) -> answer

    def predicted_data(pid: int, device: str) -> dict:
        """The cost model's predictions, recomputed only when new timings arrived there."""
        from .predicted import predicted_vs_measured

        version = (pid, device, reader.series(pid, device).get("trials"))
        if version not in predictions:
            if len(predictions) > 64:
                predictions.clear()
            predictions[version] = predicted_vs_measured(reader.engine, pid, device)
        return predictions[version]

    async def predicted_api(request: Request) -> Response:
        pid = int_param(request, "program_id")
        device = request.query_params.get("device", "")
        if pid is None or not device:
            return api({"error": "give /api/programs/ID/predicted?device=KEY"}, 400)
        return api(await run(predicted_data, pid, device))

    # -- kernels --------------------------------------------------------------------------

    def kernel_data(trial_id: int) -> dict | None:
        data = reader.kernel(trial_id)
        if data is None:
            return None
        data["drawings"] = graphsvg.drawings(data["structure"])
        data["source"], data["source_note"] = _source(data)
        return data

    async def kernel_page(request: Request) -> Response:
        trial_id = int_param(request, "trial_id")
        data = None if trial_id is None else await run(kernel_data, trial_id)
        if data is None:
            return not_found(request, f"kernel (trial) {request.path_params.get('trial_id')}")
        highlighted = _highlight(data["source"], data["device_key"]) if data["source"] else None
        return page(request, "kernel.html", title=f"kernel {data['structure_hash'][:12]}",
                    k=data, highlighted=highlighted)

    async def kernel_api(request: Request) -> Response:
        trial_id = int_param(request, "trial_id")
        data = None if trial_id is None else await run(kernel_data, trial_id)
        if data is None:
            return api({"error": "no such trial"}, 404)
        data.pop("drawings")
        return api(data)

    # -- failures -------------------------------------------------------------------------

    def failures_data(q: Any) -> dict:
        before = q.get("before")
        return reader.failures(status=q.get("status") or None, program=q.get("program") or None,
                               device=q.get("device") or None,
                               text_filter=q.get("q") or None,
                               before=int(before) if before and before.isdigit() else None)

    async def failures_page(request: Request) -> Response:
        q = request.query_params
        data = await run(failures_data, q)
        return page(request, "failures.html", title="failures", data=data,
                    filters={k: q.get(k, "") for k in ("status", "program", "device", "q")})

    async def failures_api(request: Request) -> Response:
        return api(await run(failures_data, request.query_params))

    # -- cluster --------------------------------------------------------------------------

    async def cluster_page(request: Request) -> Response:
        return page(request, "cluster.html", title="cluster",
                    data=await run(cluster.snapshot))

    async def cluster_api(request: Request) -> Response:
        return api(await run(cluster.snapshot))

    # -- misc -----------------------------------------------------------------------------

    async def pygments_css(request: Request) -> Response:
        try:
            from pygments.formatters import HtmlFormatter
        except ImportError:
            return Response("", media_type="text/css")
        css = HtmlFormatter(style="default").get_style_defs(".hl")
        return Response(css, media_type="text/css", headers={"Cache-Control": "max-age=3600"})

    async def health(request: Request) -> Response:
        await run(reader.ping)
        return PlainTextResponse("ok")

    routes = [
        Route("/", jobs_page, name="jobs"),
        Route("/jobs/{job_id}", job_page, name="job"),
        Route("/programs/{program_id}", program_page, name="program"),
        Route("/kernels/{trial_id}", kernel_page, name="kernel"),
        Route("/failures", failures_page, name="failures"),
        Route("/cluster", cluster_page, name="cluster"),
        Route("/api/jobs", jobs_api),
        Route("/api/jobs/{job_id}", job_api),
        Route("/api/programs/{program_id}", program_api),
        Route("/api/programs/{program_id}/series", series_api),
        Route("/api/programs/{program_id}/predicted", predicted_api),
        Route("/api/kernels/{trial_id}", kernel_api),
        Route("/api/failures", failures_api),
        Route("/api/cluster", cluster_api),
        Route("/pygments.css", pygments_css),
        Route("/healthz", health),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
        Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    def warm() -> None:
        """Read every aggregate once before serving (the first request after a start would
        otherwise pay for scanning all measurements; later ones read only new rows)."""
        try:
            all_jobs(reader)
            reader.programs(optuna=True)
        except Exception:  # noqa: BLE001 - a page will say what is wrong
            pass

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> Any:
        await run(warm)
        yield
        reader.close()

    app = Starlette(routes=routes, middleware=[Middleware(SecurityHeaders)], lifespan=lifespan)
    app.state.reader = reader
    return app


def _source(data: dict) -> tuple[str | None, str]:
    """The kernel's source: the stored one for a best kernel, else rendered now from its
    structure and config (the same lowering and renderer the launch used)."""
    if data["best"] is not None and data["best"]["source"]:
        return data["best"]["source"], "stored with the best kernel"
    try:
        from kernels import get_device
        from search import from_obj

        kind = "cpu" if str(data["device_key"]).startswith("cpu") else "cuda"
        device = get_device(kind)
        config = {k: int(v) for k, v in (data["config"] or {}).items()}
        plan = device.lower(from_obj(data["structure"]), config, str(data["program"]))
        return device.render(plan), f"rendered now for {kind} (not a best kernel, so not stored)"
    except Exception as err:  # noqa: BLE001 - shown on the page
        return None, f"could not render the source: {type(err).__name__}: {err}"


def _highlight(source: str, device_key: str) -> str | None:
    try:
        from markupsafe import Markup
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import CppLexer, CudaLexer
    except ImportError:
        return None
    lexer = CppLexer() if str(device_key).startswith("cpu") else CudaLexer()
    # Pygments escapes the source itself; the markup is safe to insert
    return Markup(highlight(source, lexer, HtmlFormatter(cssclass="hl", linenos="table")))
