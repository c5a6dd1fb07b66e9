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

from .. import formatting
from . import graphsvg
from .cluster import ClusterView
from .params import BadInput, not_found, path_id, query_id, query_text
from .progress import all_jobs, job_progress
from .reader import Reader
from .source import highlighted, kernel_source
from .tables import FAILURES, largest_id
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
                       optuna_dashboard=optuna_dashboard, failure_statuses=FAILURES)

    largest = largest_id(reader.engine)  # a larger id names no row

    async def run(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    def page(request: Request, name: str, status: int = 200, **context: Any) -> Response:
        return templates.TemplateResponse(request, name, context, status_code=status)

    async def bad_input(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, BadInput)
        if request.url.path.startswith("/api/"):
            return api({"error": exc.message}, exc.status)
        return page(request, "missing.html", exc.status,
                    title="not found" if exc.status == 404 else "bad request",
                    message=exc.message)

    # -- jobs ---------------------------------------------------------------------------

    def jobs_data() -> dict:
        return {"jobs": all_jobs(reader), "now": iso(datetime.now(timezone.utc))}

    async def jobs_page(request: Request) -> Response:
        return page(request, "jobs.html", title="jobs", data=await run(jobs_data))

    async def jobs_api(request: Request) -> Response:
        return api(await run(jobs_data))

    def job_data(job_id: int) -> dict:
        job = reader.job(job_id)
        if job is None:
            raise not_found(f"job {job_id}")
        prefixes = reader.job_program_hashes([job_id]).get(job_id, [])
        progress, rows = job_progress(reader, job, prefixes, optuna=True)
        stats = reader.search_stats(job_id)
        for r in rows:
            states, shards = stats.get(r.program_hash[:16], (None, 0))
            r.search_states, r.search_shards = states, shards
        return {"job": progress, "timings": job["timings"],
                "programs": [r.as_dict() for r in rows]}

    async def job_page(request: Request) -> Response:
        data = await run(job_data, path_id(request, "job_id", "job", largest))
        return page(request, "job.html", title=f"job {data['job']['job_key']}", data=data)

    async def job_api(request: Request) -> Response:
        return api(await run(job_data, path_id(request, "job_id", "job", largest)))

    # -- programs -------------------------------------------------------------------------

    def program_data(program_id: int) -> dict:
        rows = reader.programs(ids=[program_id])
        if not rows:
            raise not_found(f"program {program_id}")
        return {"programs": [rows[0].as_dict()]}

    async def program_page(request: Request) -> Response:
        data = await run(program_data, path_id(request, "program_id", "program", largest))
        return page(request, "program.html", title=data["programs"][0]["name"], data=data)

    async def program_api(request: Request) -> Response:
        return api(await run(program_data, path_id(request, "program_id", "program", largest)))

    def program_device(request: Request) -> tuple[int, str]:
        return (path_id(request, "program_id", "program", largest),
                str(query_text(request, "device", required=True)))

    def series_data(pid: int, device: str) -> dict:
        if not reader.has_program(pid):
            raise not_found(f"program {pid}")
        return reader.series(pid, device)

    async def series_api(request: Request) -> Response:
        return api(await run(series_data, *program_device(request)))

    predictions: dict[tuple, dict] = {}  # (program, device, ok timings there) -> answer

    def predicted_data(pid: int, device: str) -> dict:
        """The cost model's predictions, recomputed only when new timings arrived there."""
        from .predicted import predicted_vs_measured

        version = (pid, device, series_data(pid, device).get("trials"))
        if version not in predictions:
            if len(predictions) > 64:
                predictions.clear()
            predictions[version] = predicted_vs_measured(reader.engine, pid, device)
        return predictions[version]

    async def predicted_api(request: Request) -> Response:
        return api(await run(predicted_data, *program_device(request)))

    # -- kernels --------------------------------------------------------------------------

    def kernel_data(trial_id: int) -> dict:
        data = reader.kernel(trial_id)
        if data is None:
            raise not_found(f"kernel (trial) {trial_id}")
        data["drawings"] = graphsvg.drawings(data["structure"])
        data["source"], data["source_note"] = kernel_source(data)
        return data

    async def kernel_page(request: Request) -> Response:
        data = await run(kernel_data, path_id(request, "trial_id", "kernel (trial)", largest))
        shown = highlighted(data["source"], data["device_key"]) if data["source"] else None
        return page(request, "kernel.html", title=f"kernel {data['structure_hash'][:12]}",
                    k=data, highlighted=shown)

    async def kernel_api(request: Request) -> Response:
        data = await run(kernel_data, path_id(request, "trial_id", "kernel (trial)", largest))
        data.pop("drawings")
        return api(data)

    # -- failures -------------------------------------------------------------------------

    def failure_filters(request: Request) -> dict:
        return {"status": query_text(request, "status", choices=FAILURES),
                "program": query_text(request, "program"),
                "device": query_text(request, "device"), "q": query_text(request, "q")}

    def failures_data(filters: dict, before: int | None) -> dict:
        return reader.failures(status=filters["status"], program=filters["program"],
                               device=filters["device"], text_filter=filters["q"],
                               before=before)

    async def failures_page(request: Request) -> Response:
        filters = failure_filters(request)
        data = await run(failures_data, filters, query_id(request, "before", largest))
        return page(request, "failures.html", title="failures", data=data,
                    filters={k: v or "" for k, v in filters.items()})

    async def failures_api(request: Request) -> Response:
        return api(await run(failures_data, failure_filters(request),
                             query_id(request, "before", largest)))

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

    app = Starlette(routes=routes, middleware=[Middleware(SecurityHeaders)], lifespan=lifespan,
                    exception_handlers={BadInput: bad_input})
    app.state.reader = reader
    return app
