// <iop-edge-detail edge-id="...">: one edge's nodes and providers (status,
// health, general and long-context counters, and beside them what each
// provider's engine says: requests running / waiting, KV cache use,
// tokens per second, and "saturated" / "cooling down" badges; then its
// latency over the Edge's last minute: TTFT and TPOT p95, and each model's
// in the summary line) from
// GET /edges/{id} and GET /edges/{id}/status. A provider whose engine its
// Node launches shows that engine's state (starting, loading, ready,
// draining, stopping, crashed, stopped, failed) with its reason, restarts
// and next try, and a "last lines" button that runs provider.logs through
// POST /edges/{id}/commands and shows the engine's output below the table. When the status view fails (409 not connected,
// 503 edge went away, 504 edge timeout, 502 edge error) it says why and
// shows the last known snapshot (from the error body, else the last one this
// element received), marked stale. Live: re-fetched on node.*, edge.*,
// provider.* and operation.* events of that edge (coalesced), and polled
// every `refresh-interval` s.
//
// Attributes: edge-id (required), api-base, wire-url, refresh-interval.
// Events: iop-edge-loaded {edge, status, stale, error};
//         iop-logs-shown {target, lines, error};
//         iop-auth-required {code, message}.

import { ApiError, edgePath, isAuthError } from "../api.js";
import { IopElement, ago, badge, counters, esc, formatTime, fractionBar, latencyText, rate } from "../base.js";

const CSS = `
.meta { display: flex; gap: 14px; flex-wrap: wrap; font-size: 12.5px; color: var(--_muted); margin-bottom: 6px; }
.meta b { color: var(--_fg); font-weight: 600; }
.stale { background: var(--_warn-bg); color: var(--_warn); border-radius: 8px; padding: 6px 10px; margin: 6px 0; }
tr.node td { background: color-mix(in srgb, var(--_border) 30%, transparent); font-weight: 600; }
tr.node td .muted { font-weight: 400; }
.group { text-align: center; border-bottom: none; padding-bottom: 0; white-space: normal; }
table[data-stale="true"] tbody { opacity: .72; }
.reason { overflow-wrap: anywhere; }
td:first-child { min-width: 9em; overflow-wrap: anywhere; }
td .bar { width: 32px; }
button.link { background: none; border: none; padding: 0; color: var(--_accent); font-weight: 500; font-size: 12px; text-decoration: underline; }
.logs { margin-top: 10px; border: 1px solid var(--_border); border-radius: 8px; padding: 8px 10px; background: var(--_bg); }
.logs[hidden] { display: none; }
.logs h3 { margin: 0 0 6px; font-size: 13px; display: flex; gap: 10px; align-items: center; }
.logs .spacer { flex: 1; }
.logs pre { margin: 0; max-height: 24em; overflow: auto; white-space: pre-wrap; overflow-wrap: anywhere; font-size: 12px; }
`;

/** Columns of the provider table (a node row spans them). */
const COLUMNS = 11;
/** How much of an engine's last output the "last lines" button asks for (bytes). */
const LOG_BYTES = 16000;

/** The launched engine's cell: its state, restarts, next try and reason, and its "last lines" button. */
function launchCell(nodeId, p) {
  const l = p.launch;
  if (!l) return `<td data-launch="none"><span class="muted" title="someone else runs this engine">—</span></td>`;
  const facts = [];
  if (l.restarts) facts.push(`${l.restarts} restart${l.restarts === 1 ? "" : "s"}`);
  if (l.next_try_at) facts.push(`next try ${formatTime(l.next_try_at)}`);
  const target = `${nodeId}/${p.provider_id}`;
  return `<td data-launch="${esc(l.state)}" data-restarts="${Number(l.restarts) || 0}">${badge(l.state)}${
    facts.length ? ` <span class="small muted" data-launch-facts>${esc(facts.join(", "))}</span>` : ""
  }${l.reason ? `<div class="small muted reason" data-launch-reason>${esc(l.reason)}</div>` : ""}
    <div><button type="button" class="link" data-logs="${esc(target)}" title="provider.logs: the engine's last lines">last lines</button></div></td>`;
}

/** The text of a provider.logs operation's result: its log.000, log.001 ... entries in order. */
export function logText(result) {
  const count = Number(result?.log_chunks) || 0;
  let text = "";
  for (let i = 0; i < count; i += 1) text += result[`log.${String(i).padStart(3, "0")}`] ?? "";
  return text;
}

/** The engine's cells of one provider: running / waiting, KV cache, tokens/s ("—" where it says nothing). */
function engineCells(p) {
  const e = p.engine;
  const load = e
    ? `<span data-engine-load>${e.running}/${e.waiting}</span>`
    : `<span class="muted" data-engine-load title="no reading of the engine's load">—</span>`;
  const age = e ? ` title="read ${esc(Number(e.age_seconds).toFixed(1))} s before the snapshot"` : "";
  const kv = e && e.kv_cache_usage != null ? fractionBar(e.kv_cache_usage) : `<span class="muted">—</span>`;
  return `<td class="num"${age}>${load}</td><td class="num" data-kv-cache>${kv}</td>
    <td class="num" data-tokens-per-second>${p.tokens_per_second == null ? "—" : esc(rate(p.tokens_per_second))}</td>`;
}

/** The latency cells of one provider: TTFT and TPOT p95 over the Edge's last minute ("—" without requests). */
function latencyCells(p) {
  const l = p.latency || {};
  const tip = (what, p50) =>
    l.requests ? ` title="${esc(`p50 ${latencyText(p50)}; ${l.requests} requests, ${l.errors} errors in ${l.window_seconds} s`)}"` : "";
  return `<td class="num" data-ttft-p95${tip("ttft", l.ttft_p50_seconds)}>${esc(latencyText(l.ttft_p95_seconds))}</td>
    <td class="num" data-tpot-p95${tip("tpot", l.tpot_p50_seconds)}>${esc(latencyText(l.tpot_p95_seconds))}</td>`;
}

/** Each model's TTFT and TPOT p95 (its providers merged), for the summary line; "" without requests. */
function latencySummary(models) {
  return Object.entries(models || {})
    .filter(([, m]) => m?.latency?.requests)
    .map(
      ([name, m]) => `<span data-model-latency="${esc(name)}">${esc(name)} TTFT p95 <b>${esc(latencyText(m.latency.ttft_p95_seconds))}</b>,
        TPOT p95 <b>${esc(latencyText(m.latency.tpot_p95_seconds))}</b>, <b>${esc(Number(m.latency.requests_per_second).toFixed(1))}</b> req/s</span>`,
    )
    .join("");
}

/** What the providers' engines say in all: running / waiting (of those with a reading) and tokens/s. */
function engineSummary(nodes) {
  const providers = nodes.flatMap((n) => n.providers || []);
  const read = providers.filter((p) => p.engine);
  if (!read.length && !providers.some((p) => p.tokens_per_second)) return "";
  const sum = (values) => values.reduce((a, b) => a + (Number(b) || 0), 0);
  return `<span data-engine-summary>engines <b>${sum(read.map((p) => p.engine.running))}/${sum(read.map((p) => p.engine.waiting))}</b> running / waiting
    (${read.length} of ${providers.length} report), <b>${esc(rate(sum(providers.map((p) => p.tokens_per_second))))}</b> tokens/s</span>`;
}

/** "saturated" and "cooling down" badges of a provider (none when neither). */
function flagBadges(p) {
  return (p.saturated ? " " + badge("saturated") : "") + (p.cooling_down ? " " + badge("cooling_down", "cooling down") : "");
}

/** Status-view errors after which the last known snapshot is shown, marked stale. */
const STATUS_FAILURES = new Set(["edge_not_connected", "edge_timeout", "edge_disconnected", "edge_error"]);

/** What a failed status view means, in words. */
const REASONS = {
  edge_timeout: "The edge did not answer in time",
  edge_disconnected: "The edge went away during the request",
  edge_error: "The edge answered with an error",
};

export class IopEdgeDetail extends IopElement {
  static observedAttributes = ["edge-id", "api-base", "wire-url", "refresh-interval"];

  constructor() {
    super(CSS);
    this.root.innerHTML = `
      <section class="panel" aria-labelledby="edge-title">
        <div class="head"><h2 id="edge-title">Edge</h2><span data-badge></span><span class="spacer"></span>
          <span class="small muted" data-updated aria-live="polite"></span></div>
        <div class="error" data-error hidden role="alert"></div>
        <div data-body><p class="empty">Select an edge.</p></div>
        <div class="logs" data-logs-panel hidden aria-live="polite">
          <h3><span data-logs-title></span><span class="spacer"></span>
            <button type="button" class="link" data-logs-close>close</button></h3>
          <pre data-log-text></pre>
        </div>
      </section>`;
    this.root.addEventListener("click", (event) => {
      const button = event.target.closest?.("button[data-logs]");
      if (button) this.showLogs(button.dataset.logs);
      else if (event.target.closest?.("button[data-logs-close]")) this.root.querySelector("[data-logs-panel]").hidden = true;
    });
  }

  /** Run provider.logs for `target` (node/provider) and show the engine's last lines. */
  async showLogs(target) {
    const panel = this.root.querySelector("[data-logs-panel]");
    const title = panel.querySelector("[data-logs-title]");
    const pre = panel.querySelector("[data-log-text]");
    panel.hidden = false;
    panel.dataset.target = target;
    title.textContent = `Last lines of ${target}`;
    pre.textContent = "asking its node…";
    let error = null;
    let text = "";
    try {
      const operation = await this.fetchJson(edgePath(this.edgeId, "commands"), {
        method: "POST",
        body: { name: "provider.logs", target, arguments: { bytes: String(LOG_BYTES) } },
      });
      text = logText(operation.result);
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      error = { code: e.code, message: e.body?.operation?.reason || e.detail, status: e.status };
      if (isAuthError(e)) this.emit("iop-auth-required", { code: e.code, message: e.detail });
    }
    if (panel.dataset.target !== target) return;
    pre.textContent = error ? `${error.code}: ${error.message}` : text || "(no output yet)";
    panel.dataset.state = error ? "error" : "shown";
    this.emit("iop-logs-shown", { target, lines: text ? text.split("\n").length - 1 : 0, error });
  }

  start() {
    this.lastGood = null; // the last fresh snapshot of this edge, shown stale when a later fetch fails
    super.start();
  }

  async load() {
    const edgeId = this.edgeId;
    if (!edgeId) return;
    const [edge, view] = await Promise.all([
      this.fetchJson(edgePath(edgeId)),
      this.fetchJson(edgePath(edgeId, "status")).then(
        (snapshot) => ({ snapshot, error: null }),
        (error) => {
          const failed = error instanceof ApiError && (STATUS_FAILURES.has(error.code) || error.status >= 500);
          if (!failed) throw error;
          return { snapshot: error.body?.snapshot || null, error };
        },
      ),
    ]);
    if (edgeId !== this.edgeId) return;
    let { snapshot } = view;
    const { error } = view;
    let stale = Boolean(error) || Boolean(snapshot?.stale);
    if (!error) this.lastGood = snapshot;
    else if (!snapshot && this.lastGood) snapshot = this.lastGood;
    if (snapshot && snapshot.edge_id && snapshot.edge_id !== edgeId) snapshot = null;
    if (!snapshot) stale = false;
    this.clearError();
    this.render(edge, snapshot, stale, error);
    const failure = error ? { code: error.code, message: error.detail, status: error.status } : null;
    this.emit("iop-edge-loaded", { edge, status: snapshot, stale, error: failure });
  }

  render(edge, snapshot, stale, error) {
    this.root.querySelector("#edge-title").textContent = `Edge ${edge.edge_id}`;
    this.root.querySelector("[data-badge]").innerHTML = badge(edge.connected ? "connected" : "disconnected");
    this.root.querySelector("[data-updated]").textContent = `updated ${formatTime(new Date().toISOString())}`;
    const labels = Object.entries(edge.labels || {}).map(([k, v]) => `${esc(k)}=${esc(v)}`).join(", ");
    const nodes = snapshot?.nodes || [];
    const totals = snapshot?.totals;
    const received = snapshot?.received_at ? `received ${formatTime(snapshot.received_at)}` : "";
    const shown = snapshot
      ? `Showing the last known snapshot${received ? `, ${received}` : ""} (stale).`
      : "No snapshot of this edge is available.";
    let notice = "";
    if (error && error.code === "edge_not_connected") {
      notice = `Not connected${edge.disconnected_at ? ` since ${formatTime(edge.disconnected_at)}` : ""}. ${shown}`;
    } else if (error) {
      notice = `${esc(REASONS[error.code] || "The status request failed")}: ${esc(error.detail || error.code)}. ${shown}`;
    } else if (stale) {
      notice = `This snapshot is stale${received ? ` (${received})` : ""}.`;
    }
    notice = notice
      ? `<div class="stale" role="status" data-notice="${esc(error?.code || "stale")}">${notice}</div>`
      : "";
    const rows = nodes
      .map((node) => {
        const providers = (node.providers || [])
          .map(
            (p) => `<tr data-provider="${esc(p.provider_id)}" data-status="${esc(p.status)}" data-health="${esc(p.health)}"
                data-saturated="${Boolean(p.saturated)}" data-cooling-down="${Boolean(p.cooling_down)}">
              <td>${esc(p.provider_id)} <span class="muted small">${esc(p.kind)}</span>
                <div class="small muted" data-models>${esc((p.models || []).join(", ")) || "no models"}</div></td>
              <td>${badge(p.status)}${flagBadges(p)}</td>
              <td title="${esc(p.health_reason || "")}">${badge(p.health)}${p.health_reason ? ` <span class="small muted reason">${esc(p.health_reason)}</span>` : ""}</td>
              ${launchCell(node.node_id, p)}
              <td class="num" data-general>${counters(p.general)}<div class="small muted" data-queued>${p.general?.queued ?? 0} queued</div></td>
              <td class="num" data-long-context>${counters(p.long_context)}<div class="small muted" data-queued>${p.long_context?.queued ?? 0} queued</div></td>
              ${engineCells(p)}
              ${latencyCells(p)}
            </tr>`,
          )
          .join("");
        const since = node.connected ? `connected ${ago(node.connected_since)}` : `last seen ${formatTime(node.last_seen)}`;
        return `<tr class="node" data-node="${esc(node.node_id)}" data-connected="${node.connected}">
            <td colspan="2">${esc(node.node_id)} <span class="muted small">${esc(since)}</span></td>
            <td colspan="${COLUMNS - 2}">${badge(node.connected ? "connected" : "disconnected")}${node.drained ? " " + badge("drained") : ""}</td>
          </tr>${providers || `<tr><td colspan="${COLUMNS}" class="empty">no providers</td></tr>`}`;
      })
      .join("");
    const summary = totals
      ? `<span>nodes <b>${totals.nodes_connected}/${totals.nodes_configured}</b> connected</span>
         <span>providers <b>${totals.providers}</b></span>
         <span>general <b>${totals.general?.in_flight ?? 0}/${totals.general?.capacity ?? 0}</b> in flight, <b>${totals.general?.queued ?? 0}</b> queued</span>
         <span>long-context <b>${totals.long_context?.in_flight ?? 0}/${totals.long_context?.capacity ?? 0}</b> in flight, <b>${totals.long_context?.queued ?? 0}</b> queued</span>
         ${engineSummary(nodes)}
         ${latencySummary(snapshot?.models)}`
      : "";
    this.root.querySelector("[data-body]").innerHTML = `
      <div class="meta">
        <span>version <b>${esc(edge.software_version || "—")}</b></span>
        <span>protocol <b>${esc(edge.protocol_version || "—")}</b></span>
        <span>${edge.connected ? `connected <b>${esc(ago(edge.connected_at))}</b>` : `last seen <b>${esc(formatTime(edge.last_seen))}</b>`}</span>
        ${labels ? `<span>labels <b>${labels}</b></span>` : ""}
      </div>
      <div class="meta">${summary}</div>
      ${notice}
      <div class="scroll">
      <table aria-label="Nodes and providers of ${esc(edge.edge_id)}" data-stale="${stale}">
        <thead>
          <tr><th rowspan="2">Node / provider · models</th><th rowspan="2">Status</th><th rowspan="2">Health</th>
              <th rowspan="2" title="the engine's lifecycle when its node launches it">Launch</th>
              <th class="group">General</th><th class="group">Long context</th><th colspan="3" class="group">Engine</th>
              <th colspan="2" class="group" title="over the Edge's last minute, within 2 % (docs/latency.md)">Latency</th></tr>
          <tr><th class="num" title="leases in flight / capacity, and requests queued">in flight</th>
              <th class="num" title="leases in flight / capacity, and requests queued">in flight</th>
              <th class="num" title="requests the engine is running / waiting inside it">run / wait</th><th class="num">KV cache</th><th class="num">tokens/s</th>
              <th class="num" title="time to first token, 95th percentile">TTFT p95</th><th class="num" title="time per output token after the first, 95th percentile">TPOT p95</th></tr>
        </thead>
        <tbody>${rows || `<tr><td colspan="${COLUMNS}" class="empty">${snapshot ? "No nodes are configured." : "No snapshot to show."}</td></tr>`}</tbody>
      </table></div>`;
  }
}

customElements.define("iop-edge-detail", IopEdgeDetail);
