"""`tuner dashboard` in a real headless browser (Debian's chromium driven by Playwright's Python
API) over a database filled by a real `tuner launch`: the jobs page lists the job, the job page
shows its programs and a best-so-far chart, a kernel page shows the source, names holding
``<script>`` render as text (no dialog), and while a second launch runs the progress shown
changes without a reload.

One launch, one server and one browser for the module (about a minute on 2 cores).  Each test
takes a screenshot of its page; ``TUNER_DASHBOARD_SCREENSHOTS=docs/img`` keeps them there
(that is how docs/dashboard.md's pictures are made).  Skipped, saying why, without chromium
or Playwright (``.ci/run`` installs chromium with apt-get).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

sync_api = pytest.importorskip("playwright.sync_api",
                               reason="the browser tests need: pip install playwright")
CHROMIUM = os.environ.get("TUNER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)",
                allow_module_level=True)

import db  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TUNER = [sys.executable, "-m", "tuner.cli"]
XSS = "<script>alert(1)</script>"
JOB = """
programs:
  - name: softmax_rows
    set: {{rows: {rows}, cols: 64}}
  - name: rmsnorm_residual
    set: {{X: {rows}x64, R: {rows}x64}}
search:
  time_limit_s: 60
tuning:
  trials_per_structure: {trials}
  structures: {structures}
  seed: 0
devices: [cpu]
cluster:
  workers: 1
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_job(path: Path, rows: int, trials: int, structures: int) -> Path:
    path.write_text(JOB.format(rows=rows, trials=trials, structures=structures))
    return path


def _launch(job: Path, url: str) -> subprocess.Popen:
    return subprocess.Popen([*TUNER, "launch", str(job), "--db", url, "--quiet"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _add_hostile_names(url: str) -> None:
    """A job, a program and a failure message holding markup, beside the real launch's."""
    with db.connect(url) as database:
        job = database.start_job(f"{XSS}:0", f"/tmp/{XSS}.yaml")
        database.finish_job(job.id, "failed")
        database.record_program("f" * 64, {"X": [1, 1]}, "float32", XSS, {"ops": []})
        entry = database.history(database.programs()[0].program_hash)[0]
        tid = database.record_trial(entry.structure_id, entry.device_key, {"g0": 3, "split": 7})
        database.record_measurement(tid, "runtime_error", median_s=None, spread_s=None,
                                    samples=None, max_error=None, host="vm",
                                    message=f"worker said {XSS} <img src=x onerror=alert(2)>")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dashboard")
    url = f"sqlite:///{tmp / 'tuner.db'}"
    first = _launch(_write_job(tmp / "first.yaml", 32, 4, 1), url)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    _add_hostile_names(url)
    port = _free_port()
    server = subprocess.Popen([*TUNER, "dashboard", "--db", url, "--port", str(port)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"the dashboard did not start: {server.communicate()[1][-2000:]}")
            time.sleep(0.2)
    yield {"url": url, "base": base, "tmp": tmp}
    server.terminate()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM,
                              args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    """A page that records every dialog (alert) and script error; none may happen."""
    pg = browser.new_page(viewport={"width": 1280, "height": 800})
    pg.dialogs, pg.errors = [], []
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    yield pg
    assert pg.dialogs == [], f"a dialog fired: {pg.dialogs}"
    assert pg.errors == [], f"script errors: {pg.errors}"
    pg.close()


def shot(pg, site, name: str) -> None:
    where = os.environ.get("TUNER_DASHBOARD_SCREENSHOTS")
    folder = (REPO / where) if where else site["tmp"]
    folder.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(folder / f"dashboard-{name}.png"), full_page=True)


def test_jobs_page_lists_the_job(page, site):
    page.goto(site["base"] + "/")
    row = page.locator("#jobs tbody tr", has_text="first:")
    sync_api.expect(row).to_have_count(1)
    sync_api.expect(row.locator(".status")).to_have_text("finished")
    sync_api.expect(row.locator('[data-field="programs"]')).to_have_text("2 / 2")
    sync_api.expect(page.locator("#live")).to_be_visible()  # the poll has answered
    shot(page, site, "jobs")


def test_job_page_shows_programs_and_a_best_so_far_chart(page, site):
    page.goto(site["base"] + "/")
    page.locator("#jobs a", has_text="first:").click()
    rows = page.locator("#programs tbody tr")
    sync_api.expect(rows.filter(has_text="softmax_rows")).to_have_count(1)
    sync_api.expect(rows.filter(has_text="rmsnorm_residual")).to_have_count(1)
    cards = page.locator(".chart-card[data-points]")
    sync_api.expect(cards).to_have_count(2)
    points = page.evaluate("""() => [...document.querySelectorAll('.best-chart canvas')]
        .map((c) => Chart.getChart(c).data.datasets[0].data.length)""")
    assert len(points) == 2 and all(n >= 2 for n in points), points
    # the cost model's caption, as the server wrote it: the launch retrained a model at its
    # end (sampler auto's loop), so the caption names it and its held-out Kendall tau
    sync_api.expect(page.locator(".chart-card .pred-note").first).to_contain_text(
        "Kendall tau")
    shot(page, site, "job")


def test_kernel_page_shows_the_source(page, site):
    page.goto(site["base"] + "/")
    page.locator("#jobs a", has_text="first:").click()
    page.locator("#programs a[href^='/kernels/']").first.click()
    sync_api.expect(page.locator("h1")).to_contain_text("Kernel")
    sync_api.expect(page.locator("#source")).to_contain_text("#include")
    sync_api.expect(page.locator("#verdict")).to_contain_text("equivalent")
    assert page.locator(".graph svg").count() >= 2  # kernel graph + block graph
    shot(page, site, "kernel")


def test_names_holding_script_render_as_text(page, site):
    page.goto(site["base"] + "/")
    sync_api.expect(page.locator("#jobs tbody")).to_contain_text(f"{XSS}:0")
    sync_api.expect(page.locator("#jobs tbody")).to_contain_text(f"/tmp/{XSS}.yaml")
    page.goto(site["base"] + "/failures")
    sync_api.expect(page.locator("#failures tbody")).to_contain_text(
        f"worker said {XSS} <img src=x onerror=alert(2)>")
    assert page.locator("#failures img").count() == 0
    page.select_option("select[name=status]", "runtime_error")
    page.locator("form.filters button").click()
    sync_api.expect(page.locator("#failures tbody tr")).to_have_count(1)
    shot(page, site, "failures")
    xss_program = page.evaluate("""async () => {
        const r = await fetch('/api/jobs'); return (await r.json()).jobs.length; }""")
    assert xss_program == 2
    page.wait_for_timeout(300)  # let any injected script have its chance


def test_cluster_page_without_an_address_says_so(page, site):
    page.goto(site["base"] + "/cluster")
    sync_api.expect(page.locator("#no-cluster")).to_contain_text("No Ray cluster given")
    shot(page, site, "cluster")


def test_progress_changes_without_a_reload_while_a_launch_runs(page, site):
    page.goto(site["base"] + "/")
    page.evaluate("window.__notReloaded = 42")
    second = _launch(_write_job(site["tmp"] / "second.yaml", 64, 6, 2), site["url"])
    try:
        row = page.locator("#jobs tbody tr", has_text="second:")
        sync_api.expect(row).to_have_count(1, timeout=120_000)
        trials = row.locator('[data-field="trials"]')
        first_seen = trials.inner_text()
        page.wait_for_function(
            """(before) => { const r = [...document.querySelectorAll('#jobs tbody tr')]
                 .find((tr) => tr.textContent.includes('second:'));
               return r && r.querySelector('[data-field="trials"]').textContent !== before; }""",
            arg=first_seen, timeout=120_000)
        assert page.evaluate("window.__notReloaded") == 42
        # the job page follows it too, and keeps following it to the end
        page.locator("#jobs a", has_text="second:").click()
        page.evaluate("window.__notReloaded = 43")
        shot(page, site, "job-running")
        out, err = second.communicate(timeout=300)
        assert second.returncode == 0, err[-3000:]
        sync_api.expect(page.locator('#job-facts [data-field="status"]')).to_have_text(
            "finished", timeout=30_000)
        assert page.evaluate("window.__notReloaded") == 43
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()


def test_cluster_page_with_a_ray_cluster(browser, site):
    """With TUNER_TEST_RAY_ADDRESS (a running cluster with Ray's dashboard, e.g. from
    `ray start --head`): a dashboard started with --address lists its nodes through Ray's state
    API, and, while a launch runs on the cluster, its measurement slot."""
    address = os.environ.get("TUNER_TEST_RAY_ADDRESS")
    if not address:
        pytest.skip("needs a Ray cluster: TUNER_TEST_RAY_ADDRESS=host:port (ray start --head)")
    port = _free_port()
    server = subprocess.Popen([*TUNER, "dashboard", "--db", site["url"], "--port", str(port),
                               "--address", address], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    job = _write_job(site["tmp"] / "on_cluster.yaml", 16, 8, 2)
    launch = subprocess.Popen([*TUNER, "launch", str(job), "--db", site["url"], "--quiet",
                               "--address", address], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    pg = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                urllib.request.urlopen(base + "/healthz", timeout=2).close()
                break
            except OSError:
                time.sleep(0.2)
        pg.goto(base + "/cluster")
        sync_api.expect(pg.locator("#nodes tbody tr:not(.empty)")).not_to_have_count(0, timeout=30_000)
        sync_api.expect(pg.locator("#slots tbody tr:not(.empty)")).not_to_have_count(0, timeout=120_000)
        assert pg.locator("#cluster-error").is_hidden()
        shot(pg, site, "cluster-ray")
    finally:
        pg.close()
        for proc in (launch, server):
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
