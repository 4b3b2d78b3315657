// <iop-slos>: every SLO of the Control Plane (GET /slos; see docs/slos.md),
// one row each: name, metric and percentile, objective, model, edge
// selector, window, the value over the window, the error budget left and
// the alerts firing (highlighted). Polled like the other panels;
// slo.* events on the fleet stream re-read it at once.
//
// Attributes: api-base, wire-url, refresh-interval.
// Events: iop-slos-loaded {slos}; iop-auth-required {code, message}.

import { ApiError } from "../api.js";
import { IopElement, badge, esc, latencyText } from "../base.js";

/** Below this share of its budget left an SLO's budget shows as a warning. */
export const BUDGET_WARN_BELOW = 0.25;

const CSS = `
.list { width: 100%; }
.list tr[data-firing] td { background: var(--_bad-bg); }
.list tr[data-firing] td:first-child { box-shadow: inset 3px 0 0 var(--_bad); }
.alerts { display: flex; gap: 4px; flex-wrap: wrap; }
`;

export class IopSlos extends IopElement {
  static observedAttributes = ["api-base", "wire-url", "refresh-interval"];

  constructor() {
    super(CSS);
    this.slos = [];
    this.root.innerHTML = `
      <section class="panel" aria-labelledby="slos-title">
        <div class="head"><h2 id="slos-title">SLOs</h2><span class="spacer"></span><span class="small muted" data-count></span></div>
        <div class="error" data-error hidden role="alert"></div>
        <div data-list><p class="empty" data-empty>No SLOs.</p></div>
      </section>`;
  }

  /** The fleet stream: SLO alerts are fleet events, with no edge. */
  liveEdgeId() {
    return "";
  }

  onLiveEvent(event) {
    if (/^slo\./.test(event.kind || "")) this.refreshSoon();
  }

  async load() {
    let page;
    try {
      page = await this.fetchJson("/slos");
    } catch (error) {
      // A Control Plane from before SLOs: say so once and stop asking.
      if (!(error instanceof ApiError) || error.code !== "not_found") throw error;
      this.stop();
      this.root.querySelector("[data-list]").innerHTML = `<p class="empty" data-unavailable>This Control Plane has no SLOs view (GET /slos answers 404).</p>`;
      return;
    }
    this.slos = Array.isArray(page.items) ? page.items : [];
    this.clearError();
    this.root.querySelector("[data-count]").textContent = `${this.slos.length}`;
    this.renderList();
    this.emit("iop-slos-loaded", { slos: this.slos });
  }

  renderList() {
    const holder = this.root.querySelector("[data-list]");
    if (!this.slos.length) {
      holder.innerHTML = `<p class="empty" data-empty>No SLOs.</p>`;
      return;
    }
    const rows = this.slos
      .map((slo) => {
        const spec = slo.spec || {};
        const firing = (slo.alerts || []).filter((a) => a.state === "firing");
        const alerts = firing.length
          ? firing.map((a) => `<span data-alert="${esc(a.name)}" title="burn rate >= ${esc(a.burn_rate_threshold)} over ${esc(a.long_window)} and ${esc(a.short_window)}">${badge("failed", `${a.name} firing`)}</span>`).join("")
          : `<span class="muted">none</span>`;
        return `<tr data-slo="${esc(slo.name)}"${firing.length ? ` data-firing="${esc(firing.map((a) => a.name).join(" "))}"` : ""}>
          <td><b>${esc(slo.name)}</b></td>
          <td data-metric>${esc(metricText(spec))}</td>
          <td data-objective>${esc(objectiveText(spec))}</td>
          <td>${esc(spec.model || "")}</td>
          <td class="mono small">${esc(spec.edge_selector || "(every edge)")}</td>
          <td>${esc(spec.window || "")}</td>
          <td class="num" data-value>${esc(valueText(slo))}</td>
          <td class="num" data-budget>${budgetText(slo.error_budget_remaining)}</td>
          <td><div class="alerts" data-alerts>${alerts}</div></td></tr>`;
      })
      .join("");
    holder.innerHTML = `<div class="scroll"><table class="list" aria-label="SLOs">
      <thead><tr><th>SLO</th><th>Metric</th><th>Objective</th><th>Model</th><th>Edges</th><th>Window</th><th class="num">Value</th><th class="num">Budget left</th><th>Alerts firing</th></tr></thead>
      <tbody>${rows}</tbody></table></div>`;
  }
}

/** "ttft p95", or "error_ratio". */
function metricText(spec) {
  return spec.metric === "error_ratio" ? "error_ratio" : `${spec.metric || ""} p${Number(spec.percentile)}`;
}

/** "<= 500 ms", or "<= 1% errors". */
function objectiveText(spec) {
  if (spec.metric === "error_ratio") return `<= ${percent(spec.objective_ratio)} errors`;
  return `<= ${latencyText(spec.objective_seconds)}`;
}

/** The SLO's value over its window ("—" before the first request). */
function valueText(slo) {
  if (slo.value == null) return "—";
  return slo.value_unit === "ratio" ? percent(slo.value) : latencyText(slo.value);
}

/** The error budget left as a badge: ok, a warning below BUDGET_WARN_BELOW, bad when spent. */
function budgetText(remaining) {
  if (remaining == null || !Number.isFinite(Number(remaining))) return "—";
  const value = Number(remaining);
  const tone = value <= 0 ? "failed" : value < BUDGET_WARN_BELOW ? "degraded" : "ok";
  return badge(tone, percent(value));
}

/** A ratio as a percent, to at most two decimals ("99.5%"). */
function percent(ratio) {
  return `${Number((Number(ratio) * 100).toFixed(2))}%`;
}

customElements.define("iop-slos", IopSlos);
