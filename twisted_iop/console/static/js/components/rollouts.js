// <iop-rollouts>: the rollouts of the fleet (GET /rollouts, newest first)
// and, for the selected one (GET /rollouts/{id}), its progress bar
// (`progress`), its counts by execution state, its state and reason, its
// current batch, and Pause / Resume / Cancel buttons
// (POST /rollouts/{id}/pause|resume|cancel). While a rollout is pending,
// running or paused the panel re-reads every second; rollout.* events on
// the fleet stream re-read it at once; otherwise it polls every
// `refresh-interval` seconds.
//
// Attributes: api-base, wire-url, refresh-interval, selected (rollout id), limit (default 20).
// Events: iop-rollout-select {rolloutId}; iop-rollout-loaded {rollout};
//         iop-auth-required {code, message}.

import { ApiError } from "../api.js";
import { IopElement, badge, esc, formatTime } from "../base.js";

/** Re-read interval while a rollout is not finished (ms). */
export const ACTIVE_REFRESH_MS = 1000;
/** States in which a rollout still changes. */
export const ACTIVE_STATES = new Set(["pending", "running", "paused"]);
/** Execution states, in the order the counts are shown. */
export const EXECUTION_STATES = ["pending", "waiting", "in_flight", "succeeded", "failed", "timed_out", "skipped", "cancelled"];
/** Which actions each rollout state allows (the server decides; this only greys the buttons out). */
const ACTIONS = {
  pause: new Set(["pending", "running"]),
  resume: new Set(["paused"]),
  cancel: new Set(["pending", "running", "paused"]),
};

const CSS = `
.list { width: 100%; }
.list tr { cursor: pointer; }
.list tr[aria-selected="true"] td { background: color-mix(in srgb, var(--_accent) 12%, transparent); }
.detail { margin-top: 12px; border: 1px solid var(--_border); border-radius: 8px; padding: 10px 12px; background: var(--_bg); }
.progress { height: 12px; border-radius: 6px; background: var(--_off-bg); overflow: hidden; margin: 8px 0 4px; }
.progress > i { display: block; height: 100%; background: var(--_accent); transition: width .3s ease-out; }
.progress[data-state="succeeded"] > i { background: var(--_ok); }
.progress[data-state="failed"] > i, .progress[data-state="aborted"] > i { background: var(--_bad); }
.counts { display: grid; grid-template-columns: repeat(4, minmax(0, 1fr)); gap: 6px; margin: 8px 0; }
.counts div { border: 1px solid var(--_border); border-radius: 7px; padding: 4px 6px; }
.counts b { display: block; font-variant-numeric: tabular-nums; }
.counts span { font-size: 11.5px; color: var(--_muted); }
.actions { display: flex; gap: 8px; flex-wrap: wrap; margin-top: 8px; }
.reason { color: var(--_bad); overflow-wrap: anywhere; }
@media (prefers-reduced-motion: reduce) { .progress > i { transition: none; } }
`;

export class IopRollouts extends IopElement {
  static observedAttributes = ["api-base", "wire-url", "refresh-interval", "selected", "limit"];

  constructor() {
    super(CSS);
    this.rollouts = [];
    this.current = null;
    this.root.innerHTML = `
      <section class="panel" aria-labelledby="rollouts-title">
        <div class="head"><h2 id="rollouts-title">Rollouts</h2><span class="spacer"></span><span class="small muted" data-count></span></div>
        <div class="error" data-error hidden role="alert"></div>
        <div data-list><p class="empty">No rollouts yet. Start one from the command form ("Run on many edges").</p></div>
        <div data-detail aria-live="polite"></div>
      </section>`;
    this.root.querySelector("[data-list]").addEventListener("click", (e) => {
      const row = e.target.closest("tr[data-rollout]");
      if (!row) return;
      this.setAttribute("selected", row.dataset.rollout);
      this.emit("iop-rollout-select", { rolloutId: row.dataset.rollout });
    });
    this.root.querySelector("[data-detail]").addEventListener("click", (e) => {
      const button = e.target.closest("button[data-action]");
      if (button) this.act(button.dataset.action);
    });
  }

  attributeChangedCallback(name, oldValue, newValue) {
    if (name === "selected") {
      if (oldValue !== newValue && this._started) this.reload();
      return;
    }
    super.attributeChangedCallback(name, oldValue, newValue);
  }

  get selectedId() {
    return this.getAttribute("selected") || "";
  }

  liveEdgeId() {
    return "";
  }

  onLiveEvent(event) {
    if (/^rollout\./.test(event.kind || "")) this.refreshSoon();
  }

  async load() {
    const limit = Number(this.getAttribute("limit")) || 20;
    let page;
    try {
      page = await this.fetchJson(`/rollouts?limit=${limit}`);
    } catch (error) {
      // A Control Plane from before rollouts: say so once and stop asking.
      if (!(error instanceof ApiError) || error.code !== "not_found") throw error;
      this.stop();
      this.root.querySelector("[data-list]").innerHTML = `<p class="empty" data-unavailable>This Control Plane has no rollouts view (GET /rollouts answers 404).</p>`;
      return;
    }
    this.rollouts = Array.isArray(page.items) ? page.items : [];
    const id = this.selectedId;
    let current = this.rollouts.find((r) => r.rollout_id === id) || null;
    // The list shows the newest; the selected one may be older than that.
    if (id && !current) current = await this.fetchJson(`/rollouts/${encodeURIComponent(id)}`);
    if (id !== this.selectedId) return;
    this.current = current;
    this.clearError();
    this.root.querySelector("[data-count]").textContent = `${this.rollouts.length} of ${page.total ?? this.rollouts.length}`;
    this.renderList();
    this.renderDetail();
    if (current) this.emit("iop-rollout-loaded", { rollout: current });
    if ([current, ...this.rollouts].some((r) => r && ACTIVE_STATES.has(r.state))) this.scheduleRefresh(ACTIVE_REFRESH_MS);
  }

  renderList() {
    const holder = this.root.querySelector("[data-list]");
    if (!this.rollouts.length) {
      holder.innerHTML = `<p class="empty">No rollouts yet. Start one from the command form ("Run on many edges").</p>`;
      return;
    }
    const rows = this.rollouts
      .map(
        (r) => `<tr data-rollout="${esc(r.rollout_id)}" data-state="${esc(r.state)}" aria-selected="${r.rollout_id === this.selectedId}" tabindex="0">
          <td class="mono">${esc(String(r.rollout_id).slice(0, 8))}</td>
          <td><b>${esc(r.command?.name || "")}</b><div class="small muted">${esc(r.selector || "every edge")}</div></td>
          <td>${badge(r.state)}</td>
          <td class="num">${pct(r.progress)}%</td></tr>`,
      )
      .join("");
    holder.innerHTML = `<div class="scroll"><table class="list" aria-label="Rollouts, newest first">
      <thead><tr><th>Rollout</th><th>Command, selector</th><th>State</th><th class="num">Done</th></tr></thead>
      <tbody>${rows}</tbody></table></div>`;
  }

  renderDetail() {
    const holder = this.root.querySelector("[data-detail]");
    const r = this.current;
    if (!r) {
      holder.innerHTML = "";
      return;
    }
    const counts = r.counts || {};
    const done = pct(r.progress);
    const cells = EXECUTION_STATES.map(
      (s) => `<div data-count-state="${s}"><b>${Number(counts[s]) || 0}</b><span>${esc(s.replace("_", " "))}</span></div>`,
    ).join("");
    const buttons = Object.entries(ACTIONS)
      .map(
        ([action, allowed]) =>
          `<button type="button" class="${action === "cancel" ? "secondary" : ""}" data-action="${action}" ${allowed.has(r.state) ? "" : "disabled"}>${
            action[0].toUpperCase() + action.slice(1)
          }</button>`,
      )
      .join("");
    const batch = r.batch ? `batch ${esc(r.batch.number)} (${esc(r.batch.size)} edges)` : "";
    holder.innerHTML = `<div class="detail" data-rollout-detail="${esc(r.rollout_id)}" data-state="${esc(r.state)}">
      <div class="head"><b>${esc(r.command?.name || "")}</b>${r.command?.target ? ` <span class="muted">→ ${esc(r.command.target)}</span>` : ""}
        <span class="spacer"></span>${badge(r.state)}</div>
      <div class="small muted"><span class="mono">${esc(r.rollout_id)}</span> · selector <span class="mono">${esc(r.selector || "(every edge)")}</span>
        · ${Number(r.targets) || 0} edges${batch ? ` · ${batch}` : ""}</div>
      <div class="progress" role="progressbar" aria-label="Progress" aria-valuemin="0" aria-valuemax="100" aria-valuenow="${done}"
        data-progress="${done}" data-state="${esc(r.state)}"><i style="width:${done}%"></i></div>
      <div class="small">${done}% done · started ${formatTime(r.started_at)}${r.finished_at ? ` · finished ${formatTime(r.finished_at)}` : ""}</div>
      ${r.reason ? `<div class="reason" data-reason>${esc(r.reason)}</div>` : ""}
      <div class="counts" role="group" aria-label="Executions by state">${cells}</div>
      <div class="actions">${buttons}<span class="small muted" data-busy></span></div>
      <div data-action-error></div>
    </div>`;
  }

  /** POST pause / resume / cancel; show the rollout it answers, or the error under the buttons. */
  async act(action) {
    const r = this.current;
    if (!r) return;
    const busy = this.root.querySelector("[data-busy]");
    if (busy) busy.textContent = `${action}…`;
    try {
      const answer = await this.fetchJson(`/rollouts/${encodeURIComponent(r.rollout_id)}/${action}`, { method: "POST", body: {} });
      if (answer && answer.rollout_id === this.selectedId) {
        this.current = answer;
        this.renderDetail();
      }
      this.refreshSoon(0);
    } catch (error) {
      if (!(error instanceof ApiError)) throw error;
      if (error.code === "unauthorized" || error.code === "forbidden") this.emit("iop-auth-required", { code: error.code, message: error.detail });
      const box = this.root.querySelector("[data-action-error]");
      if (box) box.innerHTML = `<div class="error" data-error-code="${esc(error.code)}">${esc(error.code)}: ${esc(error.detail)}</div>`;
      if (busy) busy.textContent = "";
    }
  }
}

/** A fraction 0..1 as a whole percent. */
function pct(fraction) {
  return Math.max(0, Math.min(100, Math.round(Number(fraction) * 100))) || 0;
}

customElements.define("iop-rollouts", IopRollouts);
