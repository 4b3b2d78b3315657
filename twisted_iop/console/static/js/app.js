// The console page: composes the components. The fleet list is on the
// left; choosing an edge shows its detail, events, operations and command
// form, and remembers the choice in the URL (#edge=ID).

import { apiToken, consoleConfig, setApiToken, subscribeLive } from "./iop-console.js";

const $ = (selector) => document.querySelector(selector);
const panels = ["iop-edge-detail", "#edge-area iop-history-chart", "iop-event-stream", "iop-operations", "iop-command-form"].map((t) => $(t));
const fleet = $("iop-fleet-overview");

function selectedFromHash() {
  const match = /(?:^|[#&])edge=([^&]*)/.exec(window.location.hash);
  return match ? decodeURIComponent(match[1]) : "";
}

function select(edgeId) {
  if (!edgeId) return;
  fleet.setAttribute("selected", edgeId);
  for (const panel of panels) panel.setAttribute("edge-id", edgeId);
  $("#edge-area").hidden = false;
  $("#placeholder").hidden = true;
  const hash = `#edge=${encodeURIComponent(edgeId)}`;
  if (window.location.hash !== hash) history.replaceState(null, "", hash);
  document.title = `${edgeId} · IOP console`;
}

fleet.addEventListener("iop-edge-select", (e) => select(e.detail.edgeId));
fleet.addEventListener("iop-fleet-loaded", (e) => {
  // Nothing chosen yet: show the first connected edge (or the first one).
  if (fleet.getAttribute("selected")) return;
  const edges = e.detail.edges || [];
  const first = edges.find((row) => row.connected) || edges[0];
  if (first) select(first.edge_id);
});
window.addEventListener("hashchange", () => select(selectedFromHash()));

// A rollout started from the command form is the one the rollout panel shows.
const rollouts = $("iop-rollouts");
document.addEventListener("iop-rollout-created", (e) => rollouts.setAttribute("selected", e.detail.rollout.rollout_id));

// -- API token ----------------------------------------------------------------

const tokenForm = $("#token-form");
const tokenInput = $("#token");

function showTokenForm(message = "") {
  tokenForm.hidden = false;
  $("#token-hint").textContent = message;
}

tokenForm.addEventListener("submit", (e) => {
  e.preventDefault();
  setApiToken(tokenInput.value.trim());
  $("#token-hint").textContent = apiToken() ? "token set for this tab" : "token cleared";
});
document.addEventListener("iop-auth-required", (e) => showTokenForm(e.detail.code === "forbidden" ? "the API token is wrong" : "an API token is required"));
if (apiToken()) tokenInput.value = apiToken();

// -- connection indicator -----------------------------------------------------

async function boot() {
  const status = $("#wire-status");
  try {
    const config = await consoleConfig("");
    if (config.api_token_required) showTokenForm(apiToken() ? "" : "this Control Plane requires an API token");
    subscribeLive(config.wire_url, "", {
      state(state, detail) {
        status.dataset.state = state;
        status.querySelector("span:last-child").textContent = state === "live" ? "live" : state;
        status.title = `${config.wire_url}${detail ? ` — ${detail}` : ""}`;
      },
    });
  } catch (error) {
    status.dataset.state = "failed";
    status.querySelector("span:last-child").textContent = "no config";
    status.title = String(error.message || error);
  }
  select(selectedFromHash());
}

boot();
