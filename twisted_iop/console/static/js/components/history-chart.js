// <iop-history-chart>: capacity against in flight and queued over time,
// and latency, for the fleet (scope="fleet") or one edge (edge-id), from
// GET /fleet/history or GET /edges/{id}/history: one chart for the general
// lane, one for the long-context lane, one for the TTFT and TPOT p95s (in
// ms; on a rolled-up tier each step's max, the highest p95 sampled: p95s
// do not average) and one for requests per second, plain SVG
// (../svg-chart.js). A
// range picker (1 h, 6 h, 24 h, 7 d: the server picks the tier) and a model
// picker (the models with a series: the view's `models`) choose what is
// drawn. Live: re-fetched every sampling interval (the view's
// interval_seconds; `refresh-interval` overrides), so new points appear.
// Hovering shows the values at that time (on a rolled-up tier: the mean,
// and the max). A missing value (a p95 of a minute in which no request
// ended) or a gap in sampling (an edge that was not connected) lifts the pen. The time axis is the range, from the first
// point when the history is younger than the range (and then, if the
// server chose a rolled-up tier for the range, every sample since the
// first point is asked for instead: a new Control Plane shows its first
// minutes sample by sample, not as one partial point).
//
// Attributes: scope ("fleet") or edge-id, range (1h, 6h, 24h, 7d), api-base, refresh-interval.
// Events: iop-history-loaded {view}; iop-auth-required {code, message}.

import { edgePath } from "../api.js";
import { IopElement, esc, formatTime } from "../base.js";
import { HEIGHT, PAD, WIDTH, chartSvg, nearestIndex, shortNumber } from "../svg-chart.js";

/** The ranges offered, as the server's relative `from`. */
export const RANGES = [["1h", "1 h"], ["6h", "6 h"], ["24h", "24 h"], ["7d", "7 d"]];

/**
 * The lanes and what each draws: fields as [field, label, tone, dashed]; `scale` multiplies the
 * view's values (seconds to ms), `unit` follows them, `rolled` is the part of a rolled-up point drawn.
 */
const LANES = [
  { id: "general", title: "General", fields: [["capacity", "capacity", "cap", true], ["in_flight", "in flight", "flight"], ["queued", "queued", "queued"]] },
  {
    id: "long_context",
    title: "Long context",
    fields: [["long_context_capacity", "capacity", "cap", true], ["long_context_in_flight", "in flight", "flight"], ["long_context_queued", "queued", "queued"]],
  },
  { id: "latency", title: "Latency p95", unit: " ms", scale: 1000, rolled: "max", fields: [["ttft_p95", "TTFT", "ttft"], ["tpot_p95", "TPOT", "tpot"]] },
  { id: "requests", title: "Requests", unit: "/s", fields: [["requests_per_second", "ended", "rate"]] },
];
const FIELDS = LANES.flatMap((lane) => lane.fields.map((f) => f[0]));
/** A rolled-up view whose first point is within this many samples of now is asked again sample by sample. */
const YOUNG_POINTS = 500;

const CSS = `
.controls { display: flex; gap: 6px; align-items: center; flex-wrap: wrap; }
.ranges { display: inline-flex; border: 1px solid var(--_border); border-radius: 7px; overflow: hidden; }
.ranges button { background: transparent; color: var(--_fg); border-radius: 0; padding: 3px 9px; font-weight: 500; font-size: 12.5px; }
.ranges button[aria-pressed="true"] { background: var(--_accent); color: #fff; }
select { font-size: 12.5px; padding: 3px 6px; }
.lanes { display: grid; grid-template-columns: minmax(0, 1fr); gap: 8px; }
:host(:not([compact])) .lanes { grid-template-columns: repeat(2, minmax(0, 1fr)); }
.lane { position: relative; }
.lane h3 { margin: 4px 0 2px; display: flex; gap: 10px; align-items: baseline; flex-wrap: wrap; }
.legend { font-size: 11.5px; text-transform: none; letter-spacing: 0; font-weight: 500; display: inline-flex; gap: 10px; flex-wrap: wrap; }
.legend i { display: inline-block; width: 12px; height: 3px; border-radius: 2px; vertical-align: middle; margin-right: 4px; }
svg { width: 100%; height: auto; display: block; overflow: visible; }
.grid { stroke: var(--_border); stroke-width: 1; }
.axis { fill: var(--_muted); font-size: 10.5px; font-variant-numeric: tabular-nums; }
.line { fill: none; stroke-width: 2; stroke-linejoin: round; stroke-linecap: round; }
.line.dashed { stroke-dasharray: 5 3; stroke-width: 1.6; }
.cap { stroke: var(--_muted); } .flight { stroke: var(--_accent); } .queued { stroke: var(--_warn); }
.dot.cap { fill: var(--_muted); } .dot.flight { fill: var(--_accent); } .dot.queued { fill: var(--_warn); }
i.cap { background: var(--_muted); } i.flight { background: var(--_accent); } i.queued { background: var(--_warn); }
.ttft { stroke: var(--_bad); } .tpot { stroke: var(--_accent); } .rate { stroke: var(--_ok); }
.dot.ttft { fill: var(--_bad); } .dot.tpot { fill: var(--_accent); } .dot.rate { fill: var(--_ok); }
i.ttft { background: var(--_bad); } i.tpot { background: var(--_accent); } i.rate { background: var(--_ok); }
.cursor { stroke: var(--_muted); stroke-width: 1; stroke-dasharray: 2 2; }
.hover { fill: transparent; }
.tip { position: absolute; pointer-events: none; background: var(--_bg); border: 1px solid var(--_border); border-radius: 7px;
  padding: 5px 8px; font-size: 12px; box-shadow: 0 2px 8px rgb(0 0 0 / .18); white-space: nowrap; z-index: 2; }
.tip b { font-variant-numeric: tabular-nums; }
.note { font-size: 12px; color: var(--_muted); }
`;

/** A value in a lane's unit as read: whole ms from 10 ms up (the sketches are good to 2 %), then the unit. */
function laneText(value, lane) {
  if (value === null || value === undefined) return "—";
  return (lane.scale && Math.abs(value) >= 10 ? String(Math.round(value)) : shortNumber(value)) + (lane.unit || "");
}

/** A view's value in a lane's unit (ms for seconds), to a thousandth; null stays null. */
export function scaled(value, lane) {
  if (value === null || value === undefined) return null;
  return lane.scale ? Math.round(value * lane.scale * 1000) / 1000 : value;
}

export class IopHistoryChart extends IopElement {
  static observedAttributes = ["scope", "edge-id", "range", "api-base", "refresh-interval"];

  constructor() {
    super(CSS);
    this.model = "";
    this.view = null;
    this._intervalMs = 0;
    const ranges = RANGES.map(([value, label]) => `<button type="button" data-range="${value}" aria-pressed="false">${label}</button>`).join("");
    this.root.innerHTML = `
      <section class="panel" aria-labelledby="history-title">
        <div class="head"><h2 id="history-title">Capacity</h2><span class="spacer"></span>
          <div class="controls">
            <select data-model aria-label="Model"><option value="">all models</option></select>
            <span class="ranges" role="group" aria-label="Time range">${ranges}</span>
          </div></div>
        <div class="error" data-error hidden role="alert"></div>
        <div class="lanes" data-lanes></div>
        <div class="note" data-note aria-live="polite"></div>
      </section>`;
    this.root.querySelector(".ranges").addEventListener("click", (e) => {
      const button = e.target.closest("button[data-range]");
      if (button) this.setAttribute("range", button.dataset.range);
    });
    this.root.querySelector("[data-model]").addEventListener("change", (e) => {
      this.model = e.target.value;
      this.reload();
    });
    this.root.querySelector("[data-lanes]").addEventListener("pointermove", (e) => this.hover(e));
    this.root.querySelector("[data-lanes]").addEventListener("pointerleave", () => this.unhover());
  }

  /** The range shown ("1h" unless the attribute says another offered one). */
  get range() {
    const value = this.getAttribute("range") || "1h";
    return RANGES.some(([r]) => r === value) ? value : "1h";
  }

  /** Poll at the sampling interval once known (the attribute, when set, wins). */
  get refreshIntervalMs() {
    if (this.getAttribute("refresh-interval") !== null) return super.refreshIntervalMs;
    return this._intervalMs || 5000;
  }

  /** No live subscription: the history changes once per sample, and is polled at that pace. */
  liveEdgeId() {
    return null;
  }

  get path() {
    if (this.getAttribute("scope") === "fleet") return "/fleet/history";
    return this.edgeId ? edgePath(this.edgeId, "history") : "";
  }

  start() {
    if (this.getAttribute("scope") !== "fleet" && this._shownEdge !== this.edgeId) this.model = "";
    this._shownEdge = this.edgeId;
    for (const button of this.root.querySelectorAll("button[data-range]")) button.setAttribute("aria-pressed", String(button.dataset.range === this.range));
    super.start();
  }

  async load() {
    const path = this.path;
    if (!path) return;
    const query = new URLSearchParams({ from: `-${this.range}`, series: FIELDS.join(",") });
    if (this.model) query.set("model", this.model);
    const asked = (this._asked = `${path}?${query}`);
    let view = await this.fetchJson(asked);
    if (this._asked !== asked) return; // the edge, range or model changed meanwhile
    const first = view.points.length ? view.points[0][0] : null;
    if (view.rolled_up && first !== null && Date.parse(view.end) / 1000 - first <= YOUNG_POINTS * view.interval_seconds) {
      // History younger than the range: every sample since the first point, not a few rolled-up ones.
      query.set("from", String(first - view.step_seconds));
      query.set("to", view.end);
      query.set("step", String(view.interval_seconds));
      view = await this.fetchJson(`${path}?${query}`);
      if (this._asked !== asked) return;
    }
    this.clearError();
    this.view = view;
    this.render(view);
    const interval = Math.max(1000, Math.round((view.interval_seconds || 5) * 1000));
    if (interval !== this._intervalMs && this.getAttribute("refresh-interval") === null) {
      this._intervalMs = interval;
      clearInterval(this._pollTimer);
      this._pollTimer = setInterval(() => this.refresh(), interval);
    }
    this.emit("iop-history-loaded", { view });
  }

  /** The points of one column as [[t, value], ...] in the lane's unit (a rolled-up tier: its mean, or the lane's part). */
  column(view, field, lane = {}) {
    const name = view.rolled_up ? `${field}.${lane.rolled || "mean"}` : field;
    const at = view.columns.indexOf(name);
    return view.points.map((p) => [p[0], scaled(at < 0 ? null : p[at], lane)]);
  }

  /**
   * The time axis: the view's range, but from its first point (less a
   * step) when the history is younger than the range, so a new Control
   * Plane's first minutes are not a sliver at the right edge.
   */
  span(view) {
    const end = Date.parse(view.end) / 1000;
    let start = Date.parse(view.start) / 1000;
    if (view.points.length) start = Math.max(start, view.points[0][0] - view.step_seconds);
    return { start: Math.min(start, end - view.step_seconds), end };
  }

  render(view) {
    const scope = this.getAttribute("scope") === "fleet" ? "Fleet" : `Edge ${this.edgeId}`;
    this.root.querySelector("#history-title").textContent = `${scope} capacity${this.model ? ` · ${this.model}` : ""}`;
    const select = this.root.querySelector("[data-model]");
    const models = [...new Set([...(view.models || []), ...(this.model ? [this.model] : [])])].sort();
    const options = `<option value="">all models</option>${models.map((m) => `<option value="${esc(m)}">${esc(m)}</option>`).join("")}`;
    if (select.innerHTML !== options) select.innerHTML = options;
    select.value = this.model;
    const { start, end } = this.span(view);
    this.root.querySelector("[data-lanes]").innerHTML = LANES.map((lane) => {
      const lines = lane.fields.map(([field, label, tone, dashed]) => ({ field, label, tone, dashed, points: this.column(view, field, lane) }));
      const legend = lines
        .map((line) => {
          const last = [...line.points].reverse().find((p) => p[1] !== null && p[1] !== undefined);
          return `<span><i class="${line.tone}"></i>${esc(line.label)} <b data-last="${esc(line.field)}">${esc(last ? laneText(last[1], lane) : "—")}</b></span>`;
        })
        .join("");
      const drawn = lines.map((line) => line.label).join(", ");
      return `<div class="lane" data-lane="${lane.id}"><h3>${esc(lane.title)} <span class="legend">${legend}</span></h3>
        ${chartSvg({ lines, start, end, step: view.step_seconds, title: `${scope} ${lane.title.toLowerCase()}: ${drawn}` })}</div>`;
    }).join("");
    const tier = view.rolled_up
      ? `one point per ${shortNumber(view.step_seconds)} s (the mean, the p95s' max; the other in the tooltip)`
      : `a sample every ${shortNumber(view.step_seconds)} s`;
    this.root.querySelector("[data-note]").textContent = view.points.length
      ? `${view.points.length} points, ${tier}; updated ${formatTime(new Date().toISOString()).slice(11)}`
      : "No history in this range yet.";
  }

  hover(event) {
    const view = this.view;
    const svg = event.target.closest?.("svg");
    if (!view || !svg || !view.points.length) return this.unhover();
    const box = svg.getBoundingClientRect();
    const { start, end } = this.span(view);
    const fx = ((event.clientX - box.left) / box.width) * WIDTH;
    const t = start + ((fx - PAD.left) / (WIDTH - PAD.left - PAD.right)) * (end - start);
    const times = view.points.map((p) => p[0]);
    const index = nearestIndex(times, t);
    if (index < 0) return this.unhover();
    const lane = LANES.find((l) => l.id === svg.closest(".lane").dataset.lane);
    const point = view.points[index];
    const text = (value) => laneText(scaled(value, lane), lane);
    const rows = lane.fields
      .map(([field, label]) => {
        if (view.rolled_up) {
          const mean = point[view.columns.indexOf(`${field}.mean`)];
          const most = point[view.columns.indexOf(`${field}.max`)];
          if (lane.rolled === "max") return `<div>${esc(label)} <b>${esc(text(most))}</b> <span class="muted">mean ${esc(text(mean))}</span></div>`;
          return `<div>${esc(label)} <b>${esc(text(mean))}</b> <span class="muted">max ${esc(text(most))}</span></div>`;
        }
        return `<div>${esc(label)} <b>${esc(text(point[view.columns.indexOf(field)]))}</b></div>`;
      })
      .join("");
    const x = PAD.left + ((point[0] - start) / (end - start)) * (WIDTH - PAD.left - PAD.right);
    for (const cursor of this.root.querySelectorAll("[data-cursor]")) {
      cursor.setAttribute("x1", x);
      cursor.setAttribute("x2", x);
      cursor.setAttribute("visibility", "visible");
    }
    let tip = this.root.querySelector(".tip");
    if (!tip) {
      tip = document.createElement("div");
      tip.className = "tip";
      tip.setAttribute("role", "tooltip");
    }
    const laneBox = svg.closest(".lane");
    laneBox.append(tip);
    tip.innerHTML = `<div class="muted">${esc(formatTime(new Date(point[0] * 1000).toISOString()))}</div>${rows}`;
    const left = (x / WIDTH) * box.width;
    tip.style.left = `${Math.min(Math.max(0, left + 10), box.width - 150)}px`;
    tip.style.top = `${(HEIGHT / 4 / HEIGHT) * box.height + 20}px`;
  }

  unhover() {
    this.root.querySelector(".tip")?.remove();
    for (const cursor of this.root.querySelectorAll("[data-cursor]")) cursor.setAttribute("visibility", "hidden");
  }
}

customElements.define("iop-history-chart", IopHistoryChart);
