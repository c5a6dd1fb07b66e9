// tuner dashboard: keeps a live page up to date without a reload, and draws its charts.
//
// Every table is drawn once, by the server (the Jinja templates).  While a launch runs, this
// script fetches the page it is on again and swaps in the elements marked data-live (same id)
// that changed; it never builds HTML from data, and writes no number or date of its own: what
// a table shows is what the server wrote.  The charts (Chart.js) are drawn here from the JSON
// series the programs table's rows point at (data-chart-* attributes).
"use strict";

(function () {
  const body = document.body;
  const POLL = Number(body.dataset.pollMs || 2000);
  const charts = {};      // "pid|device" -> {best, scatter, pred, trials, mode, param, ...}
  let inFlight = false;

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
  async function getJSON(url) {
    const r = await fetch(url, {headers: {"Accept": "application/json"}, cache: "no-store"});
    if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
    return r.json();
  }

  // -- live parts: the server's newer rendering of this page, swapped in where it changed --
  function swap(fresh) {
    for (const now of document.querySelectorAll("[data-live][id]")) {
      const next = fresh.getElementById(now.id);
      if (next && next.outerHTML !== now.outerHTML) now.replaceWith(document.importNode(next, true));
    }
  }

  // -- charts (Chart.js, shipped in static/) ---------------------------------------------
  function ensureCharts(row) {
    const d = row.dataset;
    const key = `${d.chartProgram}|${d.chartDevice}`;
    const trials = Number(d.chartTrials);
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
        el("h3", {}, `${d.chartName} `, el("span", {class: "muted"}, d.chartTitle)),
        el("div", {class: "pair"},
          el("figure", {class: "best-chart"}, el("figcaption", {}, "best so far ", modeSel),
            el("div", {class: "canvas"}, bestCanvas)),
          el("figure", {class: "scatter-chart"}, el("figcaption", {}, "every trial vs ", paramSel),
            el("div", {class: "canvas"}, scatterCanvas)),
          el("figure", {class: "predicted-chart"},
            el("figcaption", {}, "cost model: predicted vs measured ", predNote),
            el("div", {class: "canvas"}, predCanvas))));
      host.append(card);
      c = charts[key] = {trials: -1, mode: "trial", param: null, data: null, card: card,
        paramSel: paramSel, predNote: predNote,
        series: d.chartSeries, predicted: d.chartPredicted};
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
    if (c.trials !== trials) {
      c.trials = trials;
      getJSON(c.series).then((s) => { c.data = s; drawCharts(c); }).catch(() => {});
      getJSON(c.predicted).then((r) => drawPredicted(c, r)).catch(() => {});
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
    c.predNote.textContent = r.note || "";
    c.card.dataset.predicted = String((r.points || []).length);
  }

  function followCharts() {
    for (const row of document.querySelectorAll("#programs tr[data-chart-series]")) {
      if (Number(row.dataset.chartTrials) > 0) ensureCharts(row);
    }
  }

  // -- polling ---------------------------------------------------------------------------
  followCharts();
  if (!body.hasAttribute("data-live-page")) return;

  async function tick() {
    if (inFlight || document.hidden) return;
    inFlight = true;
    try {
      const r = await fetch(location.href, {headers: {"Accept": "text/html"}, cache: "no-store"});
      if (!r.ok) throw new Error(`HTTP ${r.status}`);
      swap(new DOMParser().parseFromString(await r.text(), "text/html"));
      followCharts();
      body.dataset.updated = String(Date.now());
      const live = document.getElementById("live");
      if (live) live.hidden = false;
    } catch (e) { /* the next tick tries again */ }
    finally { inFlight = false; }
  }
  tick();
  setInterval(tick, POLL);
})();
