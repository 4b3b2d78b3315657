// Shared base of the console's custom elements: theme and styles, HTTP
// helpers, polling, live-event subscriptions and small formatting helpers.
//
// Every component renders into an open shadow root with the shared sheet
// below; colours come from --iop-* custom properties that a host page may
// set on any ancestor (defaults follow the OS light/dark preference).

import { ApiError, consoleConfig, isAuthError, onApiTokenChange, requestJson } from "./api.js";
import { subscribeLive } from "./wire.js";

export const sharedSheet = new CSSStyleSheet();
sharedSheet.replaceSync(`
:host {
  --_bg: var(--iop-bg, #ffffff);
  --_panel: var(--iop-panel, #f6f7f9);
  --_fg: var(--iop-fg, #1d2330);
  --_muted: var(--iop-muted, #5d6675);
  --_border: var(--iop-border, #d9dde4);
  --_accent: var(--iop-accent, #2f6fdf);
  --_ok: var(--iop-ok, #1f8a4c);
  --_warn: var(--iop-warn, #b26b00);
  --_bad: var(--iop-bad, #c9302c);
  --_off: var(--iop-off, #7b8494);
  --_ok-bg: color-mix(in srgb, var(--_ok) 14%, transparent);
  --_warn-bg: color-mix(in srgb, var(--_warn) 16%, transparent);
  --_bad-bg: color-mix(in srgb, var(--_bad) 14%, transparent);
  --_off-bg: color-mix(in srgb, var(--_off) 16%, transparent);
  display: block;
  color: var(--_fg);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
}
@media (prefers-color-scheme: dark) {
  :host {
    --_bg: var(--iop-bg, #14171c);
    --_panel: var(--iop-panel, #1b1f26);
    --_fg: var(--iop-fg, #e4e8ee);
    --_muted: var(--iop-muted, #9aa3b2);
    --_border: var(--iop-border, #2d333d);
    --_accent: var(--iop-accent, #6ea0ff);
    --_ok: var(--iop-ok, #4cc07f);
    --_warn: var(--iop-warn, #e3a33b);
    --_bad: var(--iop-bad, #f06b66);
    --_off: var(--iop-off, #8a93a3);
  }
}
:host([hidden]) { display: none; }
:host { min-width: 0; }
.panel { min-width: 0; overflow-wrap: anywhere; }
table { overflow-wrap: break-word; }
.scroll { overflow-x: auto; }
* { box-sizing: border-box; }
h2 { font-size: 15px; margin: 0; font-weight: 600; }
h3 { font-size: 13px; margin: 14px 0 6px; font-weight: 600; color: var(--_muted); text-transform: uppercase; letter-spacing: .04em; }
.panel { background: var(--_panel); border: 1px solid var(--_border); border-radius: 10px; padding: 12px 14px; }
.head { display: flex; align-items: center; gap: 10px; margin-bottom: 8px; flex-wrap: wrap; }
.head .spacer { flex: 1; }
.muted { color: var(--_muted); }
.small { font-size: 12px; }
.mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; }
table { width: 100%; border-collapse: collapse; }
th { text-align: left; font-weight: 600; font-size: 12px; color: var(--_muted); padding: 4px 8px; border-bottom: 1px solid var(--_border); white-space: nowrap; }
td { padding: 5px 8px; border-bottom: 1px solid color-mix(in srgb, var(--_border) 60%, transparent); vertical-align: top; }
tr:last-child td { border-bottom: none; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 999px; font-size: 12px; font-weight: 600; white-space: nowrap; }
.ok { color: var(--_ok); background: var(--_ok-bg); }
.warn { color: var(--_warn); background: var(--_warn-bg); }
.bad { color: var(--_bad); background: var(--_bad-bg); }
.off { color: var(--_off); background: var(--_off-bg); }
.dot { display: inline-block; width: 9px; height: 9px; border-radius: 50%; background: var(--_off); margin-right: 6px; vertical-align: baseline; }
.dot.ok { background: var(--_ok); } .dot.bad { background: var(--_bad); } .dot.warn { background: var(--_warn); }
.error { color: var(--_bad); background: var(--_bad-bg); border-radius: 8px; padding: 8px 10px; margin: 6px 0; }
.empty { color: var(--_muted); padding: 8px 2px; }
button, input, select { font: inherit; color: inherit; }
button { background: var(--_accent); color: #fff; border: none; border-radius: 7px; padding: 6px 14px; cursor: pointer; font-weight: 600; }
button.secondary { background: transparent; color: var(--_fg); border: 1px solid var(--_border); }
button:disabled { opacity: .55; cursor: default; }
button:focus-visible, input:focus-visible, select:focus-visible, [tabindex]:focus-visible { outline: 2px solid var(--_accent); outline-offset: 2px; }
input, select { background: var(--_bg); border: 1px solid var(--_border); border-radius: 7px; padding: 5px 8px; min-width: 0; max-width: 100%; }
label { font-size: 12px; color: var(--_muted); font-weight: 600; }
.meter { display: inline-flex; align-items: center; gap: 6px; }
.bar { width: 52px; height: 6px; border-radius: 3px; background: var(--_off-bg); overflow: hidden; display: inline-block; }
.bar > i { display: block; height: 100%; background: var(--_accent); }
`);

/** Escape text for HTML. */
export function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

/** "2026-11-29 20:00:05" in local time, or "—". */
export function formatTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return esc(iso);
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** Time only ("20:50:25") for today, else the full local time; the full time is the tooltip. */
export function shortTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return esc(iso);
  const full = formatTime(iso);
  const today = new Date().toDateString() === d.toDateString();
  return `<time datetime="${esc(iso)}" title="${full}">${today ? full.slice(11) : full}</time>`;
}

/** "3 s ago", "5 min ago" ... */
export function ago(iso) {
  if (!iso) return "—";
  const seconds = Math.max(0, Math.round((Date.now() - new Date(iso).getTime()) / 1000));
  if (seconds < 60) return `${seconds} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86400)} d ago`;
}

const TONES = {
  available: "ok", healthy: "ok", succeeded: "ok", ok: "ok", connected: "ok", live: "ok",
  ready: "ok",
  starting: "warn", loading: "warn", draining: "warn", stopping: "warn", crashed: "bad", stopped: "off",
  drained: "warn", degraded: "warn", saturated: "warn", cooling_down: "bad", sent: "warn", accepted: "warn", running: "warn", timeout: "warn", reconnecting: "warn", connecting: "warn",
  unhealthy: "bad", failed: "bad", rejected: "bad", timed_out: "bad", edge_disconnected: "bad", error: "bad",
  unavailable: "off", offline: "off", unknown: "off", disconnected: "off", closed: "off",
};

/** A coloured badge for a status word. */
export function badge(word, label = word) {
  return `<span class="badge ${TONES[word] || "off"}">${esc(label)}</span>`;
}

/** "in_flight / capacity" with a small bar, plus queued. */
export function counters(c) {
  const capacity = c?.capacity ?? 0;
  const inFlight = c?.in_flight ?? 0;
  const pct = capacity ? Math.min(100, Math.round((inFlight / capacity) * 100)) : 0;
  return `<span class="meter"><span class="bar" aria-hidden="true"><i style="width:${pct}%"></i></span>${inFlight}/${capacity}</span>`;
}

/** A fraction 0..1 as a small bar and a whole percent ("42%"). */
export function fractionBar(fraction) {
  const pct = Math.max(0, Math.min(100, Math.round(Number(fraction) * 100))) || 0;
  return `<span class="meter"><span class="bar" aria-hidden="true"><i style="width:${pct}%"></i></span>${pct}%</span>`;
}

/** A latency from the views' seconds: "412 ms" below 10 s, "12.4 s" above, "—" for none. */
export function latencyText(seconds) {
  if (seconds == null || !Number.isFinite(Number(seconds))) return "—";
  const value = Number(seconds);
  if (value >= 10) return `${value.toFixed(1)} s`;
  return value >= 0.001 ? `${Math.round(value * 1000)} ms` : `${(value * 1000).toFixed(2)} ms`;
}

/** A rate to one decimal ("37.5"). */
export function rate(value) {
  return Number(value).toFixed(1);
}

/** Event-driven re-fetches of one element are at least this far apart (ms). */
export const EVENT_REFRESH_MIN_MS = 2000;
/** Delay of an event-driven re-fetch, so a burst's first events share it (ms). */
export const EVENT_REFRESH_DELAY_MS = 150;

/** Kinds of live events after which edge and fleet views are re-fetched. */
export function isStateChange(kind) {
  return /^(node|edge|provider|operation)\./.test(kind || "");
}

/**
 * Base class: shadow root with the shared sheet, `api-base`, `wire-url`
 * and `refresh-interval` attributes, polling and live subscriptions.
 */
export class IopElement extends HTMLElement {
  constructor(extraCss = "") {
    super();
    this.root = this.attachShadow({ mode: "open" });
    const sheets = [sharedSheet];
    if (extraCss) {
      const sheet = new CSSStyleSheet();
      sheet.replaceSync(extraCss);
      sheets.push(sheet);
    }
    this.root.adoptedStyleSheets = sheets;
    this._pollTimer = null;
    this._refreshTimer = null;
    this._refreshDueAt = 0;
    this._refreshWanted = false;
    this._lastEventRefreshAt = -Infinity;
    this._unsubscribe = null;
    this._unwatchToken = null;
    this._loading = null;
    this._generation = 0;
    this._started = false;
  }

  /** Base URL of the HTTP API ("" = this page's origin). */
  get apiBase() {
    return this.getAttribute("api-base") || "";
  }

  /** Polling interval in milliseconds (attribute in seconds; 0 turns polling off). */
  get refreshIntervalMs() {
    const raw = this.getAttribute("refresh-interval");
    const seconds = raw === null ? 5 : Number(raw);
    return Number.isFinite(seconds) && seconds > 0 ? seconds * 1000 : 0;
  }

  connectedCallback() {
    this._unwatchToken?.();
    this._unwatchToken = onApiTokenChange(() => this.refresh());
    this._started = true;
    this.start();
  }

  disconnectedCallback() {
    this._started = false;
    this.stop();
    this._unwatchToken?.();
    this._unwatchToken = null;
  }

  attributeChangedCallback(name, oldValue, newValue) {
    // Attributes present at upgrade time arrive before connectedCallback;
    // only later changes restart the element.
    if (oldValue !== newValue && this._started) this.start();
  }

  /** (Re)start loading, polling and the live subscription. */
  start() {
    this.stop();
    this._generation += 1;
    this._loading = null; // a load for the old attributes must not stand in for the new one
    this.refresh();
    const interval = this.refreshIntervalMs;
    if (interval) this._pollTimer = setInterval(() => this.refresh(), interval);
    const live = this.liveEdgeId();
    if (live !== null) this.subscribe(live);
  }

  stop() {
    clearInterval(this._pollTimer);
    clearTimeout(this._refreshTimer);
    this._refreshTimer = null;
    this._refreshWanted = false;
    this._pollTimer = null;
    this._unsubscribe?.();
    this._unsubscribe = null;
  }

  /** The edge this panel shows (its `edge-id` attribute; "" when none). */
  get edgeId() {
    return this.getAttribute("edge-id") || "";
  }

  /** The edge id to follow live ("" = fleet), or null for no live subscription. */
  liveEdgeId() {
    return this.edgeId || null;
  }

  async subscribe(edgeId) {
    const generation = this._generation;
    let url = this.getAttribute("wire-url");
    if (!url) {
      try {
        url = (await consoleConfig(this.apiBase)).wire_url;
      } catch (e) {
        this.onLiveState("failed", "no console config");
        return;
      }
    }
    if (generation !== this._generation || !this.isConnected) return;
    this._unsubscribe = subscribeLive(url, edgeId, {
      event: (event) => this.onLiveEvent(event),
      lost: (lost) => this.onLiveLost(lost),
      state: (state, detail) => this.onLiveState(state, detail),
    });
  }

  onLiveEvent(event) {
    if (isStateChange(event.kind)) this.refreshForEvents();
  }

  onLiveLost(lost) {
    this.refreshForEvents();
  }

  onLiveState(state, detail) {
    if (state === "live") this.refreshSoon();
  }

  /**
   * Re-fetch because live events arrived. Coalesced: at most one fetch in
   * flight, events during it cause one trailing fetch, and event-driven
   * fetches are at least EVENT_REFRESH_MIN_MS apart (polling is separate).
   */
  refreshForEvents() {
    const gate = this._lastEventRefreshAt + EVENT_REFRESH_MIN_MS - Date.now();
    this.scheduleRefresh(Math.max(EVENT_REFRESH_DELAY_MS, gate));
  }

  /** Re-fetch shortly (coalesced with any re-fetch already scheduled). */
  refreshSoon(delay = EVENT_REFRESH_DELAY_MS) {
    this.scheduleRefresh(delay);
  }

  /** One scheduled re-fetch at a time; an earlier due time pulls it forward. */
  scheduleRefresh(delay) {
    const dueAt = Date.now() + delay;
    if (this._refreshWanted) {
      if (this._refreshTimer === null || dueAt >= this._refreshDueAt) return; // already due, or waiting for the fetch in flight
      clearTimeout(this._refreshTimer);
    }
    this._refreshWanted = true;
    this._refreshDueAt = dueAt;
    const generation = this._generation;
    this._refreshTimer = setTimeout(() => this._runScheduledRefresh(generation), delay);
  }

  async _runScheduledRefresh(generation) {
    this._refreshTimer = null;
    // A fetch in flight may predate what was asked for: wait for it, then
    // fetch once more (requests arriving meanwhile are folded into this one).
    while (this._loading && generation === this._generation) await this._loading;
    if (generation !== this._generation || !this._refreshWanted) return;
    this._refreshWanted = false;
    this._lastEventRefreshAt = Date.now();
    await this.refresh();
  }

  /** Fetch and render; concurrent calls share one fetch. */
  refresh() {
    if (!this.isConnected) return Promise.resolve();
    if (!this._loading) {
      const loading = this.load()
        .catch((error) => this.showError(error))
        .finally(() => {
          if (this._loading === loading) this._loading = null;
        });
      this._loading = loading;
    }
    return this._loading;
  }

  /**
   * Fetch again now, not sharing the fetch in flight (whose answer is for
   * settings that changed, such as a filter); the element abandons that
   * fetch itself (see fleet-overview.js).
   */
  reload() {
    this._loading = null;
    return this.refresh();
  }

  /** Subclasses fetch and render here. */
  async load() {}

  fetchJson(path, options) {
    return requestJson(this.apiBase, path, options);
  }

  /** Show an error; authentication errors also tell the page (iop-auth-required). */
  showError(error) {
    if (isAuthError(error)) this.emit("iop-auth-required", { code: error.code, message: error.detail });
    this.renderError(error instanceof ApiError ? error : new ApiError("error", String(error?.message || error), 0));
  }

  renderError(error) {
    const box = this.root.querySelector("[data-error]");
    if (box) {
      box.hidden = false;
      box.textContent = `${error.code}: ${error.detail}`;
    }
  }

  clearError() {
    const box = this.root.querySelector("[data-error]");
    if (box) box.hidden = true;
  }

  /** Dispatch a bubbling, composed CustomEvent from this element. */
  emit(name, detail) {
    this.dispatchEvent(new CustomEvent(name, { detail, bubbles: true, composed: true }));
  }
}
