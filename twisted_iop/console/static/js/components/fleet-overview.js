// <iop-fleet-overview>: every known edge with its state and the fleet
// totals, from GET /fleet/status: every page of it (following next_cursor,
// 1,000 rows a page) with the list's filters: a search box (q, a substring
// of the edge id, debounced), a label selector (selector=, applied on Enter
// or when the field is left; the server's 400 shows under the field) and a
// state filter (state=). Rows in trouble come first (disconnected, row
// errors, providers not healthy, saturated, stale; then by id), or by id
// only. The list is windowed: rows have one fixed height and only those in
// view (plus a few either side) are in the DOM, so 10,000 rows scroll as
// fast as 10. Live through the fleet-wide subscription (re-fetched on
// edge.*, node.*, provider.*, operation.* events) and polled every
// `refresh-interval` seconds as a fallback.
//
// Attributes: api-base, wire-url, refresh-interval, selected (edge id).
// Events: iop-edge-select {edgeId} when a row is chosen;
//         iop-fleet-loaded {edges, totals} after each successful load
//         (edges in display order);
//         iop-auth-required {code, message}.

import { ApiError } from "../api.js";
import { IopElement, badge, counters, esc, formatTime, latencyText } from "../base.js";
import { STATE_CHOICES, TROUBLE_WORDS, fleetQuery, rowMatches, sortRows, troubleRank, windowOf } from "../fleet-rows.js";

/** Height of one row, gap included (px); every row has it, so the window is arithmetic. */
export const ROW_HEIGHT = 94;
/** Rows asked per page of /fleet/status (the server's largest page is 10,000). */
export const PAGE_LIMIT = 1000;
/** Pages followed at most per load (a bound on memory: 100,000 rows). */
export const MAX_PAGES = 100;
/** Delay between the last keystroke in the search box and the fetch (ms). */
export const SEARCH_DEBOUNCE_MS = 250;

const CSS = `
.filters { display: grid; gap: 6px; margin-bottom: 10px; }
.filters .pair { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 6px; }
.filters input, .filters select { width: 100%; }
.field-error { color: var(--_bad); font-size: 12px; overflow-wrap: anywhere; }
input[aria-invalid="true"] { border-color: var(--_bad); }
.viewport { position: relative; overflow-y: auto; height: var(--iop-fleet-height, calc(100vh - 380px)); min-height: 240px;
  contain: strict; border-radius: 9px; }
ul { list-style: none; margin: 0; padding: 0; position: relative; }
li { position: absolute; left: 0; right: 0; height: ${ROW_HEIGHT - 6}px; }
li.empty { position: static; height: auto; }
li button { width: 100%; height: 100%; text-align: left; background: var(--_bg); color: var(--_fg); border: 1px solid var(--_border);
  border-radius: 9px; padding: 6px 10px; display: grid; grid-template-columns: minmax(0, 1fr) auto; grid-template-rows: 20px 18px 18px 18px;
  gap: 0 8px; font-weight: 400; overflow: hidden; }
li button:hover { border-color: var(--_accent); }
li button[aria-current="true"] { border-color: var(--_accent); box-shadow: inset 3px 0 0 var(--_accent); }
.name { font-weight: 600; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.sub { grid-column: 1 / -1; font-size: 12px; color: var(--_muted); display: flex; gap: 10px; white-space: nowrap; overflow: hidden; }
.sub > span { flex: none; }
.sub .bar { width: 36px; }
.totals { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 6px; margin-bottom: 10px; }
.stat { background: var(--_bg); border: 1px solid var(--_border); border-radius: 8px; padding: 6px 8px; }
.stale, .reason { grid-column: 1 / -1; font-size: 12px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.stale { color: var(--_warn); }
.reason { color: var(--_bad); }
.stat:last-child:nth-child(odd) { grid-column: 1 / -1; }
.stat b { display: block; font-size: 17px; font-variant-numeric: tabular-nums; }
.stat span { font-size: 11.5px; color: var(--_muted); }
.count { margin: 0 0 6px; }
`;

export class IopFleetOverview extends IopElement {
  static observedAttributes = ["api-base", "wire-url", "refresh-interval", "selected"];

  constructor() {
    super(CSS);
    this.data = null; // the last page's members (totals, generated_at ...)
    this.rows = []; // every row of the last load
    this.sorted = []; // this.rows in display order
    this.total = 0;
    this.filters = { q: "", selector: "", state: "" };
    this.order = "trouble";
    this._fetch = null; // AbortController of the load in flight
    this._searchTimer = null;
    this._window = "";
    this._scrollFrame = 0;
    const states = STATE_CHOICES.map(([value, label]) => `<option value="${esc(value)}">${esc(label)}</option>`).join("");
    this.root.innerHTML = `
      <section class="panel" aria-labelledby="fleet-title">
        <div class="head"><h2 id="fleet-title">Fleet</h2><span class="spacer"></span>
          <span class="small muted" data-live aria-live="polite"></span></div>
        <div class="error" data-error hidden role="alert"></div>
        <div data-totals></div>
        <form class="filters" data-filters role="search" aria-label="Filter edges" novalidate>
          <input type="search" name="q" data-filter="q" placeholder="search edge id" aria-label="Search edge id" autocomplete="off" spellcheck="false">
          <input type="text" name="selector" data-filter="selector" placeholder="labels, e.g. region=eu,tier!=canary"
            aria-label="Label selector" aria-describedby="selector-error" autocomplete="off" spellcheck="false">
          <div class="field-error" id="selector-error" data-selector-error role="alert" hidden></div>
          <div class="pair">
            <select name="state" data-filter="state" aria-label="State" aria-describedby="state-error">${states}</select>
            <select name="sort" data-sort aria-label="Sort">
              <option value="trouble">trouble first</option><option value="id">by id</option></select>
          </div>
          <div class="field-error" id="state-error" data-state-error role="alert" hidden></div>
        </form>
        <p class="small muted count" data-count aria-live="polite"></p>
        <div class="viewport" data-viewport tabindex="-1">
          <ul data-edges aria-label="Edges"></ul>
        </div>
      </section>`;
    const $ = (s) => this.root.querySelector(s);
    this.viewport = $("[data-viewport]");
    this.list = $("[data-edges]");
    this.list.addEventListener("click", (e) => {
      const button = e.target.closest("button[data-edge]");
      if (!button) return;
      this.setAttribute("selected", button.dataset.edge);
      this.emit("iop-edge-select", { edgeId: button.dataset.edge });
    });
    this.viewport.addEventListener("scroll", () => {
      if (this._scrollFrame) return;
      this._scrollFrame = requestAnimationFrame(() => {
        this._scrollFrame = 0;
        this.renderWindow(false);
      });
    });
    new ResizeObserver(() => this.renderWindow(true)).observe(this.viewport);
    const form = $("[data-filters]");
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      this.applyFilters();
    });
    const search = $('[data-filter="q"]');
    search.addEventListener("input", () => {
      clearTimeout(this._searchTimer);
      this._searchTimer = setTimeout(() => this.applyFilters(), SEARCH_DEBOUNCE_MS);
    });
    const selector = $('[data-filter="selector"]');
    // A selector is applied when it is complete (Enter, or leaving the
    // field): applying it while typed would answer 400 at every keystroke.
    selector.addEventListener("change", () => this.applyFilters());
    selector.addEventListener("keydown", (e) => {
      if (e.key === "Enter") {
        e.preventDefault();
        this.applyFilters();
      }
    });
    $('[data-filter="state"]').addEventListener("change", () => this.applyFilters());
    $("[data-sort]").addEventListener("change", (e) => {
      this.order = e.target.value === "id" ? "id" : "trouble";
      this.sorted = sortRows(this.rows, this.order);
      this.renderWindow(true);
    });
  }

  attributeChangedCallback(name, oldValue, newValue) {
    if (name === "selected") {
      if (this.data) this.renderWindow(true);
      return;
    }
    super.attributeChangedCallback(name, oldValue, newValue);
  }

  liveEdgeId() {
    return "";
  }

  stop() {
    this._fetch?.abort();
    this._fetch = null;
    super.stop();
  }

  onLiveState(state, detail) {
    super.onLiveState(state, detail);
    const live = this.root.querySelector("[data-live]");
    live.innerHTML = state === "live" ? `<span class="dot ok"></span>live` : `<span class="dot warn"></span>${esc(state)}`;
    live.title = detail || "";
  }

  /** Read the filter fields; when they changed, abandon the load in flight and load again. */
  applyFilters() {
    clearTimeout(this._searchTimer);
    const value = (name) => this.root.querySelector(`[data-filter="${name}"]`).value.trim();
    const filters = { q: value("q"), selector: value("selector"), state: value("state") };
    if (JSON.stringify(filters) === JSON.stringify(this.filters)) return;
    this.filters = filters;
    this._fetch?.abort();
    this.viewport.scrollTop = 0;
    this.reload();
  }

  /** Every page of the filtered fleet view; renders as the first load arrives, then swaps in each new load whole. */
  async load() {
    this._fetch?.abort();
    const controller = new AbortController();
    this._fetch = controller;
    const filters = { ...this.filters };
    const first = !this.data;
    const rows = [];
    let page = null;
    let cursor = "";
    try {
      for (let n = 0; n < MAX_PAGES; n += 1) {
        page = await this.fetchJson(`/fleet/status?${fleetQuery(filters, cursor, PAGE_LIMIT)}`, { signal: controller.signal });
        if (controller.signal.aborted) return;
        const items = Array.isArray(page.items) ? page.items : [];
        // The server filters; an older one ignores q and state, which this does again.
        for (const row of items) if (rowMatches(row, filters)) rows.push(row);
        cursor = page.next_cursor || "";
        if (!cursor) break;
        if (first) this.show(page, rows, true);
      }
    } catch (error) {
      if (controller.signal.aborted || error?.name === "AbortError") return;
      if (error instanceof ApiError && this.showFieldError(error)) {
        this.show({ ...(this.data || {}), items: [], total: 0 }, [], false);
        return;
      }
      throw error;
    } finally {
      if (this._fetch === controller) this._fetch = null;
    }
    this.showFieldError(null);
    this.clearError();
    this.show(page, rows, false);
    this.emit("iop-fleet-loaded", { edges: this.sorted, totals: this.data.totals });
  }

  /** A bad selector or state answer shows under its field (true); null clears both. */
  showFieldError(error) {
    const fields = { invalid_selector: "selector", invalid_state: "state" };
    const field = error ? fields[error.code] : null;
    if (error && !field) return false;
    for (const name of Object.values(fields)) {
      const box = this.root.querySelector(`[data-${name}-error]`);
      const input = this.root.querySelector(`[data-filter="${name}"]`);
      const mine = name === field;
      box.hidden = !mine;
      box.textContent = mine ? error.detail || error.code : "";
      input.setAttribute("aria-invalid", String(mine));
    }
    return true;
  }

  show(page, rows, loading) {
    this.data = page;
    this.rows = rows;
    this.total = Number(page.total ?? rows.length);
    this.sorted = sortRows(rows, this.order);
    this.renderTotals();
    const filtered = this.filters.q || this.filters.selector || this.filters.state;
    const known = page.totals?.edges_known;
    this.root.querySelector("[data-count]").textContent = loading
      ? `loading… ${rows.length} of ${this.total} edges`
      : `${rows.length} edge${rows.length === 1 ? "" : "s"}${filtered && known != null ? " match" : ""}`;
    this.renderWindow(true);
  }

  renderTotals() {
    const totals = this.data.totals || {};
    const g = totals.general || {};
    const lc = totals.long_context || {};
    const byHealth = totals.providers_by_health || {};
    const unhealthy = (byHealth.unhealthy || 0) + (byHealth.degraded || 0);
    this.root.querySelector("[data-totals]").innerHTML = `
      <div class="totals" role="group" aria-label="Fleet totals">
        <div class="stat" data-total="edges"><b>${totals.edges_connected ?? 0}/${totals.edges_known ?? this.rows.length}</b><span>edges connected</span></div>
        <div class="stat" data-total="nodes"><b>${totals.nodes_connected ?? 0}/${totals.nodes_configured ?? 0}</b><span>nodes connected</span></div>
        <div class="stat"><b>${totals.providers ?? 0}</b><span>providers${unhealthy ? `, ${unhealthy} not healthy` : ""}</span></div>
        <div class="stat"><b>${g.in_flight ?? 0}/${g.capacity ?? 0}</b><span>general in flight · ${g.queued ?? 0} queued</span></div>
        <div class="stat"><b>${lc.in_flight ?? 0}/${lc.capacity ?? 0}</b><span>long-context in flight · ${lc.queued ?? 0} queued</span></div>
      </div>`;
  }

  /** Put the rows in view into the DOM (only when the window moved, unless forced). */
  renderWindow(force) {
    if (!this.data) return;
    const rows = this.sorted;
    if (!rows.length) {
      this._window = "";
      this.list.style.height = "auto";
      const filtered = this.filters.q || this.filters.selector || this.filters.state;
      this.list.innerHTML = `<li class="empty">${filtered ? "No edge matches these filters." : "No edges are known yet."}</li>`;
      return;
    }
    const [first, last] = windowOf(this.viewport.scrollTop, this.viewport.clientHeight || 600, ROW_HEIGHT, rows.length);
    const key = `${first}:${last}`;
    if (!force && key === this._window) return;
    this._window = key;
    this.list.style.height = `${rows.length * ROW_HEIGHT}px`;
    const selected = this.getAttribute("selected");
    let html = "";
    for (let i = first; i < last; i += 1) html += rowHtml(rows[i], i, rows.length, selected);
    this.list.innerHTML = html;
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

/** A row's latency line: TTFT and TPOT p95 and requests per second over the Edge's last minute. */
function latencyLine(latency) {
  const l = latency || {};
  if (!l.requests) return `<span class="sub" data-latency title="no request ended in the Edge's last minute">TTFT p95 —</span>`;
  return `<span class="sub" data-latency title="${esc(`${l.requests} requests, ${l.errors} errors in ${l.window_seconds} s`)}"><span>TTFT p95 ${esc(
    latencyText(l.ttft_p95_seconds),
  )}</span><span>TPOT p95 ${esc(latencyText(l.tpot_p95_seconds))}</span><span>${esc(
    Number(l.requests_per_second).toFixed(1),
  )} req/s</span></span>`;
}

function rowHtml(row, index, size, selected) {
  const state = row.connected ? String(row.state || "unknown") : "disconnected";
  const [word, label, tone] = ROW_STATES[state] || [state, state, "warn"];
  const reason = rowReason(row);
  const trouble = TROUBLE_WORDS[troubleRank(row)];
  const since = row.received_at ? `snapshot ${formatTime(row.received_at)}` : "no snapshot yet";
  // One note line at most, so every row has the same height: the reason wins over "stale".
  const note = reason
    ? `<span class="reason" data-reason title="${esc(reason)}">${esc(reason)}</span>`
    : row.stale
      ? `<span class="stale" data-stale title="${esc(since)}">stale: ${esc(since)}</span>`
      : "";
  return `<li style="top:${index * ROW_HEIGHT}px" aria-setsize="${size}" aria-posinset="${index + 1}" data-index="${index}">
    <button type="button" data-edge="${esc(row.edge_id)}" data-connected="${row.connected}" data-state="${esc(state)}"
      data-trouble="${esc(trouble)}" aria-current="${row.edge_id === selected}"
      aria-label="Edge ${esc(row.edge_id)}, ${esc(label)}${trouble && trouble !== label ? `, ${esc(trouble)}` : ""}">
    <span class="name"><span class="dot ${tone}" aria-hidden="true"></span>${esc(row.edge_id)}</span>
    ${badge(word, label)}
    <span class="sub"><span title="nodes connected / configured">nodes ${row.nodes_connected ?? 0}/${row.nodes_configured ?? 0}</span>
      <span>providers ${row.providers ?? 0}</span>
      <span title="general leases in flight / capacity">${counters(row.general)}</span></span>
    ${latencyLine(row.latency)}
    ${note}
  </button></li>`;
}

customElements.define("iop-fleet-overview", IopFleetOverview);
