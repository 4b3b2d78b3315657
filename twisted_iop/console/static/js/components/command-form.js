// <iop-command-form edge-id="...">: a form generated from the edge's
// command catalog (GET /edges/{id}/commands): command, target (a choice of
// the edge's nodes from its status for `target_kind: node`, of its
// node/provider pairs for `target_kind: provider`, with a launched
// engine's state beside it; none for `edge` or no kind), its arguments,
// timeout and idempotency key. Submitting POSTs
// /edges/{id}/commands and shows the resulting operation as a key/value
// list: state, reason, result, a late outcome and a replay when the server
// reports them, or the error (timed_out / edge_disconnected carry the
// operation).
//
// "Run on many edges" turns the same form into a rollout (POST /rollouts):
// the command, with a label selector of the edges, an optional node
// selector, the batch size, the most in flight, the pause between batches,
// the abort criteria (failed share after a minimum executed) and what to do
// with disconnected edges; the answer is the rollout, which the page shows
// in <iop-rollouts>.
//
// Attributes: edge-id (required), api-base, wire-url.
// Events: iop-command-result {operation, error} after each submission
//         (error is {code, message, status} or null);
//         iop-rollout-created {rollout} after a rollout was started (or replayed);
//         iop-auth-required {code, message}.

import { ApiError, edgePath, isAuthError } from "../api.js";
import { IopElement, badge, esc, formatTime } from "../base.js";

const CSS = `
form { display: grid; gap: 10px; }
.field { display: grid; gap: 3px; align-content: start; min-width: 0; }
.field select, .field input { width: 100%; }
.row { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 10px; }
.desc { font-size: 12px; color: var(--_muted); min-height: 1em; }
.actions { display: flex; gap: 10px; align-items: center; }
.outcome { margin-top: 10px; border: 1px solid var(--_border); border-radius: 8px; padding: 8px 10px; background: var(--_bg); }
.params { display: grid; gap: 10px; }
.params:empty { display: none; }
.req::after { content: " *"; color: var(--_bad); }
.outcome h4 { margin: 10px 0 4px; font-size: 12px; color: var(--_muted); text-transform: uppercase; letter-spacing: .04em; }
dl { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: 3px 12px; margin: 6px 0 0; }
dt { color: var(--_muted); font-size: 12.5px; }
dd { margin: 0; overflow-wrap: anywhere; }
dd.mono { white-space: pre-wrap; }
.note { margin-top: 8px; font-size: 12.5px; color: var(--_warn); }
fieldset { border: 1px solid var(--_border); border-radius: 8px; padding: 8px 10px; margin: 0; display: grid; gap: 10px; min-width: 0; }
fieldset[hidden] { display: none; }
.check { display: flex; gap: 6px; align-items: center; font-size: 13px; color: var(--_fg); font-weight: 600; }
.row3 { display: grid; grid-template-columns: repeat(3, minmax(0, 1fr)); gap: 10px; }
@media (max-width: 520px) { .row { grid-template-columns: minmax(0, 1fr); } }
`;

export class IopCommandForm extends IopElement {
  static observedAttributes = ["edge-id", "api-base", "wire-url"];

  constructor() {
    super(CSS);
    this.catalogKey = "";
    this.commands = [];
    this.nodes = null; // [{node_id, connected, drained}] of the edge's last snapshot, null until known
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
    // The catalog changes when the edge (re)connects; the node choice when nodes come and go.
    if (/^(edge\.connected|node\.)/.test(event.kind || "")) this.refreshForEvents();
  }

  start() {
    this.catalogKey = "";
    this.nodes = null;
    this.root.querySelector("[data-outcome]").innerHTML = "";
    super.start();
  }

  async load() {
    const edgeId = this.edgeId;
    if (!edgeId) return;
    const catalog = await this.fetchJson(edgePath(edgeId, "commands"));
    if (edgeId !== this.edgeId) return;
    const commands = Array.isArray(catalog.commands) ? catalog.commands : [];
    this.clearError();
    const key = JSON.stringify(commands);
    if (key !== this.catalogKey) {
      this.catalogKey = key;
      this.commands = commands;
      this.renderForm();
    }
    if (!commands.some((c) => c.target_kind === "node" || c.target_kind === "provider")) return;
    // The catalog shows at once; the node choice follows when the status answers.
    const nodes = await this.fetchNodes(edgeId);
    if (edgeId !== this.edgeId || JSON.stringify(nodes) === JSON.stringify(this.nodes)) return;
    this.nodes = nodes;
    this.renderTargets(); // keeps the chosen node and what the user typed
  }

  /** The edge's nodes from its status (the stale snapshot when it is not reachable); the old list when none. */
  async fetchNodes(edgeId) {
    let snapshot;
    try {
      snapshot = await this.fetchJson(edgePath(edgeId, "status"));
    } catch (error) {
      if (!(error instanceof ApiError) || isAuthError(error)) throw error;
      snapshot = error.body?.snapshot;
      if (!snapshot) return this.nodes;
    }
    return (Array.isArray(snapshot.nodes) ? snapshot.nodes : [])
      .filter((n) => typeof n?.node_id === "string" && n.node_id)
      .map((n) => ({
        node_id: n.node_id,
        connected: Boolean(n.connected),
        drained: Boolean(n.drained),
        providers: (Array.isArray(n.providers) ? n.providers : [])
          .filter((p) => typeof p?.provider_id === "string" && p.provider_id)
          .map((p) => ({ provider_id: p.provider_id, launch: typeof p.launch?.state === "string" ? p.launch.state : "" })),
      }));
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
        <div data-params class="params"></div>
        <div class="row">
          <div class="field"><label for="cmd-timeout">Timeout (s)</label>
            <input id="cmd-timeout" name="timeout" type="number" min="1" max="300" step="1" placeholder="default"></div>
          <div class="field"><label for="cmd-key">Idempotency key</label>
            <input id="cmd-key" name="idempotency_key" type="text" placeholder="optional" autocomplete="off"></div>
        </div>
        <label class="check"><input type="checkbox" id="cmd-many" name="many"> Run on many edges (a rollout)</label>
        <fieldset data-rollout hidden aria-label="Rollout">
          <div class="field"><label class="req" for="ro-selector">Edges (label selector)</label>
            <input id="ro-selector" name="selector" type="text" autocomplete="off" spellcheck="false" placeholder="region=eu,tier!=canary"
              aria-describedby="ro-selector-desc">
            <div class="desc" id="ro-selector-desc">Kubernetes syntax on the edges' labels; empty means every edge.</div></div>
          <div class="field"><label for="ro-node-selector">Nodes (label selector, instead of a target)</label>
            <input id="ro-node-selector" name="node_selector" type="text" autocomplete="off" spellcheck="false" placeholder="optional"></div>
          <div class="row3">
            <div class="field"><label for="ro-batch">Batch size</label>
              <input id="ro-batch" name="batch_size" type="number" min="1" step="1" value="${ROLLOUT_DEFAULTS.batch_size}"></div>
            <div class="field"><label for="ro-in-flight">Most in flight</label>
              <input id="ro-in-flight" name="max_in_flight" type="number" min="1" step="1" value="${ROLLOUT_DEFAULTS.max_in_flight}"></div>
            <div class="field"><label for="ro-pause">Pause between batches (s)</label>
              <input id="ro-pause" name="pause_seconds" type="number" min="0" step="any" value="${ROLLOUT_DEFAULTS.pause_seconds}"></div>
          </div>
          <div class="row3">
            <div class="field"><label for="ro-abort-percent">Abort above failed %</label>
              <input id="ro-abort-percent" name="failure_percent" type="number" min="0" max="100" step="any" value="${ROLLOUT_DEFAULTS.failure_percent}"></div>
            <div class="field"><label for="ro-min-executed">… once executed</label>
              <input id="ro-min-executed" name="min_executed" type="number" min="0" step="1" value="${ROLLOUT_DEFAULTS.min_executed}"></div>
            <div class="field"><label for="ro-disconnected">Disconnected edges</label>
              <select id="ro-disconnected" name="disconnected"><option value="wait">wait for them</option><option value="skip">skip them</option></select></div>
          </div>
        </fieldset>
        <div class="actions"><button type="submit">Run</button><span class="small muted" data-busy></span></div>
      </form>`;
    const form = holder.querySelector("form");
    const select = form.querySelector("select");
    select.addEventListener("change", () => this.renderParams());
    const many = form.querySelector("#cmd-many");
    many.addEventListener("change", () => {
      form.querySelector("[data-rollout]").hidden = !many.checked;
      form.querySelector("button[type=submit]").textContent = many.checked ? "Start rollout" : "Run";
    });
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
    let target = "";
    if (command.target_kind === "node" || command.target_kind === "provider") {
      target = `<div class="field"><label class="req" for="cmd-target">Target ${esc(command.target_kind)}</label>
        <select id="cmd-target" name="target" data-kind="${esc(command.target_kind)}" required></select></div>`;
    } else if (command.target_kind && command.target_kind !== "edge") {
      // A kind this console has no list for: the operator types the id.
      target = `<div class="field"><label class="req" for="cmd-target">Target ${esc(command.target_kind)}</label>
        <input id="cmd-target" name="target" type="text" required autocomplete="off" placeholder="${esc(command.target_kind)} id"></div>`;
    }
    const fields = (command.arguments || []).map(
      (arg, i) => `<div class="field"><label ${arg.required ? 'class="req"' : ""} for="cmd-arg-${i}">${esc(arg.name)}</label>
        <input id="cmd-arg-${i}" data-arg="${esc(arg.name)}" type="text" ${arg.required ? "required" : ""} autocomplete="off"
          placeholder="${arg.required ? "required" : "optional"}" aria-describedby="cmd-arg-${i}-desc">
        <div class="desc" id="cmd-arg-${i}-desc">${esc(arg.description || "")}</div></div>`,
    );
    this.root.querySelector("[data-params]").innerHTML =
      target + (fields.length ? `<div class="row">${fields.join("")}</div>` : "");
    this.renderTargets();
  }

  /** Fill the node (or node/provider) choice from the edge's nodes, keeping the chosen one. */
  renderTargets() {
    const select = this.root.querySelector("select#cmd-target");
    if (!select) return;
    const chosen = select.value;
    const nodes = this.nodes || [];
    const providers = select.dataset.kind === "provider";
    const choices = providers
      ? nodes.flatMap((n) =>
          n.providers.map((p) => ({
            value: `${n.node_id}/${p.provider_id}`,
            notes: [n.connected ? "" : "not connected", p.launch ? `engine ${p.launch}` : "not launched"],
          })),
        )
      : nodes.map((n) => ({ value: n.node_id, notes: [n.connected ? "" : "not connected", n.drained ? "drained" : ""] }));
    if (!choices.length) {
      const what = providers ? "providers" : "nodes";
      select.innerHTML = `<option value="">${this.nodes ? `this edge has no ${what}` : `${what} not known yet`}</option>`;
      select.disabled = true;
      return;
    }
    select.disabled = false;
    select.innerHTML = choices
      .map((c) => {
        const notes = c.notes.filter(Boolean).join(", ");
        return `<option value="${esc(c.value)}">${esc(c.value)}${notes ? ` (${esc(notes)})` : ""}</option>`;
      })
      .join("");
    if (choices.some((c) => c.value === chosen)) select.value = chosen;
  }

  async submit(form) {
    const command = this.selected();
    if (!command) return;
    const body = { name: command.name, arguments: {} };
    const many = form.querySelector("#cmd-many").checked;
    const nodeSelector = many ? form.querySelector("#ro-node-selector").value.trim() : "";
    if (nodeSelector) body.node_selector = nodeSelector;
    const target = nodeSelector ? null : form.querySelector("#cmd-target");
    if (target) {
      if (!target.value.trim()) {
        if (!target.disabled) target.focus();
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
    const key = form.querySelector("#cmd-key").value.trim();
    if (many) {
      const request = rolloutRequest(form, body);
      if (timeout) request.timeout_seconds = Number(timeout);
      if (key) request.idempotency_key = key;
      await this.startRollout(form, request);
      return;
    }
    if (timeout) body.timeout_seconds = Number(timeout);
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

  /** POST /rollouts; show the rollout started (or the error) and tell the page. */
  async startRollout(form, request) {
    const button = form.querySelector("button[type=submit]");
    const busy = form.querySelector("[data-busy]");
    button.disabled = true;
    busy.textContent = `starting a rollout of ${request.command.name}…`;
    // The last outcome would otherwise stand for this one until the answer comes.
    this.root.querySelector("[data-outcome]").innerHTML = "";
    let rollout = null;
    let error = null;
    try {
      rollout = await this.fetchJson("/rollouts", { method: "POST", body: request });
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      error = { code: e.code, message: e.detail, status: e.status };
      if (isAuthError(e)) this.emit("iop-auth-required", { code: e.code, message: e.detail });
    } finally {
      button.disabled = false;
      busy.textContent = "";
    }
    const outcome = this.root.querySelector("[data-outcome]");
    if (error) {
      outcome.innerHTML = `<div class="outcome" data-state="${esc(error.code)}"><div class="error" data-error-code="${esc(error.code)}">${esc(error.code)}: ${esc(error.message)}</div></div>`;
      return;
    }
    outcome.innerHTML = `<div class="outcome" data-rollout-started="${esc(rollout.rollout_id)}"><dl aria-label="Rollout">
      <dt>Rollout</dt><dd class="mono">${esc(rollout.rollout_id)}</dd>
      <dt>State</dt><dd>${badge(rollout.state)}</dd>
      <dt>Edges</dt><dd>${esc(rollout.targets ?? "")} matched <span class="mono">${esc(rollout.selector || "(every edge)")}</span></dd></dl>
      <div class="small muted">Follow it in the Rollouts panel.</div></div>`;
    this.emit("iop-rollout-created", { rollout });
  }

  showOutcome(operation, error) {
    const parts = [];
    if (operation) parts.push(operationHtml(operation));
    if (error) parts.push(`<div class="error" data-error-code="${esc(error.code)}">${esc(error.code)}: ${esc(error.message)}</div>`);
    this.root.querySelector("[data-outcome]").innerHTML = `<div class="outcome" data-state="${esc(operation?.state || error?.code || "")}"${
      operation?.replayed === true ? " data-replayed" : ""
    }>${parts.join("")}</div>`;
  }
}

/** What the rollout fields start with (the issue's example: batches of 50, 50 in flight, abort above 10% failed once 20 ran). */
export const ROLLOUT_DEFAULTS = { batch_size: 50, max_in_flight: 50, pause_seconds: 0, failure_percent: 10, min_executed: 20 };

/** The POST /rollouts body of the form's rollout fields around one command body. */
export function rolloutRequest(form, command) {
  const number = (id) => {
    const raw = form.querySelector(id).value.trim();
    return raw === "" ? null : Number(raw);
  };
  const strategy = {};
  const abort = {};
  for (const [key, id] of [["batch_size", "#ro-batch"], ["max_in_flight", "#ro-in-flight"], ["pause_seconds", "#ro-pause"]]) {
    const value = number(id);
    if (value !== null) strategy[key] = value;
  }
  for (const [key, id] of [["failure_percent", "#ro-abort-percent"], ["min_executed", "#ro-min-executed"]]) {
    const value = number(id);
    if (value !== null) abort[key] = value;
  }
  return {
    command,
    selector: form.querySelector("#ro-selector").value.trim(),
    strategy,
    abort,
    disconnected: form.querySelector("#ro-disconnected").value === "skip" ? "skip" : "wait",
  };
}

/** `<dt>key</dt><dd>value</dd>` pairs of a result map (values are strings on the wire; anything else is shown as JSON). */
function resultPairs(result) {
  if (!result || typeof result !== "object") return "";
  return Object.entries(result)
    .map(([k, v]) => `<dt>${esc(k)}</dt><dd class="mono">${esc(typeof v === "string" ? v : JSON.stringify(v))}</dd>`)
    .join("");
}

/** An operation as definition lists: what ran, its state and reason, its result, and a late outcome. */
export function operationHtml(op) {
  const pairs = [
    ["Command", `<b>${esc(op.name)}</b>`],
    ["Target", op.target ? esc(op.target) : ""],
    ["State", badge(op.state)],
    ["Reason", esc(op.reason || "")],
    ["Operation", `<span class="mono">${esc(op.operation_id)}</span>`],
    ["Idempotency key", op.idempotency_key ? `<span class="mono">${esc(op.idempotency_key)}</span>` : ""],
    ["Finished", op.finished_at ? formatTime(op.finished_at) : ""],
  ]
    .filter(([, value]) => value)
    .map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`)
    .join("");
  const result = resultPairs(op.result);
  const late = op.late_outcome && typeof op.late_outcome === "object" ? op.late_outcome : null;
  const latePairs = late
    ? [
        ["State", late.state ? badge(late.state) : ""],
        ["Reason", esc(late.reason || "")],
        ["Received", late.received_at ? formatTime(late.received_at) : ""],
      ]
        .filter(([, value]) => value)
        .map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`)
        .join("") + resultPairs(late.result)
    : "";
  return `<dl aria-label="Operation">${pairs}</dl>
    ${result ? `<h4>Result</h4><dl aria-label="Result" data-result>${result}</dl>` : ""}
    ${late ? `<h4>Late answer (arrived after the operation ended)</h4><dl aria-label="Late answer" data-late-outcome>${latePairs}</dl>` : ""}
    ${op.replayed === true ? `<div class="note" data-replayed-note>Replayed: this is the earlier operation with the same idempotency key; the command was not sent again.</div>` : ""}`;
}

customElements.define("iop-command-form", IopCommandForm);
