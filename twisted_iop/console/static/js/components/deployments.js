// <iop-deployments>: the deployments of the fleet (GET /deployments) with
// each one's rollup as a bar (ready of desired) and, for the selected one
// (GET /deployments/{name}), its counts of edges by state and one row per
// edge and instance with its state and reason. A form takes a name and a
// spec (JSON, as PUT /deployments/{name} takes it): "Dry run" shows the
// placement (PUT ?dry_run=true: what would start, restart, stay or stop on
// which node, and what cannot be placed and why) before "Apply" sends it.
// While a deployment is not ready the panel re-reads every second;
// deployment.* events on the fleet stream re-read it at once.
//
// Attributes: api-base, wire-url, refresh-interval, selected (deployment name).
// Events: iop-deployment-select {name}; iop-deployment-loaded {deployment};
//         iop-auth-required {code, message}.

import { ApiError } from "../api.js";
import { IopElement, badge, esc } from "../base.js";

/** Re-read interval while a deployment is not ready everywhere (ms). */
export const ACTIVE_REFRESH_MS = 1000;
/** Edge states, in the order the counts are shown. */
export const EDGE_STATES = ["ready", "progressing", "out_of_sync", "failed", "offline", "held"];

const CSS = `
.list { width: 100%; }
.list tr { cursor: pointer; }
.list tr[aria-selected="true"] td { background: color-mix(in srgb, var(--_accent) 12%, transparent); }
.detail, .plan { margin-top: 12px; border: 1px solid var(--_border); border-radius: 8px; padding: 10px 12px; background: var(--_bg); }
.bar { height: 10px; border-radius: 5px; background: var(--_off-bg); overflow: hidden; min-width: 80px; }
.bar > i { display: block; height: 100%; background: var(--_ok); }
.counts { display: grid; grid-template-columns: repeat(6, minmax(0, 1fr)); gap: 6px; margin: 8px 0; }
.counts div { border: 1px solid var(--_border); border-radius: 7px; padding: 4px 6px; }
.counts b { display: block; font-variant-numeric: tabular-nums; }
.counts span { font-size: 11.5px; color: var(--_muted); }
form { display: grid; gap: 6px; margin-top: 12px; }
textarea { min-height: 7em; font-family: var(--_mono, monospace); }
.actions { display: flex; gap: 8px; flex-wrap: wrap; }
.reason { color: var(--_bad); overflow-wrap: anywhere; }
`;

const EXAMPLE = '{"model": "m1", "profile": "mock", "parameters": {"tokens_per_second": 100}, "edge_selector": "site=lab"}';

export class IopDeployments extends IopElement {
  static observedAttributes = ["api-base", "wire-url", "refresh-interval", "selected"];

  constructor() {
    super(CSS);
    this.deployments = [];
    this.current = null;
    this.root.innerHTML = `
      <section class="panel" aria-labelledby="deployments-title">
        <div class="head"><h2 id="deployments-title">Deployments</h2><span class="spacer"></span><span class="small muted" data-count></span></div>
        <div class="error" data-error hidden role="alert"></div>
        <div data-list><p class="empty">No deployments yet.</p></div>
        <div data-detail aria-live="polite"></div>
        <form data-form aria-label="Apply a deployment">
          <label for="dep-name">Name</label>
          <input id="dep-name" name="name" autocomplete="off" spellcheck="false" placeholder="chat">
          <label for="dep-spec">Spec (JSON)</label>
          <textarea id="dep-spec" name="spec" spellcheck="false" placeholder='${esc(EXAMPLE)}'></textarea>
          <div class="actions">
            <button type="button" data-dry-run>Dry run</button>
            <button type="submit" data-apply>Apply</button>
            <span class="small muted" data-busy></span>
          </div>
          <div data-form-error></div>
        </form>
        <div data-plan aria-live="polite"></div>
      </section>`;
    this.root.querySelector("[data-list]").addEventListener("click", (e) => {
      const row = e.target.closest("tr[data-deployment]");
      if (!row) return;
      this.setAttribute("selected", row.dataset.deployment);
      this.emit("iop-deployment-select", { name: row.dataset.deployment });
    });
    const form = this.root.querySelector("[data-form]");
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      this.put(false);
    });
    this.root.querySelector("[data-dry-run]").addEventListener("click", () => this.put(true));
  }

  attributeChangedCallback(name, oldValue, newValue) {
    if (name === "selected") {
      if (oldValue !== newValue && this._started) this.reload();
      return;
    }
    super.attributeChangedCallback(name, oldValue, newValue);
  }

  get selectedName() {
    return this.getAttribute("selected") || "";
  }

  liveEdgeId() {
    return "";
  }

  onLiveEvent(event) {
    if (/^deployment\./.test(event.kind || "")) this.refreshSoon();
  }

  async load() {
    let page;
    try {
      page = await this.fetchJson("/deployments");
    } catch (error) {
      // A Control Plane from before deployments: say so once and stop asking.
      if (!(error instanceof ApiError) || error.code !== "not_found") throw error;
      this.stop();
      this.root.querySelector("[data-list]").innerHTML = `<p class="empty" data-unavailable>This Control Plane has no deployments view (GET /deployments answers 404).</p>`;
      return;
    }
    this.deployments = Array.isArray(page.items) ? page.items : [];
    const name = this.selectedName || (this.deployments[0] && this.deployments[0].name) || "";
    let current = null;
    if (name) {
      try {
        current = await this.fetchJson(`/deployments/${encodeURIComponent(name)}`);
      } catch (error) {
        if (!(error instanceof ApiError) || error.code !== "unknown_deployment") throw error;
      }
    }
    this.current = current;
    this.clearError();
    this.root.querySelector("[data-count]").textContent = `${this.deployments.length}`;
    this.renderList();
    this.renderDetail();
    if (current) this.emit("iop-deployment-loaded", { deployment: current });
    if (this.deployments.some((d) => !isDone(d.rollup))) this.scheduleRefresh(ACTIVE_REFRESH_MS);
  }

  renderList() {
    const holder = this.root.querySelector("[data-list]");
    if (!this.deployments.length) {
      holder.innerHTML = `<p class="empty">No deployments yet.</p>`;
      return;
    }
    const shown = this.current ? this.current.name : "";
    const rows = this.deployments
      .map((d) => {
        const r = d.rollup || {};
        return `<tr data-deployment="${esc(d.name)}" aria-selected="${d.name === shown}" tabindex="0">
          <td><b>${esc(d.name)}</b><div class="small muted">${esc(d.spec?.model || "")} · ${esc(d.spec?.profile || "")}</div></td>
          <td class="mono small">${esc(d.spec?.edge_selector || "(every edge)")}</td>
          <td class="num">${esc(d.generation)}</td>
          <td>${bar(r)}<div class="small" data-ready>${Number(r.ready) || 0}/${Number(r.desired) || 0} ready</div></td></tr>`;
      })
      .join("");
    holder.innerHTML = `<div class="scroll"><table class="list" aria-label="Deployments">
      <thead><tr><th>Deployment</th><th>Edges</th><th class="num">Gen</th><th>Ready</th></tr></thead>
      <tbody>${rows}</tbody></table></div>`;
  }

  renderDetail() {
    const holder = this.root.querySelector("[data-detail]");
    const d = this.current;
    if (!d) {
      holder.innerHTML = "";
      return;
    }
    const r = d.rollup || {};
    const cells = EDGE_STATES.map(
      (s) => `<div data-count-state="${s}"><b>${Number(r[s]) || 0}</b><span>${esc(s.replace("_", " "))}</span></div>`,
    ).join("");
    const rows = (d.edges?.items || [])
      .flatMap((edge) => {
        const instances = edge.instances && edge.instances.length ? edge.instances : [null];
        return instances.map(
          (i) => `<tr data-edge="${esc(edge.edge_id)}" data-edge-state="${esc(edge.state)}"${i ? ` data-instance="${esc(i.instance_id)}" data-instance-state="${esc(i.state)}"` : ""}>
            <td>${esc(edge.edge_id)}</td><td>${badge(edge.state)}</td>
            <td class="mono">${i ? esc(i.instance_id) : "-"}</td><td>${i ? esc(i.node_id || "-") : "-"}</td>
            <td>${i ? badge(i.state) : "-"}</td><td class="small">${esc((i && i.reason) || edge.reason || "")}</td></tr>`,
        );
      })
      .join("");
    holder.innerHTML = `<div class="detail" data-deployment-detail="${esc(d.name)}">
      <div class="head"><b>${esc(d.name)}</b> <span class="muted">generation ${esc(d.generation)}</span><span class="spacer"></span>
        <span class="small" data-rollup-text>${Number(r.ready) || 0}/${Number(r.desired) || 0} ready</span></div>
      <div class="small muted">${esc(d.spec?.model || "")} with profile ${esc(d.spec?.profile || "")} · spec hash <span class="mono">${esc(d.spec_hash)}</span></div>
      ${rollText(d.roll)}
      <div class="counts" role="group" aria-label="Edges by state">${cells}</div>
      <div class="scroll"><table aria-label="Edges and instances">
        <thead><tr><th>Edge</th><th>State</th><th>Instance</th><th>Node</th><th>Instance state</th><th>Reason</th></tr></thead>
        <tbody>${rows}</tbody></table></div>
    </div>`;
  }

  renderPlan(plan) {
    const holder = this.root.querySelector("[data-plan]");
    const rows = (plan.edges || [])
      .flatMap((edge) => [
        ...(edge.changes || []).map(
          (c) => `<tr data-plan-action="${esc(c.action)}" data-instance="${esc(c.instance_id)}"><td>${esc(edge.edge_id)}</td><td>${badge(c.action)}</td>
            <td class="mono">${esc(c.instance_id)}</td><td>${esc(c.node_id)}</td><td class="small">${esc(edge.note || "")}</td></tr>`,
        ),
        ...(edge.problems || []).map(
          (p) => `<tr data-plan-action="problem" data-instance="${esc(p.instance_id)}"><td>${esc(edge.edge_id)}</td><td>${badge("failed", "cannot place")}</td>
            <td class="mono">${esc(p.instance_id)}</td><td>-</td><td class="reason small">${esc(p.reason)}</td></tr>`,
        ),
      ])
      .join("");
    const s = plan.summary || {};
    holder.innerHTML = `<div class="plan" data-plan-for="${esc(plan.name)}">
      <div class="head"><b>Dry run of ${esc(plan.name)}</b><span class="spacer"></span>
        <span class="small">start ${Number(s.start) || 0} · restart ${Number(s.restart) || 0} · stay ${Number(s.stay) || 0} · stop ${Number(s.stop) || 0} · cannot place ${Number(s.unplaceable) || 0}</span></div>
      ${rows ? `<table aria-label="Placement"><thead><tr><th>Edge</th><th>Action</th><th>Instance</th><th>Node</th><th>Note</th></tr></thead><tbody>${rows}</tbody></table>` : `<p class="empty">No edge is selected.</p>`}
    </div>`;
  }

  /** PUT the form's deployment (a dry run, or for real); show the placement or select what was applied. */
  async put(dryRun) {
    const name = this.root.querySelector("#dep-name").value.trim();
    const errorBox = this.root.querySelector("[data-form-error]");
    const busy = this.root.querySelector("[data-busy]");
    errorBox.innerHTML = "";
    let spec;
    try {
      spec = JSON.parse(this.root.querySelector("#dep-spec").value || "{}");
    } catch (error) {
      errorBox.innerHTML = `<div class="error" data-error-code="invalid_json">the spec is not JSON: ${esc(error.message)}</div>`;
      return;
    }
    busy.textContent = dryRun ? "dry run…" : "applying…";
    try {
      const path = `/deployments/${encodeURIComponent(name)}${dryRun ? "?dry_run=true" : ""}`;
      const answer = await this.fetchJson(path, { method: "PUT", body: spec });
      if (dryRun) {
        this.renderPlan(answer);
      } else {
        this.root.querySelector("[data-plan]").innerHTML = "";
        this.setAttribute("selected", answer.name);
        this.refreshSoon(0);
      }
    } catch (error) {
      if (!(error instanceof ApiError)) throw error;
      if (error.code === "unauthorized" || error.code === "forbidden") this.emit("iop-auth-required", { code: error.code, message: error.detail });
      errorBox.innerHTML = `<div class="error" data-error-code="${esc(error.code)}">${esc(error.code)}: ${esc(error.detail)}</div>`;
    } finally {
      busy.textContent = "";
    }
  }
}

/** The deployment's roll as one line (nothing when it never rolled a change out). */
function rollText(roll) {
  if (!roll) return "";
  const failed = Number(roll.failed) ? `, ${Number(roll.failed)} failed` : "";
  const reason = roll.reason ? ` · ${esc(roll.reason)}` : "";
  return `<div class="small" data-roll-state="${esc(roll.state)}">rollout ${esc(roll.state)}: ${Number(roll.reached) || 0} reached, ${Number(roll.pending) || 0} pending${failed}${reason}</div>`;
}

/** Whether every edge a rollup wants is ready. */
function isDone(rollup) {
  const r = rollup || {};
  return Number(r.desired) > 0 && Number(r.ready) === Number(r.desired);
}

/** The ready share of a rollup as a bar. */
function bar(rollup) {
  const desired = Number(rollup.desired) || 0;
  const done = desired ? Math.round((100 * (Number(rollup.ready) || 0)) / desired) : 0;
  return `<div class="bar" role="progressbar" aria-label="Ready" aria-valuemin="0" aria-valuemax="100" aria-valuenow="${done}"><i style="width:${done}%"></i></div>`;
}

customElements.define("iop-deployments", IopDeployments);
