"""`tuner dashboard`'s bind rules and its cluster page: loopback unless asked, and the Ray
cluster's nodes, measurement slots and search workers through a stand-in for Ray's state API
answering like a two-node cluster (and one that does not answer).  The page against a real
cluster is an opt-in browser test (test_dashboard_browser.py)."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("starlette", reason="the dashboard needs: pip install -e '.[dashboard]'")
pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")

with warnings.catch_warnings():  # Starlette 1.x would rather have httpx's fork httpx2
    warnings.filterwarnings("ignore", message=".*httpx2")
    from starlette.testclient import TestClient

from test_dashboard import fill  # noqa: E402  (tests/tuner is on sys.path)

from tuner.dashboard import RemoteBindRefused, check_host, create_app  # noqa: E402
from tuner.dashboard.cluster import ClusterView  # noqa: E402


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> tuple[str, dict]:
    url = f"sqlite:///{tmp_path_factory.mktemp('dash') / 'tuner.db'}"
    return url, fill(url, xss=False)


@pytest.fixture(scope="module")
def client(filled) -> TestClient:
    with TestClient(create_app(filled[0])) as c:
        yield c


def test_binding_is_local_unless_asked():
    assert check_host("127.0.0.1", explicit=False) is None
    assert check_host("::1", explicit=False) is None
    assert check_host("localhost", explicit=False) is None
    with pytest.raises(RemoteBindRefused):
        check_host("0.0.0.0", explicit=False)
    assert "warning" in check_host("0.0.0.0", explicit=True)


def test_cluster_page_without_an_address_says_so(client):
    page = client.get("/cluster").text
    assert "No Ray cluster given" in page and "--address" in page


class FakeState:
    """ray.util.state's list functions, as they answer for a two-node cluster."""

    def list_nodes(self, **kw):
        return [{"node_id": "n1" * 10, "node_ip": "10.0.0.1", "is_head_node": True,
                 "state": "ALIVE", "resources_total": {"CPU": 16, "GPU": 2, "memory": 2**34}},
                {"node_id": "n2" * 10, "node_ip": "10.0.0.2", "is_head_node": False,
                 "state": "ALIVE", "resources_total": {"CPU": 8}}]

    def list_actors(self, filters, **kw):
        assert filters == [("class_name", "=", "MeasureSlot")]
        return [{"actor_id": "a1", "state": "ALIVE", "node_id": "n1" * 10, "pid": 42,
                 "required_resources": {"GPU": 1}}]

    def list_tasks(self, filters, **kw):
        return [{"task_id": "t1", "name": "MeasureSlot.trial", "actor_id": "a1",
                 "node_id": "n1" * 10, "state": "RUNNING"},
                {"task_id": "t2", "name": "run_and_verify", "func_or_class_name":
                 "run_and_verify", "node_id": "n2" * 10, "worker_pid": 7, "state": "RUNNING"}]


def test_cluster_page_lists_nodes_slots_and_search_workers(filled):
    view = ClusterView("ray://head:10001", state=FakeState(),
                       dashboard_url=lambda a: "http://head:8265")
    with TestClient(create_app(filled[0], address="ray://head:10001", cluster=view)) as c:
        snap = c.get("/api/cluster").json()
        page = c.get("/cluster").text
    assert [n["gpus"] for n in snap["nodes"]] == [2, 0]
    assert snap["slots"][0]["doing"] == "MeasureSlot.trial"
    assert snap["slots"][0]["node"] == "10.0.0.1"
    assert [t["name"] for t in snap["tasks"]] == ["run_and_verify"]
    assert "http://head:8265" in page and "10.0.0.2" in page


def test_cluster_that_does_not_answer_is_shown_not_raised(filled):
    class Down:
        def list_nodes(self, **kw):
            raise ConnectionError("no cluster at ray://nowhere:1")

    view = ClusterView("ray://nowhere:1", state=Down(), dashboard_url=lambda a: None)
    with TestClient(create_app(filled[0], address="ray://nowhere:1", cluster=view)) as c:
        r = c.get("/cluster")
    assert r.status_code == 200 and "ConnectionError" in r.text
