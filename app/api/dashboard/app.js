// crowdtally dashboard: plain JS and SVG, no external assets. Reads the API with the key given.
//
// Two loops: the counters (GET /v1/projects/{p}, cheap) every `poll` seconds feed the cards and
// the throughput, a rate over the last `window` seconds of samples (0 when nothing arrives);
// the rest (summary, calibration, the current pages of workers and items) every `refresh`
// seconds. All three are query parameters (?poll=0.25&window=1&refresh=1 for tests).
"use strict";
const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const params = new URLSearchParams(location.search);
const num = (name, dflt) => { const v = parseFloat(params.get(name)); return v > 0 ? v : dflt; };
const POLL_S = num("poll", 2);          // seconds between counter samples
const WINDOW_S = num("window", 10);     // the throughput is the mean rate over this window
const REFRESH_S = num("refresh", 5);    // seconds between refreshes of the plots and tables
const HISTORY_S = num("history", 120);  // seconds of throughput the line shows
const WORKERS_PAGE = Math.round(num("workers_page", 25));
const ITEMS_PAGE = Math.round(num("items_page", 50));
const SPAMMER_INFORMATIVENESS = 0.1;    // as app/api/views.py flags likely spammers
const BLUE = "#3b6fd8";

let session = 0;             // bumped on every (re)connect: stale loops and answers stop
const timers = {};           // the pending call of each loop
let samples = [];            // [time s, n_labels, rate over the window ending there]
let classes = [];
let okStatus = "";
let lastCount = null;        // when the counters last came
const THROUGHPUT_NOTE = `labels applied, counted every ${POLL_S} s`;
const workers = { offset: 0, total: 0, search: null, gen: 0 };
const items = { cursors: [null], page: 0, next: null, search: null, gen: 0 };

// --- helpers ----------------------------------------------------------------------------
function el(name, attrs = {}, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

const project = () => encodeURIComponent($("project").value);
// A browser resolves a path segment "." or ".." (encoded or not) before it asks for it: such a
// name cannot be looked up from here (the service answers it to other clients).
const unreachable = (name) => name === "." || name === "..";
const unreachableNote = (what, name) =>
  `a browser cannot ask for ${what} named "${name}" (it reads it as a step of the URL): use the API`;
const segment = encodeURIComponent;
const fmt = (v, d = 3) => (v === null || v === undefined ? "–" : v.toFixed(d));

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path) {
  const timeout = Math.max(5000, 4000 * POLL_S);
  const r = await fetch(path, {
    headers: { Authorization: "Bearer " + $("key").value },
    signal: AbortSignal.timeout(timeout),
  });
  const body = await r.json().catch(() => ({}));  // a proxy's error page is not JSON
  if (!r.ok) throw new ApiError(r.status, body.error ? body.error.message : `${r.status} ${r.statusText}`);
  return body;
}

function showError(e) {
  $("status").textContent = "error: " + (e.name === "TimeoutError" ? "the service did not answer" : e.message);
  $("status").className = "error";
}

function showOk(text) {
  if (text) okStatus = text;
  $("status").textContent = okStatus;
  $("status").className = "";
}

// --- charts: every plot has an x and a y axis title (with units) and a legend ------------
const MARGIN = { l: 44, r: 10, t: 24, b: 36 };

function niceTicks(max, n = 4) {
  // 0 .. a round top >= max, in steps of 1, 2 or 5 times a power of ten
  if (!(max > 0)) max = 1;
  const raw = max / n, mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const top = step * Math.ceil(max / step - 1e-9);
  const ticks = [];
  for (let v = 0; v <= top + step / 2; v += step) ticks.push(+v.toPrecision(12));
  return { top, ticks };
}

const tickLabel = (v) => (Math.abs(v) >= 1000 ? v.toLocaleString() : String(+v.toPrecision(4)));

// The frame of a chart: axes with ticks, axis titles and the legend. x.ticks and y.ticks are
// [fraction of the axis (0 = left or bottom), label]; legend entries {swatch, label}, swatch
// "bar", "line", "dash" or "dot". Returns the plot area and mappers from fractions to pixels.
function frame(svg, { x, y, legend }) {
  svg.replaceChildren();
  const W = +svg.getAttribute("width"), H = +svg.getAttribute("height");
  // x tick labels wider than their spacing are turned (and the plot leaves room for them)
  const longest = Math.max(0, ...x.ticks.map(([, l]) => String(l).length));
  const turn = x.ticks.length > 1 && 6 * longest > (W - MARGIN.l - MARGIN.r) / x.ticks.length;
  const bottom = MARGIN.b + (turn ? Math.round(6 * longest * 0.7) : 0);
  const x0 = MARGIN.l, y0 = MARGIN.t, w = W - MARGIN.l - MARGIN.r, h = H - MARGIN.t - bottom;
  const px = (f) => x0 + w * f, py = (f) => y0 + h * (1 - f);
  const grid = el("g", { class: "grid" });
  const ax = el("g", { class: "axis x" }), ay = el("g", { class: "axis y" });
  ax.appendChild(el("line", { x1: x0, x2: x0 + w, y1: y0 + h, y2: y0 + h }));
  ay.appendChild(el("line", { x1: x0, x2: x0, y1: y0, y2: y0 + h }));
  for (const [f, label] of x.ticks) {
    ax.appendChild(el("line", { x1: px(f), x2: px(f), y1: y0 + h, y2: y0 + h + 4 }));
    ax.appendChild(turn
      ? el("text", { class: "tick", transform: `translate(${px(f) + 3} ${y0 + h + 8}) rotate(-45)`, "text-anchor": "end" }, label)
      : el("text", { class: "tick", x: px(f), y: y0 + h + 14, "text-anchor": "middle" }, label));
  }
  for (const [f, label] of y.ticks) {
    grid.appendChild(el("line", { x1: x0, x2: x0 + w, y1: py(f), y2: py(f) }));
    ay.appendChild(el("line", { x1: x0 - 4, x2: x0, y1: py(f), y2: py(f) }));
    ay.appendChild(el("text", { class: "tick", x: x0 - 6, y: py(f) + 3, "text-anchor": "end" }, label));
  }
  ax.appendChild(el("text", { class: "axis-title x", x: x0 + w / 2, y: H - 4, "text-anchor": "middle" }, x.title));
  ay.appendChild(el("text", { class: "axis-title y", transform: `translate(11 ${y0 + h / 2}) rotate(-90)`, "text-anchor": "middle" }, y.title));
  svg.append(grid, ax, ay, legendOf(legend, 8, 6));
  const plot = el("g", { class: "plot" });
  svg.appendChild(plot);
  return { x0, y0, w, h, px, py, plot };
}

function legendOf(entries, left, top) {
  const g = el("g", { class: "legend" });
  let at = left;
  for (const { swatch, label } of entries) {
    const mid = top + 6;
    if (swatch === "bar") g.appendChild(el("rect", { class: "bar", x: at, y: top + 1, width: 10, height: 10 }));
    else if (swatch === "dot") g.appendChild(el("circle", { cx: at + 5, cy: mid, r: 4, fill: BLUE, "fill-opacity": 0.7 }));
    else g.appendChild(el("line", { x1: at, x2: at + 14, y1: mid, y2: mid, stroke: swatch === "dash" ? "#999" : BLUE, "stroke-width": swatch === "dash" ? 1 : 2, "stroke-dasharray": swatch === "dash" ? "4 3" : "none" }));
    const t = el("text", { x: at + 18, y: mid + 3.5 }, label);
    g.appendChild(t);
    at += 18 + 5.6 * label.length + 12;
  }
  return g;
}

function bars(svg, values, labels, spec) {
  const { top, ticks } = niceTicks(Math.max(...values, 1));
  const n = values.length;
  const f = frame(svg, {
    x: { title: spec.xTitle, ticks: spec.xTicks || labels.map((l, i) => [(i + 0.5) / n, l]) },
    y: { title: spec.yTitle, ticks: ticks.map((v) => [v / top, tickLabel(v)]) },
    legend: [{ swatch: "bar", label: spec.legend }],
  });
  const bw = f.w / n;
  values.forEach((v, i) => {
    const bh = f.h * v / top;
    const r = el("rect", { class: "bar", x: f.x0 + i * bw + 1, y: f.y0 + f.h - bh, width: Math.max(1, bw - 2), height: bh });
    r.appendChild(el("title", {}, `${spec.tip ? spec.tip(i) : labels[i]}: ${v.toLocaleString()} items`));
    f.plot.appendChild(r);
  });
}

function throughput(svg) {
  const now = samples.length ? samples[samples.length - 1][0] : 0;
  const pts = samples.filter((s) => s[2] !== null && s[0] >= now - HISTORY_S);
  const span = pts.length > 1 ? Math.max(now - pts[0][0], POLL_S) : HISTORY_S;
  const xs = niceTicks(span, 4);
  const { top, ticks } = niceTicks(Math.max(1, ...pts.map((p) => p[2])));
  const f = frame(svg, {
    x: { title: "time (seconds before now)", ticks: xs.ticks.map((v) => [1 - v / xs.top, v ? "-" + tickLabel(v) : "0"]) },
    y: { title: "throughput (labels/s)", ticks: ticks.map((v) => [v / top, tickLabel(v)]) },
    legend: [{ swatch: "line", label: `labels/s, mean of the last ${tickLabel(WINDOW_S)} s` }],
  });
  if (pts.length < 2) {
    f.plot.appendChild(el("text", { x: f.x0 + 8, y: f.y0 + 16 }, "collecting…"));
    return;
  }
  const d = pts.map((p, i) => `${i ? "L" : "M"}${f.px(1 - (now - p[0]) / xs.top).toFixed(1)},${f.py(p[2] / top).toFixed(1)}`).join(" ");
  f.plot.appendChild(el("path", { d, fill: "none", stroke: BLUE, "stroke-width": 2 }));
}

function reliability(svg, report) {
  // observed accuracy (y) against mean confidence (x) per bin, on the gold items; the
  // diagonal is perfect calibration
  const ticks = [0, 0.25, 0.5, 0.75, 1].map((v) => [v, String(v)]);
  const f = frame(svg, {
    x: { title: "confidence (mean in bin)", ticks },
    y: { title: "accuracy on gold", ticks },
    legend: [{ swatch: "dot", label: "bins (area: items)" }, { swatch: "dash", label: "ideal" }],
  });
  f.plot.appendChild(el("path", { d: `M${f.px(0)},${f.py(0)} L${f.px(1)},${f.py(1)}`, stroke: "#999", "stroke-dasharray": "4 3" }));
  if (!report.n_gold) {
    f.plot.appendChild(el("text", { x: f.x0 + 8, y: f.y0 + 16 }, "no gold items yet"));
    return;
  }
  for (const b of report.bins.filter((b) => b.n > 0)) {
    const c = el("circle", { cx: f.px(b.confidence), cy: f.py(b.accuracy), r: 3 + Math.min(6, Math.sqrt(b.n) / 2), fill: BLUE, "fill-opacity": 0.7 });
    c.appendChild(el("title", {}, `${b.n} items at ${b.lower.toFixed(1)}–${b.upper.toFixed(1)}: confidence ${b.confidence.toFixed(3)}, accuracy ${b.accuracy.toFixed(3)}`));
    f.plot.appendChild(c);
  }
}

// A worker's confusion matrix: rows the true label, columns the answered label, both axes
// titled and ticked with the class names; a colour scale legend with its values at the right.
const heatColour = (p) => `hsl(220, 70%, ${Math.round(97 - 60 * p)}%)`;
const short = (s, n) => (s.length > n ? s.slice(0, n - 1) + "…" : s);

function heatmap(matrix, labels) {
  const k = labels.length;
  const c = k <= 6 ? 26 : Math.max(8, Math.floor(156 / k));
  const names = labels.map((l) => short(l, 10));
  const nameW = 6 * Math.max(...names.map((n) => n.length)) + 4;
  const upright = names.every((n) => 6 * n.length <= c);  // column names fit under their column
  const colH = upright ? 13 : nameW + 4;
  const left = 16 + nameW, top = 4, size = k * c;
  const bottom = top + size + colH + 16;  // below the answered labels' title
  const legendH = Math.max(size, 96);  // its title, "P(answer | true)", about 92 px long
  const lx = left + size + 12, W = lx + 10 + 30 + 12, H = Math.max(bottom, top + legendH + 4);
  const svg = el("svg", { class: "heatmap", width: W, height: H, role: "img", "aria-label": "confusion matrix" });
  const ay = el("g", { class: "axis y" }), ax = el("g", { class: "axis x" });
  ay.appendChild(el("text", { class: "axis-title y", transform: `translate(10 ${Math.max(top + size / 2, 34)}) rotate(-90)`, "text-anchor": "middle" }, "true label"));
  ax.appendChild(el("text", { class: "axis-title x", x: left + size / 2, y: bottom - 3, "text-anchor": "middle" }, "answered label"));
  names.forEach((n, i) => {
    ay.appendChild(el("text", { class: "tick", x: left - 4, y: top + i * c + c / 2 + 3.5, "text-anchor": "end" }, n));
    const xc = left + i * c + c / 2, yc = top + size + 11;
    ax.appendChild(upright
      ? el("text", { class: "tick", x: xc, y: yc, "text-anchor": "middle" }, n)
      : el("text", { class: "tick", transform: `translate(${xc + 3} ${top + size + 4}) rotate(-90)`, "text-anchor": "end" }, n));
  });
  svg.append(ay, ax);
  labels.forEach((t, i) => labels.forEach((a, j) => {
    const p = matrix[t][a];
    const r = el("rect", { class: "cell", x: left + j * c, y: top + i * c, width: c - 1, height: c - 1, fill: heatColour(p) });
    r.appendChild(el("title", {}, `true ${t}, answered ${a}: ${p.toFixed(3)}`));
    svg.appendChild(r);
    if (c >= 22) {
      svg.appendChild(el("text", { class: p > 0.55 ? "value dark" : "value", x: left + j * c + c / 2 - 0.5, y: top + i * c + c / 2 + 3, "text-anchor": "middle" }, p.toFixed(2).replace(/^0/, "")));
    }
  }));
  // the colour scale: P(answer | true) from 0 (bottom) to 1 (top)
  const lg = el("g", { class: "legend" });
  const steps = 20;
  for (let s = 0; s < steps; s++) {
    const p = (s + 0.5) / steps;
    lg.appendChild(el("rect", { x: lx, y: top + size * (1 - (s + 1) / steps), width: 10, height: size / steps + 0.5, fill: heatColour(p) }));
  }
  lg.appendChild(el("rect", { x: lx, y: top, width: 10, height: size, fill: "none", stroke: "#bbb" }));
  for (const v of [0, 0.5, 1]) {
    lg.appendChild(el("text", { class: "tick", x: lx + 13, y: top + size * (1 - v) + (v === 1 ? 7 : v === 0 ? 0 : 3) }, String(v)));
  }
  lg.appendChild(el("text", { class: "legend-title", transform: `translate(${lx + 38} ${top + legendH / 2}) rotate(-90)`, "text-anchor": "middle" }, "P(answer | true)"));
  svg.appendChild(lg);
  return svg;
}

// --- the counters and the throughput ------------------------------------------------------
function addSample(t, n) {
  if (samples.length && n < samples[samples.length - 1][1]) samples = [];  // a recreated project
  // the rate over the window ending now: from the oldest sample inside it, or from the one
  // before when polls came slower than the window (a hidden tab)
  let j = samples.findIndex((s) => s[0] >= t - WINDOW_S - 1e-6);
  if (j === -1) j = samples.length - 1;
  const rate = j >= 0 ? Math.max(0, (n - samples[j][1]) / Math.max(1e-3, t - samples[j][0])) : null;
  samples.push([t, n, rate]);
  while (samples.length > 2 && samples[0][0] < t - HISTORY_S - WINDOW_S) samples.shift();
  return rate;
}

function showRate(rate) {
  $("rate").textContent = rate === null ? "–" : rate.toFixed(1);
  $("rate").dataset.rate = rate === null ? "" : String(rate);
}

// A refit is declined when batch EM's labels part ways with the served ones (stats.last_refit).
function showRefit(refit) {
  $("last-refit").textContent = refit ? (refit.adopted ? "adopted" : "declined") : "–";
  $("last-refit-name").textContent = refit
    ? `last refit: ${fmt(100 * refit.agreement, 1)}% of its labels as served`
    : "last refit";
}

async function poll(sess) {
  try {
    const p = await api(`/v1/projects/${project()}`);
    if (sess !== session) return;
    const st = p.stats;
    $("n-labels").textContent = st.n_labels.toLocaleString();
    $("n-items").textContent = st.n_items.toLocaleString();
    $("n-workers").textContent = st.n_workers.toLocaleString();
    $("lag").textContent = st.lag.toLocaleString();
    showRefit(st.last_refit);
    showRate(addSample(performance.now() / 1000, st.n_labels));
    throughput($("throughput"));
    lastCount = new Date();
    $("throughput").closest("figure").classList.remove("stale");
    $("throughput-text").textContent = THROUGHPUT_NOTE;
    if (okStatus) showOk();
  } catch (e) {
    if (sess !== session) return;
    showRate(null);  // an old rate is never shown as the current one
    $("throughput").closest("figure").classList.add("stale");
    $("throughput-text").textContent = lastCount
      ? `no counts since ${lastCount.toLocaleTimeString()}: the rate now is unknown`
      : "no counts yet";
    showError(e);
  }
}

// --- the summary, the calibration ---------------------------------------------------------
function renderSummary(s) {
  classes = s.labels;
  const h = s.confidence_histogram;
  bars($("confidence-histogram"), h.counts, h.edges.slice(0, -1).map((e) => e.toFixed(2)), {
    xTitle: "probability of the most likely label", yTitle: "items",
    xTicks: [0, 0.2, 0.4, 0.6, 0.8, 1].map((v) => [v, String(v)]),
    legend: `items per bin of ${(h.edges[1] - h.edges[0]).toFixed(2)}`,
    tip: (i) => `${h.edges[i].toFixed(2)}–${h.edges[i + 1].toFixed(2)}`,
  });
  bars($("label-counts"), s.labels.map((l) => s.label_counts[l]), s.labels.map((l) => short(l, 10)), {
    xTitle: "most likely label", yTitle: "items", legend: "items", tip: (i) => s.labels[i],
  });
  $("queue-size").textContent = `${s.queue_size.toLocaleString()} items still need labels`;
  const pr = s.queue_progress;
  const finished = pr.done
    ? `${pr.done.toLocaleString()} items finished, expected ${(100 * pr.expected_accuracy).toFixed(1)}% right`
    : "no item finished yet";
  const toGo = pr.open === 0
    ? "no item open"
    : pr.labels_to_finish === null
    ? "some open items cannot reach the target confidence under the model"
    : `about ${Math.round(pr.labels_to_finish).toLocaleString()} more labels to finish the ${pr.open.toLocaleString()} open`;
  $("queue-progress").textContent = `${finished}; ${toGo}`;
  const qbody = $("queue").querySelector("tbody");
  qbody.replaceChildren();
  for (const q of s.queue) {
    const tr = document.createElement("tr");
    for (const c of [q.item, fmt(q.score, 4), q.label ?? "–", fmt(q.probability), q.n_labels]) cell(tr, c);
    qbody.appendChild(tr);
  }
  $("items-total").textContent = `${s.stats.n_items.toLocaleString()} in all`;
  showOk(`project ${s.project}: log position ${s.stats.log_end}, computed ${s.computed_at}`);
  $("overview").hidden = false;
}

function renderCalibration(report) {
  $("calibration-text").textContent = report.n_gold
    ? `${report.n_gold} gold items: ECE ${report.ece.toFixed(1)} points, accuracy ${(100 * report.accuracy).toFixed(1)}%`
    : "post gold answers to see it";
  reliability($("reliability"), report);
}

// --- workers: pages of the ranked list, or one worker found by id -----------------------
function workerRow(w, rank) {
  const tr = document.createElement("tr");
  if (w.informativeness < SPAMMER_INFORMATIVENESS) tr.className = "spammer";
  tr.dataset.worker = w.worker;
  cell(tr, rank === null ? "–" : rank, "rank");
  cell(tr, w.worker, "id");
  for (const c of [w.n_labels, fmt(w.accuracy), fmt(w.informativeness), fmt(w.gold_accuracy)]) cell(tr, c);
  const td = document.createElement("td");
  if (w.confusion) td.appendChild(heatmap(w.confusion, classes.length ? classes : Object.keys(w.confusion)));
  tr.appendChild(td);
  return tr;
}

async function loadWorkers() {
  const gen = ++workers.gen;
  const body = $("workers").querySelector("tbody");
  let rows, info;
  if (workers.search !== null && unreachable(workers.search)) {
    rows = [];
    info = unreachableNote("a worker", workers.search);
  } else if (workers.search !== null) {
    try {
      const w = await api(`/v1/projects/${project()}/workers/${segment(workers.search)}`);
      rows = [workerRow(w, null)];
      info = `worker ${workers.search}`;
    } catch (e) {
      if (!(e instanceof ApiError) || e.status !== 404) throw e;
      rows = [];
      info = `no worker "${workers.search}" (no labels from it applied yet)`;
    }
  } else {
    const q = new URLSearchParams({ order: $("workers-order").value, by: $("workers-by").value,
      limit: WORKERS_PAGE, offset: workers.offset, confusion: "true" });
    const page = await api(`/v1/projects/${project()}/workers?${q}`);
    if (workers.offset > 0 && workers.offset >= page.total) {  // the list shrank
      workers.offset = Math.max(0, page.total - WORKERS_PAGE);
      return loadWorkers();
    }
    workers.total = page.total;
    rows = page.workers.map((w, i) => workerRow(w, workers.offset + i + 1));
    info = page.total
      ? `workers ${workers.offset + 1}–${workers.offset + page.workers.length} of ${page.total.toLocaleString()}`
      : "no workers yet";
  }
  if (gen !== workers.gen) return;
  body.replaceChildren(...rows);
  $("workers-page").textContent = info;
  const searching = workers.search !== null;
  $("workers-prev").disabled = searching || workers.offset === 0;
  $("workers-next").disabled = searching || workers.offset + WORKERS_PAGE >= workers.total;
  $("workers-all").hidden = !searching;
}

// --- items: pages of the stored posteriors (forward cursors, kept to go back), or one item -----
function itemRow(x) {
  const tr = document.createElement("tr");
  tr.dataset.item = x.item;
  cell(tr, x.item, "id");
  cell(tr, x.label ?? "–");  // null: no labels yet
  cell(tr, fmt(x.probability));
  const top = Object.entries(x.posterior).sort((a, b) => b[1] - a[1]).slice(0, 3);
  cell(tr, top.map(([l, p]) => `${l}: ${p.toFixed(3)}`).join(" · "));
  cell(tr, x.n_labels);
  cell(tr, x.gold === null ? "–" : x.gold);
  return tr;
}

async function loadItems() {
  const gen = ++items.gen;
  let rows, info;
  if (items.search !== null && unreachable(items.search)) {
    rows = [];
    info = unreachableNote("an item", items.search);
  } else if (items.search !== null) {
    try {
      rows = [itemRow(await api(`/v1/projects/${project()}/items/${segment(items.search)}`))];
      info = `item ${items.search}`;
    } catch (e) {
      if (!(e instanceof ApiError) || e.status !== 404) throw e;
      rows = [];
      info = `no item "${items.search}" (no labels for it applied yet)`;
    }
  } else {
    const bound = (id, empty) => Math.min(1, Math.max(0, Number($(id).value || empty) || 0));
    const q = new URLSearchParams({ limit: ITEMS_PAGE, min_probability: bound("items-min", 0),
      max_probability: bound("items-max", 1) });  // (typed past [0, 1]: the API's 422, unseen)
    const cursor = items.cursors[items.page];
    if (cursor) q.set("cursor", cursor);
    const page = await api(`/v1/projects/${project()}/items?${q}`);
    items.next = page.next_cursor;
    rows = page.items.map(itemRow);
    info = `page ${items.page + 1}: ${page.items.length} item${page.items.length === 1 ? "" : "s"}`
      + (page.items.length ? "" : page.next_cursor ? " in this range (try next)" : " in this range");
  }
  if (gen !== items.gen) return;
  $("items").querySelector("tbody").replaceChildren(...rows);
  $("items-page").textContent = info;
  const searching = items.search !== null;
  $("items-prev").disabled = searching || items.page === 0;
  $("items-next").disabled = searching || !items.next;
  $("items-all").hidden = !searching;
}

// --- the loops ----------------------------------------------------------------------------
let refreshes = 0;
async function refresh(sess) {
  try {
    const s = await api(`/v1/projects/${project()}/summary?workers=0`);
    if (sess !== session) return;
    renderSummary(s);
    await Promise.all([loadWorkers(), loadItems()]);
    if (refreshes++ % 3 === 0) renderCalibration(await api(`/v1/projects/${project()}/calibration`));
  } catch (e) {
    if (sess === session) showError(e);
  }
}

function every(name, seconds, fn, sess) {
  // one call after another (never two at once), `seconds` apart
  const run = async () => {
    await fn(sess);
    if (sess === session) timers[name] = setTimeout(run, seconds * 1000);
  };
  run();
}

function connect() {
  session++;
  Object.values(timers).forEach(clearTimeout);
  samples = [];
  refreshes = 0;
  okStatus = "";
  lastCount = null;
  workers.offset = 0; workers.search = null;
  items.cursors = [null]; items.page = 0; items.search = null;
  showRate(null);
  every("poll", POLL_S, poll, session);
  every("refresh", REFRESH_S, refresh, session);
}

// a change of page, order, filter or search: that table again, at once
const onWorkers = (fn) => () => { fn(); loadWorkers().catch(showError); };
const onItems = (fn) => () => { fn(); loadItems().catch(showError); };

$("workers-prev").addEventListener("click", onWorkers(() => { workers.offset = Math.max(0, workers.offset - WORKERS_PAGE); }));
$("workers-next").addEventListener("click", onWorkers(() => { workers.offset += WORKERS_PAGE; }));
$("workers-all").addEventListener("click", onWorkers(() => { workers.search = null; $("workers-search").value = ""; }));
for (const id of ["workers-order", "workers-by"]) $(id).addEventListener("change", onWorkers(() => { workers.offset = 0; }));
$("workers-controls").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const raw = $("workers-search").value;  // (as typed: an id may have spaces at its ends)
  const v = raw.trim() ? raw : "";
  onWorkers(() => { workers.search = v || null; })();
});

const firstItems = () => { items.cursors = [null]; items.page = 0; };
$("items-prev").addEventListener("click", onItems(() => { items.page = Math.max(0, items.page - 1); }));
$("items-next").addEventListener("click", onItems(() => {
  if (!items.next) return;
  items.cursors[items.page + 1] = items.next;
  items.cursors.length = items.page + 2;
  items.page += 1;
}));
$("items-all").addEventListener("click", onItems(() => { items.search = null; $("items-search").value = ""; }));
for (const id of ["items-min", "items-max"]) $(id).addEventListener("change", onItems(firstItems));
$("items-controls").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const raw = $("items-search").value;  // (as typed: an id may have spaces at its ends)
  const v = raw.trim() ? raw : "";
  onItems(() => { items.search = v || null; if (!v) firstItems(); })();
});

// a hidden tab polls seldom (the browser throttles timers): sample at once when it comes back
document.addEventListener("visibilitychange", () => {
  if (!document.hidden && session) poll(session);
});

async function listProjects() {
  try {
    const ps = await api("/v1/projects");
    $("projects").replaceChildren(...ps.map((p) => { const o = document.createElement("option"); o.value = p.name; return o; }));
  } catch (e) { /* a project key cannot list projects */ }
}

$("connect").addEventListener("submit", (ev) => {
  ev.preventDefault();
  localStorage.setItem("crowdtally-key", $("key").value);
  localStorage.setItem("crowdtally-project", $("project").value);
  connect();
});

$("rate-name").textContent = `labels/s (last ${tickLabel(WINDOW_S)} s)`;
$("throughput-text").textContent = THROUGHPUT_NOTE;
$("key").value = params.get("key") || localStorage.getItem("crowdtally-key") || "";
$("project").value = params.get("project") || localStorage.getItem("crowdtally-project") || "";
if ($("key").value) listProjects();
if ($("key").value && $("project").value) $("connect").requestSubmit();
