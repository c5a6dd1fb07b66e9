"""Every route of `tuner dashboard` answers any input with a page, a 404 or a 400, never a 500:
a property-based test (Hypothesis) over the app's own route table, so a route added later is
driven too, with generated path parameters (ids of real rows, out-of-range and negative
numbers, non-ASCII digits, any text) and query strings (the parameters the pages read, unknown
ones, malformed percent-escapes, NUL), through Starlette's TestClient against a small real
database written by db's own helpers."""

from __future__ import annotations

import re
import warnings
from urllib.parse import quote, urlencode

import pytest

pytest.importorskip("starlette", reason="the dashboard needs: pip install -e '.[dashboard]'")
pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")
pytest.importorskip("hypothesis", reason="the fuzz test needs: pip install hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from starlette.routing import Mount, Route  # noqa: E402

with warnings.catch_warnings():  # Starlette 1.x would rather have httpx's fork httpx2
    warnings.filterwarnings("ignore", message=".*httpx2")
    from starlette.testclient import TestClient

from test_dashboard import DEVICE, fill  # noqa: E402  (tests/tuner is on sys.path)

import db  # noqa: E402
from tuner.dashboard import create_app  # noqa: E402

PARAM = re.compile(r"{([^}:]+)(?::[^}]+)?}")
QUERY_KEYS = ("device", "status", "program", "q", "before")  # what the pages read


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'tuner.db'}"
    ids = fill(url)
    with TestClient(create_app(url), raise_server_exceptions=False) as client:
        yield client, ids


def templates(app) -> list[str]:
    """Every path the app routes, with ``{param}`` placeholders (a mount's files as one)."""
    out = []
    for r in app.routes:
        if isinstance(r, Route) and "GET" in (r.methods or ()):
            out.append(r.path)
        elif isinstance(r, Mount):
            out += [r.path + "/{path}", r.path + "/"]
    return out


def test_the_route_table_is_all_covered(site):
    client, _ = site
    found = templates(client.app)
    assert "/jobs/{job_id}" in found and "/api/programs/{program_id}/series" in found
    assert "/static/{path}" in found and len(found) >= 18


def _values(ids: dict) -> st.SearchStrategy[str]:
    real = sorted({ids["job"], *ids["programs"], *ids["trials"], ids["xss_program"]})
    return st.one_of(
        st.sampled_from([str(i) for i in real]),
        st.integers(min_value=-2**70, max_value=2**70).map(str),
        st.sampled_from(["0", "00", "-0", "1e3", "0x1", " 1", "1 ", "١", "²", "9" * 30,
                         str(2**63 - 1), str(2**63), str(2**31), "..", ".", "%", "dashboard.js",
                         "../app.py", "chart.umd.min.js"]),
        st.text(st.characters(exclude_categories=("Cs",)), max_size=40),
    )


def _query(ids: dict) -> st.SearchStrategy[str]:
    value = st.one_of(
        st.sampled_from([DEVICE, "cpu", "softmax_rows", "compile_error", "ok", "timeout",
                         "node_lost", "", "%", "_", "\x00", "a\x00b", "x" * 5000,
                         *db.MEASUREMENT_STATUSES]),
        _values(ids))
    key = st.one_of(st.sampled_from(QUERY_KEYS), st.text(max_size=8))
    pairs = st.lists(st.tuples(key, value), max_size=4).map(
        lambda kv: urlencode([(k, v.encode("utf-8", "surrogatepass")) for k, v in kv]))
    raw = st.sampled_from(["%zz", "device", "device=%ff%fe", "before=%00", "&&&", "=x",
                           "device=a&device=b", "q=%25&before=-1", "before=1.5", "a=b=c"])
    return st.one_of(pairs, raw)


def _drive(client, ids: dict, examples: int) -> None:
    """``examples`` generated requests, each to a route of ``client.app``; none may be a 500."""

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def request_answers(data):
        template = data.draw(st.sampled_from(templates(client.app)), label="route")
        path = PARAM.sub(lambda _: quote(data.draw(_values(ids), label="param"), safe=""),
                         template)
        query = data.draw(_query(ids), label="query")
        r = client.get(path + ("?" + query if query else ""))
        assert r.status_code < 500, (path, query, r.text[-2000:])
        assert r.status_code in (200, 204, 400, 404), (path, query, r.status_code)

    request_answers()


def test_no_route_answers_500(site):
    client, ids = site
    _drive(client, ids, 1000)


def test_no_route_answers_500_on_postgresql(pg_url):
    """The same on PostgreSQL, which refuses what SQLite lets through (NUL in a text)."""
    ids = fill(pg_url)
    with TestClient(create_app(pg_url), raise_server_exceptions=False) as client:
        _drive(client, ids, 300)


def test_bad_ids_and_filters_are_answered_in_words(site):
    """The cases the issue names: out of range, negative, not a number, unknown, odd."""
    client, ids = site
    for path in ("/jobs/99999999999999999999999", "/jobs/-1", "/jobs/abc", "/jobs/١",
                 "/programs/999999", "/kernels/%00", "/api/jobs/99999999999999999999999",
                 f"/api/programs/999999/series?device={quote(DEVICE)}"):
        r = client.get(path)
        assert r.status_code == 404, path
    page = client.get("/jobs/99999999999999999999999")
    assert "There is no job 99999999999999999999999 in this database" in page.text
    assert client.get("/api/jobs/-1").json() == {"error": "There is no job -1 in this database."}
    for path in (f"/api/programs/{ids['programs'][0]}/series",
                 f"/api/programs/{ids['programs'][0]}/series?device=%00",
                 "/failures?before=99999999999999999999999", "/failures?before=²",
                 "/api/failures?status=nonsense", "/api/failures?q=" + "x" * 5000):
        assert client.get(path).status_code == 400, path
    assert "give ?device=" in client.get(f"/api/programs/{ids['programs'][0]}/series").text
