// HTTP access to the Control Plane's JSON views (docs/http-api.md), shared
// by every console component on a page: one API token store, one cached
// console config per API base.

const TOKEN_KEY = "iop-console.api-token";
const listeners = new Set();
const configs = new Map();

/** An error answer of the Control Plane: {"error": {code, message, status}}. */
export class ApiError extends Error {
  constructor(code, message, status, body = null) {
    super(`${code}: ${message}`);
    this.code = code;
    this.status = status;
    this.body = body;
    this.detail = message;
  }
}

function storage() {
  try {
    return window.sessionStorage;
  } catch {
    return null;
  }
}

/** The API token in use ("" when none). */
export function apiToken() {
  return storage()?.getItem(TOKEN_KEY) || "";
}

/** Set (or clear with "") the API token for this tab; components are told. */
export function setApiToken(token) {
  const store = storage();
  if (store) {
    if (token) store.setItem(TOKEN_KEY, token);
    else store.removeItem(TOKEN_KEY);
  }
  for (const listener of listeners) listener(token);
}

/** Call `listener(token)` whenever the token changes; returns an unsubscribe function. */
export function onApiTokenChange(listener) {
  listeners.add(listener);
  return () => listeners.delete(listener);
}

function join(base, path) {
  return `${(base || "").replace(/\/+$/, "")}${path}`;
}

/** Path of one edge's view, with the edge id safely encoded. */
export function edgePath(edgeId, ...rest) {
  return ["", "edges", edgeId, ...rest].map((p, i) => (i === 0 ? "" : encodeURIComponent(p))).join("/");
}

/**
 * Fetch a JSON view. Resolves with the decoded body of a 2xx answer;
 * rejects with ApiError (code "unreachable" when the server cannot be reached).
 */
export async function requestJson(base, path, { method = "GET", body = undefined, signal = undefined } = {}) {
  const headers = { Accept: "application/json" };
  const token = apiToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(join(base, path), {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
      cache: "no-store",
    });
  } catch (e) {
    if (e && e.name === "AbortError") throw e;
    throw new ApiError("unreachable", "cannot reach the Control Plane", 0);
  }
  let document = null;
  try {
    document = await response.json();
  } catch {
    document = null;
  }
  if (!response.ok) {
    const error = document && document.error;
    if (error && typeof error.code === "string") {
      throw new ApiError(error.code, error.message || "", error.status || response.status, document);
    }
    throw new ApiError(`http_${response.status}`, response.statusText || "error", response.status, document);
  }
  if (document === null) throw new ApiError("invalid_response", "the answer is not JSON", response.status);
  return document;
}

/** GET /console/config.json once per API base: {wire_url, api_token_required}. */
export function consoleConfig(base = "") {
  if (!configs.has(base)) {
    const loading = requestJson(base, "/console/config.json").catch((e) => {
      configs.delete(base);
      throw e;
    });
    configs.set(base, loading);
  }
  return configs.get(base);
}

/** Is this error about authentication (missing or wrong token)? */
export function isAuthError(error) {
  return error instanceof ApiError && (error.code === "unauthorized" || error.code === "forbidden");
}
