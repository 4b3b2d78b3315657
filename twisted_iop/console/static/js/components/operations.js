// <iop-operations edge-id="...">: the command audit of one edge (newest
// first) from GET /edges/{id}/operations: when, state, command and target,
// reason, the result as a key/value list, a late answer when the server
// reports one, and the state history on demand. Re-fetched on operation.*
// and command.* events (coalesced) and polled every `refresh-interval` s.
//
// Attributes: edge-id (required), api-base, wire-url, refresh-interval, limit (default 20).
// Events: iop-auth-required {code, message}.

import { edgePath } from "../api.js";
import { IopElement, badge, esc, formatTime, shortTime } from "../base.js";

const CSS = `
.nowrap { white-space: nowrap; }
details summary { cursor: pointer; color: var(--_muted); font-size: 12px; }
.what { overflow-wrap: anywhere; width: 100%; }
.result { font-size: 12px; }
.late { font-size: 12px; }
dl { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: 1px 10px; margin: 2px 0; }
dt { color: var(--_muted); }
dd { margin: 0; font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.late { color: var(--_warn); }
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
    if (/^(operation|command)\./.test(event.kind)) this.refreshForEvents();
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
        const result = Object.entries(op.result || {})
          .map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(typeof v === "string" ? v : JSON.stringify(v))}</dd>`)
          .join("");
        const late = op.late_outcome && typeof op.late_outcome === "object" ? op.late_outcome : null;
        const lateLine = late
          ? `<div class="late" data-late-outcome>late answer: ${esc(late.state || "?")}${late.reason ? ` — ${esc(late.reason)}` : ""}${
              late.received_at ? ` (${formatTime(late.received_at)})` : ""
            }</div>`
          : "";
        const history = (op.history || [])
          .map((h) => `<li>${formatTime(h.at)} ${esc(h.state)}${h.reason ? ` — ${esc(h.reason)}` : ""}</li>`)
          .join("");
        // Two cells, so the command, reason and result get the panel's width even in a narrow column.
        return `<tr data-operation="${esc(op.operation_id)}" data-state="${esc(op.state)}">
          <td class="small nowrap">${shortTime(op.created_at)}<br>${badge(op.state)}</td>
          <td class="what"><b>${esc(op.name)}</b>${op.target ? ` <span class="muted">→ ${esc(op.target)}</span>` : ""}
            ${op.reason ? `<div class="small">${esc(op.reason)}</div>` : ""}
            ${result ? `<dl class="result" aria-label="Result">${result}</dl>` : ""}${lateLine}
            ${history ? `<details${open.has(op.operation_id) ? " open" : ""}><summary>history</summary><ul class="small">${history}</ul></details>` : ""}</td>
        </tr>`;
      })
      .join("");
    this.root.querySelector("[data-body]").innerHTML = `
      <div class="scroll"><table aria-label="Operations of ${esc(edgeId)}">
        <thead><tr><th>Created / state</th><th>Command, reason, result</th></tr></thead>
        <tbody>${rows}</tbody></table></div>`;
  }
}

customElements.define("iop-operations", IopOperations);
