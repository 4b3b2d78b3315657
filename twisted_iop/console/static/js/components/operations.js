// <iop-operations edge-id="...">: the command audit of one edge (newest
// first) from GET /edges/{id}/operations; re-fetched on operation.* events
// and polled every `refresh-interval` seconds.
//
// Attributes: edge-id (required), api-base, wire-url, refresh-interval, limit (default 20).
// Events: iop-auth-required {code, message}.

import { edgePath } from "../api.js";
import { IopElement, badge, esc, formatTime, shortTime } from "../base.js";

const CSS = `
.nowrap { white-space: nowrap; }
details summary { cursor: pointer; color: var(--_muted); font-size: 12px; }
.result { font-size: 12px; }
`;

export class IopOperations extends IopElement {
  static observedAttributes = ["edge-id", "api-base", "wire-url", "refresh-interval", "limit"];

  constructor() {
    super(CSS);
    this.root.innerHTML = `
      <section class="panel" aria-labelledby="ops-title">
        <div class="head"><h2 id="ops-title">Operations</h2><span class="spacer"></span><span class="small muted" data-count></span></div>
        <div class="error" data-error hidden role="alert"></div>
        <div data-body><p class="empty">Select an edge.</p></div>
      </section>`;
  }

  onLiveEvent(event) {
    if (/^(operation|command)\./.test(event.kind)) this.refreshSoon();
  }

  async load() {
    const edgeId = this.edgeId;
    if (!edgeId) return;
    const limit = Number(this.getAttribute("limit")) || 20;
    const page = await this.fetchJson(`${edgePath(edgeId, "operations")}?limit=${limit}`);
    if (edgeId !== this.edgeId) return;
    this.clearError();
    this.root.querySelector("[data-count]").textContent = `${page.items.length} of ${page.total}`;
    if (!page.items.length) {
      this.root.querySelector("[data-body]").innerHTML = `<p class="empty">No commands were sent to this edge yet.</p>`;
      return;
    }
    const open = new Set(
      [...this.root.querySelectorAll("details[open]")].map((d) => d.closest("tr")?.dataset.operation),
    );
    const rows = page.items
      .map((op) => {
        const result = Object.entries(op.result || {}).map(([k, v]) => `${esc(k)}=${esc(v)}`).join(", ");
        const history = (op.history || [])
          .map((h) => `<li>${formatTime(h.at)} ${esc(h.state)}${h.reason ? ` — ${esc(h.reason)}` : ""}</li>`)
          .join("");
        return `<tr data-operation="${esc(op.operation_id)}" data-state="${esc(op.state)}">
          <td class="small nowrap">${shortTime(op.created_at)}</td>
          <td><b>${esc(op.name)}</b>${op.target ? ` <span class="muted">→ ${esc(op.target)}</span>` : ""}</td>
          <td>${badge(op.state)}</td>
          <td class="result">${esc(op.reason || "")}${op.reason && result ? "<br>" : ""}${result}
            ${history ? `<details${open.has(op.operation_id) ? " open" : ""}><summary>history</summary><ul class="small">${history}</ul></details>` : ""}</td>
        </tr>`;
      })
      .join("");
    this.root.querySelector("[data-body]").innerHTML = `
      <table aria-label="Operations of ${esc(edgeId)}">
        <thead><tr><th>Created</th><th>Command</th><th>State</th><th>Reason / result</th></tr></thead>
        <tbody>${rows}</tbody></table>`;
  }
}

customElements.define("iop-operations", IopOperations);
