// <iop-event-stream edge-id="...">: live events of one edge (or of the
// whole fleet without edge-id) over the WebSocket /client subscription,
// newest first, after a short backfill over HTTP. Lost events (resume gap
// after a reconnect, or the server dropping events for a slow subscriber)
// are shown as a notice in the stream; nothing is silently skipped.
//
// Attributes: edge-id, api-base, wire-url, max-events (default 200).
// Events: iop-event {event} for each new event (HTTP event JSON shape);
//         iop-events-lost {count, first_sequence, last_sequence, reason};
//         iop-connection {state, detail}.

import { edgePath } from "../api.js";
import { IopElement, esc, shortTime } from "../base.js";

const BACKFILL = 50;

const CSS = `
ol { list-style: none; margin: 0; padding: 0; max-height: 420px; overflow-y: auto; }
li { display: grid; grid-template-columns: 44px auto minmax(0, 1fr); gap: 2px 10px; padding: 5px 4px;
  border-bottom: 1px solid color-mix(in srgb, var(--_border) 60%, transparent); font-size: 13px; }
li:last-child { border-bottom: none; }
.seq { color: var(--_muted); text-align: right; font-variant-numeric: tabular-nums; }
.kind { font-weight: 600; }
.kind.node { color: var(--_accent); } .kind.operation, .kind.command { color: var(--_warn); }
.kind.edge { color: var(--_ok); } .kind.provider { color: var(--_bad); }
.msg { grid-column: 3; color: var(--_muted); }
li > span { min-width: 0; overflow-wrap: anywhere; }
li.lost { grid-template-columns: 1fr; background: var(--_warn-bg); color: var(--_warn); border-radius: 6px; font-weight: 600; }
li.fresh { animation: flash 1.2s ease-out; }
@keyframes flash { from { background: color-mix(in srgb, var(--_accent) 18%, transparent); } to { background: transparent; } }
@media (prefers-reduced-motion: reduce) { li.fresh { animation: none; } }
`;

export class IopEventStream extends IopElement {
  static observedAttributes = ["edge-id", "api-base", "wire-url", "max-events"];

  constructor() {
    super(CSS);
    this.seen = new Set();
    this.lastSequence = 0;
    this.root.innerHTML = `
      <section class="panel" aria-labelledby="events-title">
        <div class="head"><h2 id="events-title">Events</h2><span class="spacer"></span>
          <span class="small" data-state role="status" aria-live="polite"></span></div>
        <div class="error" data-error hidden role="alert"></div>
        <ol data-events aria-label="Events, newest first" aria-live="off"></ol>
      </section>`;
  }

  get maxEvents() {
    const n = Number(this.getAttribute("max-events"));
    return Number.isFinite(n) && n > 0 ? n : 200;
  }

  /** Events never poll; they are live (and caught up over HTTP after each (re)subscription). */
  get refreshIntervalMs() {
    return 0;
  }

  liveEdgeId() {
    return this.edgeId;
  }

  start() {
    this.seen = new Set();
    this.lastSequence = 0;
    this.root.querySelector("[data-events]").innerHTML = "";
    this.root.querySelector("#events-title").textContent = this.edgeId ? `Events of ${this.edgeId}` : "Fleet events";
    super.start();
  }

  sequenceOf(event) {
    return this.edgeId ? event.sequence : event.fleet_sequence;
  }

  path(query) {
    return this.edgeId ? `${edgePath(this.edgeId, "events")}?${query}` : `/fleet/events?${query}`;
  }

  /** Backfill / catch up over HTTP: the newest events after what is shown. */
  async load() {
    const edgeId = this.edgeId;
    let since = this.lastSequence;
    if (!since) {
      const probe = await this.fetchJson(this.path("since=0&limit=1"));
      since = Math.max(0, (probe.last_sequence || 0) - BACKFILL);
    }
    const page = await this.fetchJson(this.path(`since=${since}&limit=1000`));
    if (edgeId !== this.edgeId) return;
    this.clearError();
    for (const event of page.items || []) this.add(event, false);
  }

  onLiveEvent(event) {
    this.add(event, true);
  }

  onLiveLost(lost) {
    this.renderItem({ lost }, false);
    this.trim();
    this.emit("iop-events-lost", { ...lost });
  }

  onLiveState(state, detail) {
    const el = this.root.querySelector("[data-state]");
    el.innerHTML = state === "live" ? `<span class="dot ok"></span>live` : `<span class="dot warn"></span>${esc(state)}`;
    el.title = detail || "";
    el.dataset.state = state;
    this.emit("iop-connection", { state, detail });
    if (state === "live") this.refreshSoon(0);
  }

  /** Show an event once, in sequence order (live events and HTTP catch-up may overlap). */
  add(event, live) {
    const sequence = this.sequenceOf(event);
    if (this.seen.has(sequence)) return;
    this.seen.add(sequence);
    this.lastSequence = Math.max(this.lastSequence, sequence);
    this.renderItem(event, live);
    this.trim();
    this.emit("iop-event", { event });
  }

  trim() {
    const list = this.root.querySelector("[data-events]");
    while (list.children.length > this.maxEvents) {
      const last = list.lastElementChild;
      if (last.dataset.sequence) this.seen.delete(Number(last.dataset.sequence));
      last.remove();
    }
  }

  renderItem(item, fresh) {
    const li = document.createElement("li");
    if (item.lost) {
      const l = item.lost;
      li.className = "lost";
      li.dataset.lost = l.reason;
      li.textContent = `${l.count} event${l.count === 1 ? "" : "s"} lost (${l.first_sequence}–${l.last_sequence}, ${l.reason.replace("_", " ")})`;
    } else {
      const e = item;
      const family = (e.kind || "").split(".")[0];
      li.dataset.kind = e.kind;
      li.dataset.sequence = String(this.sequenceOf(e));
      if (fresh) li.className = "fresh";
      const where = [this.edgeId ? "" : e.edge_id, e.node_id, e.provider_id, e.command_id ? `command ${e.command_id.slice(0, 8)}` : ""]
        .filter(Boolean)
        .join(" · ");
      li.innerHTML = `<span class="seq">${this.sequenceOf(e)}</span>
        <span class="small muted">${shortTime(e.occurred_at || e.recorded_at)}</span>
        <span><span class="kind ${esc(family)}">${esc(e.kind)}</span>${where ? ` <span class="small muted">${esc(where)}</span>` : ""}</span>
        ${e.message ? `<span class="msg small">${esc(e.message)}</span>` : ""}`;
    }
    // Newest first by sequence; a lost-events notice sits where its gap is.
    const order = item.lost ? item.lost.last_sequence + 0.5 : this.sequenceOf(item);
    li.dataset.order = String(order);
    const list = this.root.querySelector("[data-events]");
    const after = [...list.children].find((other) => Number(other.dataset.order) < order);
    list.insertBefore(li, after || null);
  }
}

customElements.define("iop-event-stream", IopEventStream);
