// What the fleet list does with the rows of GET /fleet/status, without
// touching the DOM: the filters' query string, the client-side fallback
// filter, how much trouble a row is in, and the two sort orders.

/** Row states the state filter offers ("connected" / "disconnected" are about the connection). */
export const STATE_CHOICES = [
  ["", "any state"],
  ["connected", "connected"],
  ["disconnected", "disconnected"],
  ["ok", "fresh (ok)"],
  ["timeout", "timed out"],
  ["error", "error"],
];

/** Query string of one page of the filtered fleet view (the agreed parameters, empty ones left out). */
export function fleetQuery({ q = "", selector = "", state = "" }, cursor = "", limit = 1000) {
  const params = new URLSearchParams();
  params.set("limit", String(limit));
  if (cursor) params.set("cursor", cursor);
  if (selector) params.set("selector", selector);
  if (state) params.set("state", state);
  if (q) params.set("q", q);
  return params.toString();
}

/** Does a row pass the `q` and `state` filters? (The server filters too; this is the same test, so it is harmless on a filtered answer.) */
export function rowMatches(row, { q = "", state = "" }) {
  if (q && !String(row.edge_id).toLowerCase().includes(q.toLowerCase())) return false;
  if (!state) return true;
  return state.split(",").some((wanted) => {
    if (wanted === "connected") return row.connected === true;
    if (wanted === "disconnected") return row.connected !== true;
    return row.state === wanted;
  });
}

function count(map, ...names) {
  if (!map || typeof map !== "object") return 0;
  return names.reduce((sum, name) => sum + (Number(map[name]) || 0), 0);
}

/**
 * How much trouble a row is in, most first: 0 disconnected, 1 a row error
 * (the edge did not answer: timeout / error), 2 providers not healthy or
 * nodes missing, 3 saturated or cooling down, 4 stale, 5 fine.
 * Provider health and saturation are read from the row's
 * `providers_by_health`, `providers_saturated` and `providers_cooling_down`
 * members when the server sends them; without them, a row whose general
 * class is full or queues counts as saturated.
 */
export function troubleRank(row) {
  if (row.connected !== true || row.state === "disconnected") return 0;
  if (row.error || (row.state && row.state !== "ok")) return 1;
  const health = row.providers_by_health;
  if (count(health, "unhealthy", "degraded", "offline") > 0) return 2;
  if ((row.nodes_connected ?? 0) < (row.nodes_configured ?? 0)) return 2;
  if ((Number(row.providers_saturated) || 0) + (Number(row.providers_cooling_down) || 0) > 0) return 3;
  const general = row.general || {};
  if ((general.queued ?? 0) > 0 || (general.capacity > 0 && general.in_flight >= general.capacity)) return 3;
  if (row.stale) return 4;
  return 5;
}

/** Words for a trouble rank (the row's tooltip and its data-trouble attribute). */
export const TROUBLE_WORDS = ["disconnected", "row error", "providers or nodes not healthy", "saturated", "stale", ""];

function byId(a, b) {
  return a.edge_id < b.edge_id ? -1 : a.edge_id > b.edge_id ? 1 : 0;
}

/** The rows in display order: "trouble" (most trouble first, then by id) or "id". A new array. */
export function sortRows(rows, order = "trouble") {
  if (order === "id") return [...rows].sort(byId);
  // Rank once per row, not once per comparison (10,000 rows: ~130,000 comparisons).
  const ranked = rows.map((row) => [troubleRank(row), row]);
  ranked.sort((a, b) => a[0] - b[0] || byId(a[1], b[1]));
  return ranked.map((pair) => pair[1]);
}

/** The visible window of a fixed-height list: [first, last) indexes, with `overscan` rows either side. */
export function windowOf(scrollTop, viewportHeight, rowHeight, total, overscan = 8) {
  const first = Math.max(0, Math.floor(scrollTop / rowHeight) - overscan);
  const last = Math.min(total, Math.ceil((scrollTop + viewportHeight) / rowHeight) + overscan);
  return [first, Math.max(first, last)];
}
