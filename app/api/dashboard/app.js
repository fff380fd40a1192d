// crowdtally dashboard: plain JS, no external assets. Reads the API with the key given.
"use strict";
const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const params = new URLSearchParams(location.search);
let timer = null;
const samples = []; // [time s, n_labels]

function el(name, attrs, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

async function api(path) {
  const r = await fetch(path, { headers: { Authorization: "Bearer " + $("key").value } });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error ? body.error.message : r.statusText);
  return body;
}

function bars(svg, values, labels, opts = {}) {
  svg.replaceChildren();
  const w = +svg.getAttribute("width"), h = +svg.getAttribute("height") - 16;
  const max = Math.max(1, ...values);
  const bw = w / values.length;
  values.forEach((v, i) => {
    const bh = (h - 4) * v / max;
    const r = el("rect", { class: "bar", x: i * bw + 1, y: h - bh, width: Math.max(1, bw - 2), height: bh });
    r.appendChild(el("title", {}, `${labels[i]}: ${v}`));
    svg.appendChild(r);
  });
  const step = Math.ceil(labels.length / (opts.ticks || labels.length));
  labels.forEach((l, i) => {
    if (i % step === 0) svg.appendChild(el("text", { x: i * bw + 2, y: h + 12 }, l));
  });
}

function line(svg, points) {
  svg.replaceChildren();
  const w = +svg.getAttribute("width"), h = +svg.getAttribute("height") - 14;
  if (points.length < 2) { svg.appendChild(el("text", { x: 4, y: 20 }, "collecting…")); return; }
  const t0 = points[0][0], t1 = points[points.length - 1][0];
  const max = Math.max(1, ...points.map((p) => p[1]));
  const d = points.map((p, i) => `${i ? "L" : "M"}${(w - 4) * (p[0] - t0) / Math.max(1e-9, t1 - t0) + 2},${h - (h - 6) * p[1] / max}`).join(" ");
  svg.appendChild(el("path", { d, fill: "none", stroke: "#3b6fd8", "stroke-width": 2 }));
  svg.appendChild(el("text", { x: 4, y: h + 11 }, `max ${max.toFixed(0)} labels/s`));
}

function heatmap(matrix, classes) {
  const k = classes.length, cell = Math.max(8, Math.min(18, Math.floor(120 / k)));
  const svg = el("svg", { class: "heatmap", width: k * cell, height: k * cell, role: "img" });
  classes.forEach((t, i) => classes.forEach((a, j) => {
    const p = matrix[t][a];
    const light = Math.round(97 - 60 * p);
    const r = el("rect", { x: j * cell, y: i * cell, width: cell - 1, height: cell - 1, fill: `hsl(220, 70%, ${light}%)` });
    r.appendChild(el("title", {}, `true ${t}, answered ${a}: ${p.toFixed(3)}`));
    svg.appendChild(r);
  }));
  return svg;
}

function reliability(svg, report) {
  // observed accuracy (y) against mean confidence (x) per bin, on the gold items; the
  // diagonal is perfect calibration
  svg.replaceChildren();
  const w = +svg.getAttribute("width"), h = +svg.getAttribute("height");
  const pad = 28, size = Math.min(w, h) - pad - 6;
  const x = (v) => pad + size * v, y = (v) => 6 + size * (1 - v);
  svg.appendChild(el("rect", { x: pad, y: 6, width: size, height: size, fill: "none", stroke: "#bbb" }));
  svg.appendChild(el("path", { d: `M${x(0)},${y(0)} L${x(1)},${y(1)}`, stroke: "#999", "stroke-dasharray": "4 3" }));
  svg.appendChild(el("text", { x: pad, y: h - 4 }, "confidence →"));
  svg.appendChild(el("text", { x: 2, y: 16 }, "acc."));
  if (!report.n_gold) {
    svg.appendChild(el("text", { x: pad + 8, y: 40 }, "no gold items yet"));
    return;
  }
  for (const b of report.bins.filter((b) => b.n > 0)) {
    const c = el("circle", { cx: x(b.confidence), cy: y(b.accuracy), r: 3 + Math.min(6, Math.sqrt(b.n) / 2), fill: "#3b6fd8", "fill-opacity": 0.7 });
    c.appendChild(el("title", {}, `${b.n} items at ${b.lower.toFixed(1)}–${b.upper.toFixed(1)}: confidence ${b.confidence.toFixed(3)}, accuracy ${b.accuracy.toFixed(3)}`));
    svg.appendChild(c);
  }
}

function renderCalibration(report) {
  $("calibration-text").textContent = report.n_gold
    ? `(${report.n_gold} gold items: ECE ${report.ece.toFixed(1)} points, accuracy ${(100 * report.accuracy).toFixed(1)}%)`
    : "(post gold answers to see it)";
  reliability($("reliability"), report);
}

function render(s) {
  const st = s.stats;
  $("n-labels").textContent = st.n_labels.toLocaleString();
  $("n-items").textContent = st.n_items.toLocaleString();
  $("n-workers").textContent = st.n_workers.toLocaleString();
  $("lag").textContent = st.lag;
  const now = Date.now() / 1000;
  samples.push([now, st.n_labels]);
  while (samples.length > 31) samples.shift();
  const rates = [];
  for (let i = 1; i < samples.length; i++) {
    rates.push([samples[i][0], Math.max(0, (samples[i][1] - samples[i - 1][1]) / (samples[i][0] - samples[i - 1][0]))]);
  }
  const minute = samples.filter((p) => p[0] >= now - 60);
  $("rate").textContent = minute.length > 1
    ? ((minute[minute.length - 1][1] - minute[0][1]) / (minute[minute.length - 1][0] - minute[0][0])).toFixed(1) : "–";
  line($("throughput"), rates);
  const h = s.confidence_histogram;
  bars($("confidence-histogram"), h.counts, h.edges.slice(0, -1).map((e) => e.toFixed(2)), { ticks: 5 });
  bars($("label-counts"), s.labels.map((l) => s.label_counts[l]), s.labels);
  $("queue-size").textContent = `${s.queue_size.toLocaleString()} items still need labels`;
  const qbody = $("queue").querySelector("tbody");
  qbody.replaceChildren();
  for (const q of s.queue) {
    const tr = document.createElement("tr");
    for (const c of [q.item, q.score.toFixed(4), q.label, q.probability.toFixed(3), q.n_labels]) {
      const td = document.createElement("td"); td.textContent = c; tr.appendChild(td);
    }
    qbody.appendChild(tr);
  }
  const tbody = $("workers").querySelector("tbody");
  tbody.replaceChildren();
  for (const w of s.workers) {
    const tr = document.createElement("tr");
    if (w.likely_spammer) tr.className = "spammer";
    const cells = [w.worker, w.n_labels, w.accuracy.toFixed(3), w.informativeness.toFixed(3),
      w.gold_accuracy === null ? "–" : w.gold_accuracy.toFixed(3)];
    for (const c of cells) { const td = document.createElement("td"); td.textContent = c; tr.appendChild(td); }
    const td = document.createElement("td");
    td.appendChild(heatmap(w.confusion, s.labels));
    tr.appendChild(td);
    tbody.appendChild(tr);
  }
  $("status").textContent = `project ${s.project}: log position ${st.log_end}, computed ${s.computed_at}`;
  $("status").className = "";
  $("overview").hidden = false;
}

let refreshes = 0;
async function refresh() {
  try {
    const project = encodeURIComponent($("project").value);
    render(await api(`/v1/projects/${project}/summary`));
    if (refreshes++ % 5 === 0) renderCalibration(await api(`/v1/projects/${project}/calibration`));
  } catch (e) {
    $("status").textContent = "error: " + e.message;
    $("status").className = "error";
  }
}

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
  samples.length = 0;
  refreshes = 0;
  clearInterval(timer);
  refresh();
  timer = setInterval(refresh, 2000);
});

$("key").value = params.get("key") || localStorage.getItem("crowdtally-key") || "";
$("project").value = params.get("project") || localStorage.getItem("crowdtally-project") || "";
if ($("key").value) listProjects();
if ($("key").value && $("project").value) $("connect").requestSubmit();
