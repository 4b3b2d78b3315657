// Live events over the Control Plane's WebSocket /client wire.
//
// One WebSocket per (wire URL, edge id) on a page, shared by every
// component that subscribes to it: hello, subscribe, then events. When the
// socket drops it reconnects with bounded exponential backoff and resumes
// after the last sequence it saw (edge sequences for one edge, fleet
// sequences for the fleet), so no event is shown twice; events the server
// could no longer deliver arrive as an `events_lost` notice.

import { apiToken, onApiTokenChange } from "./api.js";
import { decodeClientEnvelope, encodeClientEnvelope, ERROR_CODES } from "./proto.js";

export const PROTOCOL_MAJOR = 1;
export const PROTOCOL_MINOR = 0;
const CLIENT_NAME = "iop-console/0.1";
const BACKOFF_INITIAL_MS = 500;
const BACKOFF_MAX_MS = 10000;
const REQUEST_TIMEOUT_MS = 10000;

const connections = new Map();

/**
 * One shared subscription. States: "connecting", "live", "reconnecting",
 * "rejected" (hello refused: token), "failed" (subscription refused), "closed".
 */
class LiveConnection {
  constructor(url, edgeId) {
    this.url = url;
    this.edgeId = edgeId || "";
    this.listeners = new Set();
    this.state = "connecting";
    this.detail = "";
    this.lastSequence = null;
    this.attempts = 0;
    this.socket = null;
    this.retryTimer = null;
    this.requestTimer = null;
    this.closed = false;
    this.reconnects = 0;
    this.subscribedOnce = false;
    this.unwatchToken = onApiTokenChange(() => this.restart());
    this.connect();
  }

  add(listener) {
    this.listeners.add(listener);
    listener.state?.(this.state, this.detail);
  }

  remove(listener) {
    this.listeners.delete(listener);
    if (this.listeners.size === 0) this.close();
  }

  emit(kind, ...args) {
    for (const listener of [...this.listeners]) {
      try {
        listener[kind]?.(...args);
      } catch (e) {
        console.error("iop-console: a live-event listener failed", e);
      }
    }
  }

  setState(state, detail = "") {
    this.state = state;
    this.detail = detail;
    this.emit("state", state, detail);
  }

  send(requestId, body, fields) {
    this.socket.send(encodeClientEnvelope(requestId, body, fields));
  }

  connect() {
    if (this.closed) return;
    let socket;
    try {
      socket = new WebSocket(this.url);
    } catch (e) {
      this.setState("failed", `bad wire URL ${this.url}`);
      return;
    }
    socket.binaryType = "arraybuffer";
    this.socket = socket;
    socket.onopen = () => {
      this.send(1, "client_hello_request", {
        clientName: CLIENT_NAME,
        protocolMajor: PROTOCOL_MAJOR,
        protocolMinor: PROTOCOL_MINOR,
        apiToken: apiToken(),
      });
      this.armRequestTimer();
    };
    socket.onmessage = (message) => this.received(message.data);
    socket.onclose = () => this.lost(socket);
    socket.onerror = () => {};
  }

  armRequestTimer() {
    clearTimeout(this.requestTimer);
    this.requestTimer = setTimeout(() => this.socket?.close(), REQUEST_TIMEOUT_MS);
  }

  received(data) {
    if (!(data instanceof ArrayBuffer)) return;
    let envelope;
    try {
      envelope = decodeClientEnvelope(new Uint8Array(data));
    } catch (e) {
      console.warn("iop-console: ignoring a message that does not decode", e);
      return;
    }
    const { body, message, request_id: requestId } = envelope;
    if (body === "client_hello_response" && requestId === 1) {
      clearTimeout(this.requestTimer);
      if (!message.accepted) {
        this.setState("rejected", message.reason || "hello refused");
        this.stopSocket();
        return;
      }
      const resume = this.lastSequence !== null;
      this.send(2, "subscribe_request", { edgeId: this.edgeId, resume, sinceSequence: this.lastSequence || 0 });
      this.armRequestTimer();
    } else if (body === "subscribe_response" && requestId === 2) {
      clearTimeout(this.requestTimer);
      if (this.lastSequence === null) this.lastSequence = message.last_sequence;
      if (this.subscribedOnce) this.reconnects += 1;
      this.subscribedOnce = true;
      this.attempts = 0;
      this.setState("live", "");
      this.emit("subscribed", message);
    } else if (body === "event") {
      const sequence = this.edgeId ? message.sequence : message.fleet_sequence;
      if (this.lastSequence !== null && sequence <= this.lastSequence) return;
      this.lastSequence = sequence;
      this.emit("event", toEventJson(message));
    } else if (body === "events_lost") {
      if (message.reason === "sequence_reset") {
        // The Control Plane numbers from scratch: what it replays next is new here.
        this.lastSequence = 0;
      } else if (this.lastSequence === null || message.last_sequence > this.lastSequence) {
        this.lastSequence = message.last_sequence;
      }
      this.emit("lost", message);
    } else if (body === "error") {
      const code = ERROR_CODES[message.code] || `error_${message.code}`;
      if (requestId === 2) {
        clearTimeout(this.requestTimer);
        this.setState("failed", `${code}: ${message.message}`);
        this.stopSocket();
      } else {
        console.warn(`iop-console: wire error ${code}: ${message.message}`);
      }
    }
  }

  stopSocket() {
    const socket = this.socket;
    this.socket = null;
    if (socket) {
      socket.onclose = null;
      socket.close();
    }
  }

  lost(socket) {
    if (socket !== this.socket) return;
    this.socket = null;
    clearTimeout(this.requestTimer);
    if (this.closed) return;
    const delay = Math.min(BACKOFF_MAX_MS, BACKOFF_INITIAL_MS * 2 ** this.attempts) * (0.8 + 0.4 * Math.random());
    this.attempts += 1;
    this.setState("reconnecting", `retrying in ${(delay / 1000).toFixed(1)} s`);
    this.retryTimer = setTimeout(() => this.connect(), delay);
  }

  /** Reconnect now (the token changed, or the user asked). */
  restart() {
    if (this.closed) return;
    clearTimeout(this.retryTimer);
    this.stopSocket();
    this.attempts = 0;
    this.setState("connecting", "");
    this.connect();
  }

  close() {
    this.closed = true;
    clearTimeout(this.retryTimer);
    clearTimeout(this.requestTimer);
    this.unwatchToken();
    if (this.socket && this.socket.readyState === WebSocket.OPEN) {
      try {
        this.send(0, "unsubscribe_request");
      } catch {
        /* closing anyway */
      }
    }
    this.stopSocket();
    connections.delete(`${this.url} ${this.edgeId}`);
    this.setState("closed", "");
  }
}

function isoFromMs(ms) {
  return ms ? new Date(ms).toISOString() : null;
}

/** A wire FleetEvent in the same JSON shape as the HTTP event views. */
export function toEventJson(event) {
  return {
    sequence: event.sequence,
    fleet_sequence: event.fleet_sequence,
    edge_id: event.edge_id,
    kind: event.kind,
    occurred_at: isoFromMs(event.occurred_at_ms),
    recorded_at: isoFromMs(event.recorded_at_ms),
    node_id: event.node_id || null,
    provider_id: event.provider_id || null,
    command_id: event.command_id || null,
    message: event.message,
    attributes: event.attributes,
  };
}

/**
 * Subscribe to live events of `edgeId` ("" = the whole fleet) at `url`.
 * `listener` may have event(json), lost(eventsLost), state(state, detail)
 * and subscribed(response) methods. Returns a function that unsubscribes.
 */
export function subscribeLive(url, edgeId, listener) {
  const key = `${url} ${edgeId || ""}`;
  let connection = connections.get(key);
  if (!connection) {
    connection = new LiveConnection(url, edgeId);
    connections.set(key, connection);
  }
  connection.add(listener);
  return () => connection.remove(listener);
}

/** The shared connections (for diagnostics and tests). */
export function liveConnections() {
  return [...connections.values()].map((c) => ({
    url: c.url,
    edgeId: c.edgeId,
    state: c.state,
    lastSequence: c.lastSequence,
    reconnects: c.reconnects,
    listeners: c.listeners.size,
  }));
}
