// kvgate's fleet page. It polls the admin listener's JSON each second and
// rebuilds the view from it. Everything it shows comes from configuration and
// scraped metrics, so it builds the DOM with textContent and attributes only,
// never with HTML strings.
"use strict";

const POLL_MS = 1000;
const FETCH_TIMEOUT_MS = 3000; // a stuck request must not stop the page
const SHOWN_DECISIONS = 6;
// The order x-kvgate-explain uses (schedule.ScoreNames).
const SCORE_ORDER = ["queue", "kvCache", "prefix", "loraAffinity", "runningRequests", "prefillQueue",
  "errorRate", "predictedLatency", "sessionAffinity", "inFlight"];

const opened = new Set(); // decisions the user opened, by key
const closed = new Set(); // newest decisions the user closed

function el(tag, attrs, ...children) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null && v !== false) n.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    n.append(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
  return n;
}

function svg(tag, attrs) {
  const n = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, String(v));
  return n;
}

function seconds(s) {
  if (!s) return "–";
  if (s < 1) return Math.round(s * 1000) + " ms";
  return s.toFixed(s < 10 ? 2 : 1) + " s";
}
function pct(v) { return Math.round(v * 100) + "%"; }
function num(v, digits) {
  if (v === undefined || v === null) return "–";
  return Number.isInteger(v) ? String(v) : v.toFixed(digits === undefined ? 1 : digits);
}
function clock(iso) {
  const d = new Date(iso);
  return d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

// The admin token (--admin-auth token or kubernetes), kept for this tab only.
const TOKEN_KEY = "kvgate-admin-token";

// login shows the token field after a 401 and keeps what is entered.
function login() {
  const form = document.getElementById("login");
  if (!form.hidden) return;
  form.hidden = false;
  form.onsubmit = ev => {
    ev.preventDefault();
    const v = document.getElementById("token").value.trim();
    if (v) sessionStorage.setItem(TOKEN_KEY, v);
    form.hidden = true;
  };
}

async function getJSON(path) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
  const token = sessionStorage.getItem(TOKEN_KEY);
  try {
    const r = await fetch(path, { cache: "no-store", signal: ctl.signal,
      headers: token ? { Authorization: "Bearer " + token } : {} });
    if (r.status === 401) login();
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return await r.json();
  } finally {
    clearTimeout(timer);
  }
}

// health is an endpoint's state as one badge. One never scraped is
// unhealthy once a scrape has failed (nothing answers there), and only "not
// scraped" while its first scrape is still to come.
function health(e) {
  if (e.ejectedForMs > 0) return ["ejected " + Math.ceil(e.ejectedForMs / 1000) + "s", "bad"];
  if (!e.scraped && (e.scrapeErrors > 0 || e.lastError)) return ["unhealthy", "bad"];
  if (!e.scraped) return ["not scraped", "idle"];
  if (!e.healthy) return ["unhealthy", "bad"];
  if (e.stale) return ["stale", "warn"];
  return ["healthy", "ok"];
}

function speed(s) {
  if (!s || !s.samples) return el("span", { class: "sub" }, "learning");
  const text = seconds(s.baseSeconds) + " + " + seconds(s.secondsPerKToken) + "/1k";
  if (s.borrowed) return el("span", { class: "sub", title: "the pool's median until it has 5 answers of its own" }, text + " (pool)");
  return el("span", { title: s.samples + " answers taught it" }, text);
}

function kvBar(v) {
  const bar = el("span", { class: "bar" }, el("i", { class: v > 0.85 ? "hot" : null }));
  bar.firstChild.style.width = Math.min(100, Math.max(0, v * 100)).toFixed(0) + "%";
  return el("span", {}, bar, pct(v));
}

function cell(label, ...content) { return el("td", { "data-label": label }, ...content); }

function endpointTable(s) {
  const head = el("tr", {}, ...["Endpoint", "Health", "Age", "Queue", "Running", "In flight", "KV cache",
    "Prefix blocks", "Learned speed", "Req/s", "TTFT p50", "TTFT p95"].map(h => el("th", {}, h)));
  const rows = s.endpoints.map(e => {
    const [h, cls] = health(e);
    const m = e.lastMinute || {};
    return el("tr", { "data-endpoint": e.address },
      cell("Endpoint", e.address),
      cell("Health", el("span", { class: "badge " + cls, title: e.lastError || null }, h)),
      cell("Age", e.scraped ? seconds(e.ageMs / 1000) : "–"),
      cell("Queue", num(e.waiting)),
      cell("Running", num(e.running)),
      cell("In flight", num(e.inFlight) + (e.peerInFlight ? " (+" + e.peerInFlight + " peers)" : "")),
      cell("KV cache", kvBar(e.kvUsage || 0)),
      cell("Prefix blocks", num(e.prefixBlocks)),
      cell("Learned speed", speed(e.speed)),
      cell("Req/s", el("span", { "data-num": "rps" }, (m.requestsPerSecond || 0).toFixed(1))),
      cell("TTFT p50", el("span", { "data-num": "p50" }, seconds(m.ttftP50Seconds))),
      cell("TTFT p95", seconds(m.ttftP95Seconds)));
  });
  for (const r of rows) r.firstChild.className = "addr";
  return el("table", { class: "cards endpoints" }, el("thead", {}, head), el("tbody", {}, ...rows));
}

// chart draws an endpoint's last minute of TTFT, p50 solid and p95 dashed;
// seconds without a streamed answer are gaps.
function chart(e) {
  const series = (e.lastMinute || {}).ttftSeries || { p50: [], p95: [], samples: [] };
  const W = 300, H = 70, top = 10, bottom = 12;
  const peak = Math.max(0.01, ...series.p95, ...series.p50);
  const n = Math.max(series.p50.length, 2);
  const x = i => (i / (n - 1)) * W;
  const y = v => top + (1 - v / peak) * (H - top - bottom);
  const g = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": "TTFT over the last minute at " + e.address });
  g.append(svg("line", { class: "grid", x1: 0, x2: W, y1: y(peak), y2: y(peak) }),
    svg("line", { class: "grid", x1: 0, x2: W, y1: y(0), y2: y(0) }));
  for (const key of ["p95", "p50"]) {
    // Runs of seconds with samples are lines; a lone one is a dot.
    let run = [];
    const flush = () => {
      if (run.length === 1) g.append(svg("circle", { class: "dot-" + key, cx: run[0][0], cy: run[0][1], r: 2 }));
      if (run.length > 1) g.append(svg("path", { class: key, d: "M" + run.map(p => p.join(" ")).join("L") }));
      run = [];
    };
    series[key].forEach((v, i) => {
      if (!series.samples[i]) { flush(); return; }
      run.push([x(i).toFixed(1), y(v).toFixed(1)]);
    });
    flush();
  }
  if (!series.samples.some(n => n > 0)) {
    const none = svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" });
    none.textContent = "no streamed answer in the last minute";
    g.append(none);
  }
  const max = svg("text", { x: 2, y: 8 });
  max.textContent = series.samples.some(n => n > 0) ? seconds(peak) : "";
  const ago = svg("text", { x: 2, y: H - 2 });
  ago.textContent = "−60 s";
  const now = svg("text", { x: W - 2, y: H - 2, "text-anchor": "end" });
  now.textContent = "now";
  g.append(max, ago, now);
  const m = e.lastMinute || {};
  return el("div", { class: "chart", "data-chart": e.address },
    el("div", { class: "title" }, el("span", { class: "addr", title: e.address }, e.address),
      el("span", { class: "sub" }, "p50 " + seconds(m.ttftP50Seconds) + " · p95 " + seconds(m.ttftP95Seconds))),
    g);
}

// margin is the winner's score and the runner-up's, which say how close the pick was.
function margin(d) {
  const w = d.candidates.find(c => c.address === d.winner);
  const next = d.candidates.find(c => c.address !== d.winner);
  if (!w) return "";
  return "  score " + w.score.toFixed(2) + (next ? " vs " + next.score.toFixed(2) : "");
}

function decisionKey(sched, d) { return sched + "|" + d.time + "|" + (d.requestId || ""); }

function decisionView(sched, d, newest) {
  const key = decisionKey(sched, d);
  const names = [];
  for (const c of d.candidates) for (const k of Object.keys(c.scores || {})) if (!names.includes(k)) names.push(k);
  names.sort((a, b) => (SCORE_ORDER.indexOf(a) + 1 || 99) - (SCORE_ORDER.indexOf(b) + 1 || 99));
  const predicted = d.candidates.some(c => c.predictedTtftSeconds);
  const head = el("tr", {}, el("th", {}, "Candidate"), el("th", {}, "Score"),
    ...names.map(n => el("th", {}, n)), predicted ? el("th", {}, "Predicted TTFT") : null);
  const rows = d.candidates.map((c, i) => el("tr", { class: c.address === d.winner ? "win" : null },
    cell("Candidate", (i + 1) + ". " + c.address + (c.address === d.winner ? " ✓" : "")),
    cell("Score", (c.score || 0).toFixed(3)),
    ...names.map(n => cell(n, c.scores && n in c.scores ? num(c.scores[n], 3) : "–")),
    predicted ? cell("Predicted TTFT", seconds(c.predictedTtftSeconds)) : null));
  for (const r of rows) r.firstChild.className = "addr";
  const open = opened.has(key) || (newest && !closed.has(key));
  const det = el("details", { class: "decision", open: open, "data-decision": key },
    el("summary", {}, el("span", { class: "when" }, clock(d.time)),
      "→ ", el("span", { class: "winner" }, d.winner),
      el("span", { class: "sub" }, margin(d)),
      el("span", { class: "sub" }, "  " + d.model + " · " + d.considered + " considered" + (d.requestId ? " · " + d.requestId : ""))),
    el("div", {}, el("table", { class: "cards scores" }, el("thead", {}, head), el("tbody", {}, ...rows))));
  // Rendering it open fires a toggle too: only the user's toggles count.
  let rendered = !open;
  det.addEventListener("toggle", () => {
    if (!rendered) { rendered = true; return; }
    if (det.open) { opened.add(key); closed.delete(key); } else { opened.delete(key); closed.add(key); }
  });
  return det;
}

function chip(k, v, attrs) { return el("span", Object.assign({ class: "chip" }, attrs || {}), el("span", { class: "k" }, k), el("b", {}, v)); }

function schedulerView(s, sum, dec, windowSeconds) {
  const w = windowSeconds ? " (" + windowSeconds + " s)" : "";
  const chips = sum ? [
    chip("ready", sum.readyEndpoints + " / " + sum.endpoints),
    chip("requests" + w, String(sum.requests), { "data-num": "requests" }),
    chip("errors", pct(sum.errorRate)), chip("shed", pct(sum.shedRate)),
    chip("TTFT p50" + w, seconds(sum.ttftP50Seconds)), chip("p95", seconds(sum.ttftP95Seconds)),
    chip("in flight", String(sum.inFlight)), chip("queue", num(sum.waiting)), chip("KV", pct(sum.kvCacheUsage)),
  ] : [];
  const decisions = (dec && dec.decisions) || [];
  return el("section", { class: "sched", "data-scheduler": s.scheduler },
    el("div", { class: "sched-head" }, el("h2", {}, s.scheduler), el("span", { class: "model" }, s.model),
      (s.adapters || []).length ? el("span", { class: "sub" }, "adapters: " + s.adapters.join(", ")) : null,
      el("span", { class: "sub" }, "picker: " + s.picker)),
    el("div", { class: "chips" }, ...chips),
    el("h3", {}, "Endpoints"),
    s.endpoints.length ? endpointTable(s) : el("p", { class: "empty" }, "no endpoints"),
    el("h3", {}, "TTFT, last minute ", el("span", { class: "legend" }, el("span", { class: "l50" }), "p50", el("span", { class: "l95" }), "p95")),
    el("div", { class: "charts" }, ...s.endpoints.map(chart)),
    el("h3", {}, "Recent decisions"),
    decisions.length ? el("div", { class: "decisions" }, ...decisions.slice(0, SHOWN_DECISIONS).map((d, i) => decisionView(s.scheduler, d, i === 0)))
      : el("p", { class: "empty" }, "no decision yet"));
}

async function tick() {
  const status = document.getElementById("status");
  try {
    const [fleet, summary, decisions] = await Promise.all([getJSON("/debug/fleet"), getJSON("/summary"), getJSON("/debug/decisions")]);
    const sums = new Map((summary.models || []).map(m => [m.scheduler, m]));
    const decs = new Map((decisions || []).map(d => [d.scheduler, d]));
    const main = document.getElementById("fleet");
    main.replaceChildren(...(fleet.length ? fleet.map(s => schedulerView(s, sums.get(s.scheduler), decs.get(s.scheduler), summary.windowSeconds))
      : [el("p", { class: "empty" }, "no scheduler configured")]));
    const eps = fleet.reduce((n, s) => n + s.endpoints.length, 0);
    status.className = "status";
    status.textContent = fleet.length + " scheduler" + (fleet.length === 1 ? "" : "s") + " · " + eps + " endpoint" + (eps === 1 ? "" : "s") +
      (summary.draining ? " · draining" : "") + " · updated " + clock(summary.time || new Date().toISOString());
  } catch (err) {
    status.className = "status bad";
    status.textContent = "cannot read the gateway (" + (err && err.message ? err.message : "error") + "); retrying";
  } finally {
    setTimeout(tick, POLL_MS);
  }
}

tick();
