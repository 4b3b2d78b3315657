// Entry point for pages hosting the console components: importing this
// module defines every <iop-*> element and exposes the shared helpers.
//
//   <script type="module" src="/console/js/iop-console.js"></script>
//   <iop-fleet-overview></iop-fleet-overview>
//   <iop-edge-detail edge-id="edge-a"></iop-edge-detail>
//
// See docs/console.md for each element's attributes and events.

export { apiToken, setApiToken, onApiTokenChange, consoleConfig, requestJson, ApiError } from "./api.js";
export { subscribeLive, liveConnections } from "./wire.js";
export { IopFleetOverview } from "./components/fleet-overview.js";
export { IopEdgeDetail } from "./components/edge-detail.js";
export { IopEventStream } from "./components/event-stream.js";
export { IopOperations } from "./components/operations.js";
export { IopCommandForm } from "./components/command-form.js";
export { IopRollouts } from "./components/rollouts.js";
export { IopDeployments } from "./components/deployments.js";
export { IopSlos } from "./components/slos.js";
export { IopHistoryChart } from "./components/history-chart.js";
