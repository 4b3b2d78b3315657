// <iop-fleet-overview>: every known edge with its connected state and the
// fleet totals, from GET /fleet/status; live through the fleet-wide
// subscription (re-fetched on edge.*, node.*, provider.*, operation.*
// events) and polled every `refresh-interval` seconds as a fallback.
//
// Attributes: api-base, wire-url, refresh-interval, selected (edge id).
// Events: iop-edge-select {edgeId} when a row is chosen;
//         iop-fleet-loaded {edges, totals} after each successful load;
//         iop-auth-required {code, message}.

import { IopElement, badge, counters, esc, formatTime } from "../base.js";

const CSS = `
ul { list-style: none; margin: 0; padding: 0; display: flex; flex-direction: column; gap: 6px; }
li button { width: 100%; text-align: left; background: var(--_bg); color: var(--_fg); border: 1px solid var(--_border);
  border-radius: 9px; padding: 8px 10px; display: grid; grid-template-columns: 1fr auto; gap: 2px 8px; font-weight: 400; }
li button:hover { border-color: var(--_accent); }
li button[aria-current="true"] { border-color: var(--_accent); box-shadow: inset 3px 0 0 var(--_accent); }
.name { font-weight: 600; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.sub { grid-column: 1 / -1; font-size: 12px; color: var(--_muted); display: flex; gap: 12px; flex-wrap: wrap; }
.totals { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 6px; margin-bottom: 10px; }
.stat { background: var(--_bg); border: 1px solid var(--_border); border-radius: 8px; padding: 6px 8px; }
.stale, .reason { grid-column: 1 / -1; font-size: 12px; overflow-wrap: anywhere; }
.stale { color: var(--_warn); }
.reason { color: var(--_bad); }
.stat:last-child:nth-child(odd) { grid-column: 1 / -1; }
.stat b { display: block; font-size: 17px; font-variant-numeric: tabular-nums; }
.stat span { font-size: 11.5px; color: var(--_muted); }
`;

export class IopFleetOverview extends IopElement {
  static observedAttributes = ["api-base", "wire-url", "refresh-interval", "selected"];

  constructor() {
    super(CSS);
    this.data = null;
    this.root.innerHTML = `
      <section class="panel" aria-labelledby="fleet-title">
        <div class="head"><h2 id="fleet-title">Fleet</h2><span class="spacer"></span>
          <span class="small muted" data-live aria-live="polite"></span></div>
        <div class="error" data-error hidden role="alert"></div>
        <div data-totals></div>
        <ul data-edges aria-label="Edges"></ul>
      </section>`;
    this.root.querySelector("[data-edges]").addEventListener("click", (e) => {
      const button = e.target.closest("button[data-edge]");
      if (!button) return;
      this.setAttribute("selected", button.dataset.edge);
      this.emit("iop-edge-select", { edgeId: button.dataset.edge });
    });
  }

  attributeChangedCallback(name, oldValue, newValue) {
    if (name === "selected") {
      if (this.data) this.render();
      return;
    }
    super.attributeChangedCallback(name, oldValue, newValue);
  }

  liveEdgeId() {
    return "";
  }

  onLiveState(state, detail) {
    super.onLiveState(state, detail);
    const live = this.root.querySelector("[data-live]");
    live.innerHTML = state === "live" ? `<span class="dot ok"></span>live` : `<span class="dot warn"></span>${esc(state)}`;
    live.title = detail || "";
  }

  async load() {
    this.data = await this.fetchJson("/fleet/status?limit=1000");
    this.clearError();
    this.render();
    this.emit("iop-fleet-loaded", { edges: this.data.items, totals: this.data.totals });
  }

  render() {
    const { items = [], totals = {} } = this.data;
    const g = totals.general || {};
    const lc = totals.long_context || {};
    const byHealth = totals.providers_by_health || {};
    const unhealthy = (byHealth.unhealthy || 0) + (byHealth.degraded || 0);
    this.root.querySelector("[data-totals]").innerHTML = `
      <div class="totals" role="group" aria-label="Fleet totals">
        <div class="stat" data-total="edges"><b>${totals.edges_connected ?? 0}/${totals.edges_known ?? items.length}</b><span>edges connected</span></div>
        <div class="stat" data-total="nodes"><b>${totals.nodes_connected ?? 0}/${totals.nodes_configured ?? 0}</b><span>nodes connected</span></div>
        <div class="stat"><b>${totals.providers ?? 0}</b><span>providers${unhealthy ? `, ${unhealthy} not healthy` : ""}</span></div>
        <div class="stat"><b>${g.in_flight ?? 0}/${g.capacity ?? 0}</b><span>general in flight · ${g.queued ?? 0} queued</span></div>
        <div class="stat"><b>${lc.in_flight ?? 0}/${lc.capacity ?? 0}</b><span>long-context in flight · ${lc.queued ?? 0} queued</span></div>
      </div>`;
    const selected = this.getAttribute("selected");
    const list = this.root.querySelector("[data-edges]");
    if (!items.length) {
      list.innerHTML = `<li class="empty">No edges are known yet.</li>`;
      return;
    }
    list.innerHTML = items.map((row) => rowHtml(row, selected)).join("");
  }
}

/** How a fleet row's `state` reads: [badge word, label, dot tone]. Unknown states show as they are. */
const ROW_STATES = {
  ok: ["connected", "connected", "ok"],
  timeout: ["timeout", "timed out", "warn"],
  error: ["error", "error", "bad"],
  disconnected: ["disconnected", "disconnected", "off"],
};

/** The reason of a row that is not fresh: its error message (or code). */
export function rowReason(row) {
  const error = row.error;
  if (!error) return "";
  if (typeof error === "string") return error;
  return String(error.message || error.code || "");
}

function rowHtml(row, selected) {
  const state = row.connected ? String(row.state || "unknown") : "disconnected";
  const [word, label, tone] = ROW_STATES[state] || [state, state, "warn"];
  const reason = rowReason(row);
  const since = row.received_at ? `snapshot ${formatTime(row.received_at)}` : "no snapshot yet";
  return `<li><button type="button" data-edge="${esc(row.edge_id)}" data-connected="${row.connected}" data-state="${esc(state)}"
      aria-current="${row.edge_id === selected}" aria-label="Edge ${esc(row.edge_id)}, ${esc(label)}">
    <span class="name"><span class="dot ${tone}" aria-hidden="true"></span>${esc(row.edge_id)}</span>
    ${badge(word, label)}
    <span class="sub"><span>nodes ${row.nodes_connected ?? 0}/${row.nodes_configured ?? 0}</span>
      <span>providers ${row.providers ?? 0}</span>
      <span>general ${counters(row.general)}</span></span>
    ${row.stale ? `<span class="stale" data-stale title="${esc(since)}">stale: ${esc(since)}</span>` : ""}
    ${reason ? `<span class="reason" data-reason>${esc(reason)}</span>` : ""}
  </button></li>`;
}

customElements.define("iop-fleet-overview", IopFleetOverview);
