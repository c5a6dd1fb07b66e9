// tuner dashboard: polls the JSON API of the page it is on and updates the page in place.
// Every value from the database goes into the DOM as textContent (never as HTML), so a name
// holding markup shows as text.
"use strict";

(function () {
  const body = document.body;
  const POLL = Number(body.dataset.pollMs || 2000);
  const charts = {};      // "pid|device" -> {best, scatter, trials, mode, param}
  let inFlight = false;

  // -- tiny DOM helpers ------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "dataset") Object.assign(node.dataset, v);
      else node.setAttribute(k, v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }
  function link(href, text) { return el("a", {href: href}, text); }
  function ms(s) { return s === null || s === undefined ? "-" : (s * 1e3).toFixed(3); }
  function when(iso) { return iso ? iso.replace("T", " ").slice(0, 19) : "-"; }
  function duration(s) {
    if (s === null || s === undefined || !isFinite(s)) return "-";
    s = Math.round(s);
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    const two = (x) => String(x).padStart(2, "0");
    return h ? `${h}h${two(m)}m` : m ? `${m}m${two(r)}s` : `${r}s`;
  }
  function config(c) {
    if (!c || typeof c !== "object") return "(none)";
    return Object.keys(c).sort().map((k) => `${k}=${c[k]}`).join(" ") || "(none)";
  }
  function status(s) { return el("span", {class: "status " + s}, s); }
  function num(x) { return el("td", {class: "num"}, x); }
  function programsText(j) {
    return `${j.programs_done} / ${j.programs_total}` + (j.current ? ` · ${j.current}` : "");
  }
  function trialsText(j) {
    return `${j.trials}` + (j.trials_planned ? ` / ${j.trials_planned}` : "");
  }
  function setField(root, name, value) {
    const node = root.querySelector(`[data-field="${name}"]`);
    if (node && node.textContent !== value) node.textContent = value;
  }
  async function getJSON(url) {
    const r = await fetch(url, {headers: {"Accept": "application/json"}, cache: "no-store"});
    if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
    return r.json();
  }
  function replaceBody(table, rows) {
    const tbody = table.tBodies[0];
    tbody.replaceChildren(...rows);
  }

  // -- jobs page -------------------------------------------------------------------------
  function renderJobs(data) {
    const table = document.getElementById("jobs");
    if (!table) return;
    const rows = data.jobs.map((j) => {
      const st = el("td", {}, status(j.status));
      if (j.attempts > 1) st.append(" ", el("span", {class: "muted"}, `(attempt ${j.attempts})`));
      return el("tr", {dataset: {job: j.id}},
        el("td", {}, link(`/jobs/${j.id}`, j.job_key)), st,
        el("td", {class: "num", dataset: {field: "programs"}}, programsText(j)),
        el("td", {class: "num", dataset: {field: "trials"}}, trialsText(j)),
        num(duration(j.elapsed_s)), num(j.eta_s === null ? "-" : duration(j.eta_s)),
        el("td", {}, when(j.started_at)), el("td", {}, when(j.finished_at)),
        el("td", {class: "path"}, j.job_path));
    });
    if (!rows.length) {
      rows.push(el("tr", {class: "empty"}, el("td", {colspan: 9},
        "No job has run against this database yet: tuner launch JOB.yaml.")));
    }
    replaceBody(table, rows);
  }

  // -- job / program page ----------------------------------------------------------------
  function renderJobFacts(j) {
    const facts = document.getElementById("job-facts");
    if (!facts || !j) return;
    const st = facts.querySelector('[data-field="status"]');
    if (st && st.textContent !== j.status) st.replaceChildren(status(j.status));
    setField(facts, "programs", programsText(j) .replace(" · ", " · now "));
    setField(facts, "trials", trialsText(j));
    setField(facts, "elapsed", duration(j.elapsed_s));
    setField(facts, "eta", j.eta_s === null ? "-" : duration(j.eta_s));
    setField(facts, "finished", when(j.finished_at));
  }

  function renderPrograms(programs, waiting) {
    const table = document.getElementById("programs");
    if (!table) return;
    const rows = [];
    for (const p of programs) {
      const devices = p.devices.length ? p.devices : [null];
      devices.forEach((d, i) => {
        const first = i === 0;
        const cells = [
          el("td", {}, first ? link(`/programs/${p.id}`, p.name) : ""),
          el("td", {}, first ? `${p.shapes_text} ${p.dtype}` : ""),
          num(!first ? "" : !p.structures ? "-" :
            `${p.verified} verified` + (p.structures !== p.verified ? " + as written" : "")),
          num(first ? (p.search_states === null ? "-" : p.search_states.toLocaleString("en")) : ""),
        ];
        if (d) {
          const b = d.best;
          cells.push(el("td", {}, d.device_key), num(d.trials), num(d.statuses.ok || 0),
            d.failed_trials ? el("td", {class: "num"}, el("a", {title: d.failed_text,
              href: `/failures?program=${encodeURIComponent(p.name)}&device=${encodeURIComponent(d.device_key)}`},
              d.failed_trials)) : num(0),
            num(d.skipped), num(b ? ms(b.time_s) : "-"),
            num(b ? ms(b.baseline_s) : "-"),
            num(b && b.speedup ? b.speedup.toFixed(2) + "x" : "-"),
            el("td", {}, b ? link(`/kernels/${b.trial_id}`,
              `${b.structure_hash.slice(0, 12)} ${config(b.config)}`) : "-"));
        } else {
          cells.push(el("td", {colspan: 9, class: "muted"}, "nothing measured yet"));
        }
        rows.push(el("tr", {}, ...cells));
      });
    }
    for (const w of waiting || []) {
      rows.push(el("tr", {class: "waiting"}, el("td", {}, w.name), el("td", {}, w.shapes_text),
        el("td", {colspan: 11, class: "muted"}, "not reached yet")));
    }
    if (!rows.length) {
      rows.push(el("tr", {class: "empty"}, el("td", {colspan: 13},
        "No program of this job is in the database yet.")));
    }
    replaceBody(table, rows);
    for (const p of programs) {
      for (const d of p.devices) {
        if (d.trials > 0) ensureCharts(p, d);
      }
    }
  }

  // -- charts (Chart.js, shipped in static/) ---------------------------------------------
  function ensureCharts(p, d) {
    const key = `${p.id}|${d.device_key}`;
    let c = charts[key];
    if (!c) {
      const host = document.getElementById("charts");
      if (!host || typeof Chart === "undefined") return;
      const bestCanvas = el("canvas", {"aria-label": "best so far"});
      const scatterCanvas = el("canvas", {"aria-label": "every trial"});
      const predCanvas = el("canvas", {"aria-label": "predicted vs measured"});
      const predNote = el("span", {class: "muted pred-note"}, "");
      const modeSel = el("select", {class: "mode"},
        el("option", {value: "trial"}, "over trials"), el("option", {value: "t"}, "over wall time"));
      const paramSel = el("select", {class: "param"});
      const card = el("section", {class: "chart-card", dataset: {key: key}},
        el("h3", {}, `${p.name} `, el("span", {class: "muted"}, `${p.shapes_text} · ${d.device_key}`)),
        el("div", {class: "pair"},
          el("figure", {class: "best-chart"}, el("figcaption", {}, "best so far ", modeSel),
            el("div", {class: "canvas"}, bestCanvas)),
          el("figure", {class: "scatter-chart"}, el("figcaption", {}, "every trial vs ", paramSel),
            el("div", {class: "canvas"}, scatterCanvas)),
          el("figure", {class: "predicted-chart"},
            el("figcaption", {}, "cost model: predicted vs measured ", predNote),
            el("div", {class: "canvas"}, predCanvas))));
      host.append(card);
      c = charts[key] = {pid: p.id, device: d.device_key, trials: -1, mode: "trial",
        param: null, data: null, card: card, modeSel: modeSel, paramSel: paramSel,
        predNote: predNote};
      c.best = new Chart(bestCanvas, {
        type: "line",
        data: {datasets: [{label: "best first timing (ms)", data: [], stepped: "after",
          borderColor: "#1f6feb", backgroundColor: "#1f6feb", pointRadius: 2}]},
        options: {animation: false, maintainAspectRatio: false, parsing: false,
          scales: {x: {type: "linear", title: {display: true, text: "trial"}},
                   y: {title: {display: true, text: "ms"}}},
          plugins: {legend: {display: false}}},
      });
      c.scatter = new Chart(scatterCanvas, {
        type: "scatter",
        data: {datasets: [{label: "first timing (ms)", data: [], pointRadius: 2,
          borderColor: "#d9822b", backgroundColor: "#d9822b"}]},
        options: {animation: false, maintainAspectRatio: false, parsing: false,
          scales: {x: {type: "linear", title: {display: true, text: ""},
                       ticks: {stepSize: 1, callback: (v) => Number.isInteger(v) ? String(2 ** v) : ""}},
                   y: {title: {display: true, text: "ms"}}},
          plugins: {legend: {display: false}}},
      });
      c.pred = new Chart(predCanvas, {
        type: "scatter",
        data: {datasets: [{label: "trial", data: [], pointRadius: 2,
          borderColor: "#2da44e", backgroundColor: "#2da44e"}]},
        options: {animation: false, maintainAspectRatio: false, parsing: false,
          scales: {x: {type: "logarithmic", title: {display: true, text: "measured ms"}},
                   y: {type: "logarithmic", title: {display: true, text: "predicted ms"}}},
          plugins: {legend: {display: false}}},
      });
      modeSel.addEventListener("change", () => { c.mode = modeSel.value; drawCharts(c); });
      paramSel.addEventListener("change", () => { c.param = paramSel.value; drawCharts(c); });
    }
    if (c.trials !== d.trials) {
      c.trials = d.trials;
      const url = `/api/programs/${p.id}/series?device=${encodeURIComponent(d.device_key)}`;
      getJSON(url).then((s) => { c.data = s; drawCharts(c); }).catch(() => {});
      const purl = `/api/programs/${p.id}/predicted?device=${encodeURIComponent(d.device_key)}`;
      getJSON(purl).then((r) => drawPredicted(c, r)).catch(() => {});
    }
  }

  function drawCharts(c) {
    const s = c.data;
    if (!s) return;
    const x = c.mode === "t" ? "t" : "trial";
    const pts = s.best.map((b) => ({x: b[x], y: b.s * 1e3}));
    if (pts.length) {  // the step runs on to the last trial
      const end = c.mode === "t" ? (Date.parse(s.end) - Date.parse(s.start)) / 1000 : s.trials;
      if (end > pts[pts.length - 1].x) pts.push({x: end, y: pts[pts.length - 1].y});
    }
    c.best.data.datasets[0].data = pts;
    c.best.options.scales.x.title.text = c.mode === "t" ? "seconds since the first trial" : "trial";
    c.best.update("none");
    const params = new Set();
    for (const p of s.scatter) for (const k of Object.keys(p.config || {})) params.add(k);
    const names = [...params].sort();
    if (names.join() !== [...c.paramSel.options].map((o) => o.value).join()) {
      c.paramSel.replaceChildren(...names.map((n) => el("option", {value: n}, n)));
      if (!names.includes(c.param)) c.param = names[0] || null;
      c.paramSel.value = c.param || "";
    }
    const pos = s.scatter.filter((p) => c.param && Number(p.config[c.param]) > 0);
    // x on a log2 scale, labelled with the parameter's values (tiling parameters are mostly
    // powers of two)
    c.scatter.data.datasets[0].data = pos.map((p) => ({x: Math.log2(Number(p.config[c.param])), y: p.s * 1e3}));
    c.scatter.options.scales.x.title.text = c.param ? `${c.param} (log scale)` : "";
    const xs = c.scatter.data.datasets[0].data.map((p) => p.x);
    if (xs.length) {  // whole powers of two at the ends, so that every tick has a label
      c.scatter.options.scales.x.min = Math.floor(Math.min(...xs)) - 1;
      c.scatter.options.scales.x.max = Math.ceil(Math.max(...xs)) + 1;
    }
    c.scatter.update("none");
    c.card.dataset.points = String(pts.length);
  }

  function drawPredicted(c, r) {
    c.pred.data.datasets[0].data = (r.points || []).map((q) => ({x: q.measured * 1e3, y: q.predicted * 1e3}));
    c.pred.update("none");
    const tau = r.kendall_tau === null || r.kendall_tau === undefined ? "" : ` · Kendall tau ${r.kendall_tau.toFixed(2)}`;
    c.predNote.textContent = r.model ? `model ${r.model.id} (${r.model.kind})${tau}${r.reason ? " · " + r.reason : ""}` : (r.reason || "");
    c.card.dataset.predicted = String((r.points || []).length);
  }

  // -- cluster page ----------------------------------------------------------------------
  function renderCluster(s) {
    const err = document.getElementById("cluster-error");
    if (err) { err.hidden = !s.error; err.textContent = s.error || ""; }
    const fill = (id, rows, cols, none) => {
      const t = document.getElementById(id);
      if (!t) return;
      if (!rows.length) rows = [el("tr", {class: "empty"}, el("td", {colspan: cols}, none))];
      replaceBody(t, rows);
    };
    fill("nodes", s.nodes.map((n) => el("tr", {},
      el("td", {}, (n.node_id || "").slice(0, 12) + (n.head ? " (head)" : "")), el("td", {}, n.ip),
      el("td", {}, n.state), num(n.cpus), num(n.gpus), num(n.memory_gb))), 6, "none");
    fill("slots", s.slots.map((a) => el("tr", {},
      el("td", {}, (a.actor_id || "").slice(0, 12)), el("td", {}, a.node), num(a.pid), num(a.gpus),
      el("td", {}, a.state), el("td", {}, a.doing))), 6,
      "none (a launch starts one per device when it tunes)");
    fill("tasks", s.tasks.map((t) => el("tr", {},
      el("td", {}, (t.task_id || "").slice(0, 12)), el("td", {}, t.name), el("td", {}, t.node),
      num(t.pid), el("td", {}, t.state))), 5, "none running (a launch runs them while it searches)");
  }

  // -- polling ---------------------------------------------------------------------------
  const page = body.dataset.page;
  const api = page === "jobs" ? "/api/jobs" : body.dataset.api;
  if (!api) return;

  function apply(data) {
    if (page === "jobs") renderJobs(data);
    else if (page === "job" || page === "program") {
      renderJobFacts(data.job);
      renderPrograms(data.programs, data.job ? data.job.waiting : []);
    } else if (page === "cluster") renderCluster(data);
    body.dataset.updated = String(Date.now());
    const live = document.getElementById("live");
    if (live) live.hidden = false;
  }

  async function tick() {
    if (inFlight || document.hidden) return;
    inFlight = true;
    try { apply(await getJSON(api)); } catch (e) { /* the next tick tries again */ }
    finally { inFlight = false; }
  }
  tick();
  setInterval(tick, POLL);
})();
