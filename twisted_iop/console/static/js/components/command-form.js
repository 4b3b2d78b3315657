// <iop-command-form edge-id="...">: a form generated from the edge's
// command catalog (GET /edges/{id}/commands): command, target (when the
// command takes one), its arguments, timeout and idempotency key. Submitting
// POSTs /edges/{id}/commands and shows the resulting operation (succeeded,
// failed, rejected, or timed_out / edge_disconnected with the error).
//
// Attributes: edge-id (required), api-base, wire-url.
// Events: iop-command-result {operation, error} after each submission
//         (error is {code, message, status} or null);
//         iop-auth-required {code, message}.

import { ApiError, edgePath } from "../api.js";
import { IopElement, badge, esc } from "../base.js";

const CSS = `
form { display: grid; gap: 10px; }
.field { display: grid; gap: 3px; align-content: start; }
.row { display: grid; grid-template-columns: 1fr 1fr; gap: 10px; }
.desc { font-size: 12px; color: var(--_muted); min-height: 1em; }
.actions { display: flex; gap: 10px; align-items: center; }
.outcome { margin-top: 10px; border: 1px solid var(--_border); border-radius: 8px; padding: 8px 10px; background: var(--_bg); }
.outcome table { margin-top: 6px; }
.req::after { content: " *"; color: var(--_bad); }
`;

export class IopCommandForm extends IopElement {
  static observedAttributes = ["edge-id", "api-base", "wire-url"];

  constructor() {
    super(CSS);
    this.catalogKey = "";
    this.commands = [];
    this.root.innerHTML = `
      <section class="panel" aria-labelledby="cmd-title">
        <div class="head"><h2 id="cmd-title">Run a command</h2></div>
        <div class="error" data-error hidden role="alert"></div>
        <div data-form><p class="empty">Select an edge.</p></div>
        <div data-outcome aria-live="polite"></div>
      </section>`;
  }

  /** The catalog is re-read when the edge (re)connects, not on a timer. */
  get refreshIntervalMs() {
    return 0;
  }

  onLiveEvent(event) {
    if (event.kind === "edge.connected") this.refreshSoon();
  }

  start() {
    this.catalogKey = "";
    this.root.querySelector("[data-outcome]").innerHTML = "";
    super.start();
  }

  async load() {
    const edgeId = this.edgeId;
    if (!edgeId) return;
    const catalog = await this.fetchJson(edgePath(edgeId, "commands"));
    if (edgeId !== this.edgeId) return;
    this.clearError();
    const key = JSON.stringify(catalog.commands || []);
    if (key === this.catalogKey) return; // keep what the user typed
    this.catalogKey = key;
    this.commands = catalog.commands || [];
    this.renderForm();
  }

  renderForm() {
    const holder = this.root.querySelector("[data-form]");
    if (!this.commands.length) {
      holder.innerHTML = `<p class="empty">This edge announced no commands.</p>`;
      return;
    }
    const options = this.commands
      .map((c) => `<option value="${esc(c.name)}">${esc(c.name)}</option>`)
      .join("");
    holder.innerHTML = `
      <form novalidate>
        <div class="field"><label for="cmd-name">Command</label>
          <select id="cmd-name" name="name">${options}</select>
          <div class="desc" data-desc></div></div>
        <div data-params></div>
        <div class="row">
          <div class="field"><label for="cmd-timeout">Timeout (s)</label>
            <input id="cmd-timeout" name="timeout" type="number" min="1" max="300" step="1" placeholder="10"></div>
          <div class="field"><label for="cmd-key">Idempotency key</label>
            <input id="cmd-key" name="idempotency_key" type="text" placeholder="optional" autocomplete="off"></div>
        </div>
        <div class="actions"><button type="submit">Run</button><span class="small muted" data-busy></span></div>
      </form>`;
    const form = holder.querySelector("form");
    const select = form.querySelector("select");
    select.addEventListener("change", () => this.renderParams());
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      this.submit(form);
    });
    this.renderParams();
  }

  selected() {
    const name = this.root.querySelector("#cmd-name")?.value;
    return this.commands.find((c) => c.name === name);
  }

  renderParams() {
    const command = this.selected();
    if (!command) return;
    this.root.querySelector("[data-desc]").textContent = command.description || "";
    const fields = [];
    if (command.target_kind) {
      fields.push(`<div class="field"><label class="req" for="cmd-target">Target ${esc(command.target_kind)}</label>
        <input id="cmd-target" name="target" type="text" required autocomplete="off" placeholder="${esc(command.target_kind)} id"></div>`);
    }
    (command.arguments || []).forEach((arg, i) => {
      fields.push(`<div class="field"><label ${arg.required ? 'class="req"' : ""} for="cmd-arg-${i}">${esc(arg.name)}</label>
        <input id="cmd-arg-${i}" data-arg="${esc(arg.name)}" type="text" ${arg.required ? "required" : ""} autocomplete="off"
          placeholder="${arg.required ? "required" : "optional"}" aria-describedby="cmd-arg-${i}-desc">
        <div class="desc" id="cmd-arg-${i}-desc">${esc(arg.description || "")}</div></div>`);
    });
    this.root.querySelector("[data-params]").innerHTML = fields.length ? `<div class="row">${fields.join("")}</div>` : "";
  }

  async submit(form) {
    const command = this.selected();
    if (!command) return;
    const body = { name: command.name, arguments: {} };
    const target = form.querySelector("#cmd-target");
    if (target) {
      if (!target.value.trim()) {
        target.focus();
        this.showOutcome(null, { code: "bad_request", message: `the command needs a target ${command.target_kind}` });
        return;
      }
      body.target = target.value.trim();
    }
    for (const input of form.querySelectorAll("[data-arg]")) {
      if (input.value !== "") body.arguments[input.dataset.arg] = input.value;
      else if (input.required) {
        input.focus();
        this.showOutcome(null, { code: "bad_request", message: `argument ${input.dataset.arg} is required` });
        return;
      }
    }
    const timeout = form.querySelector("#cmd-timeout").value;
    if (timeout) body.timeout_seconds = Number(timeout);
    const key = form.querySelector("#cmd-key").value.trim();
    if (key) body.idempotency_key = key;
    const button = form.querySelector("button[type=submit]");
    const busy = form.querySelector("[data-busy]");
    button.disabled = true;
    busy.textContent = `running ${command.name}…`;
    let operation = null;
    let error = null;
    try {
      operation = await this.fetchJson(edgePath(this.edgeId, "commands"), { method: "POST", body });
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      error = { code: e.code, message: e.detail, status: e.status };
      operation = e.body?.operation || null;
      if (e.code === "unauthorized" || e.code === "forbidden") this.emit("iop-auth-required", { code: e.code, message: e.detail });
    } finally {
      button.disabled = false;
      busy.textContent = "";
    }
    this.showOutcome(operation, error);
    this.emit("iop-command-result", { operation, error });
  }

  showOutcome(operation, error) {
    const parts = [];
    if (operation) {
      const result = Object.entries(operation.result || {})
        .map(([k, v]) => `<tr><td>${esc(k)}</td><td class="mono">${esc(v)}</td></tr>`)
        .join("");
      parts.push(`<div><b>${esc(operation.name)}</b>${operation.target ? ` → ${esc(operation.target)}` : ""} ${badge(operation.state)}
        <span class="small muted mono">${esc(operation.operation_id)}</span></div>
        ${operation.reason ? `<div class="small">${esc(operation.reason)}</div>` : ""}
        ${result ? `<table aria-label="Result"><tbody>${result}</tbody></table>` : ""}`);
    }
    if (error) parts.push(`<div class="error">${esc(error.code)}: ${esc(error.message)}</div>`);
    this.root.querySelector("[data-outcome]").innerHTML = `<div class="outcome" data-state="${esc(operation?.state || error?.code || "")}">${parts.join("")}</div>`;
  }
}

customElements.define("iop-command-form", IopCommandForm);
