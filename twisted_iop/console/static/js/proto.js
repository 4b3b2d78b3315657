// Hand-written protobuf encoding for the few ClientEnvelope messages the
// console needs (proto/iop/control.proto, package iop.control.v1).
//
// Wire format: every field is a key varint ((number << 3) | wire type)
// followed by a varint (type 0), 8 bytes (type 1), a length-delimited byte
// string (type 2: strings, nested messages, map entries) or 4 bytes (type 5).
// Unknown fields are skipped, as proto3 requires. 64-bit integers are read
// into JavaScript numbers (exact up to 2^53, far beyond any sequence here).

const textEncoder = new TextEncoder();
const textDecoder = new TextDecoder();

const VARINT = 0;
const FIXED64 = 1;
const LENGTH_DELIMITED = 2;
const FIXED32 = 5;

/** Thrown for bytes that are not a valid message. */
export class ProtoDecodeError extends Error {
  constructor(message) {
    super(message);
    this.name = "ProtoDecodeError";
  }
}

// ------------------------------------------------------------------ writing

class Writer {
  constructor() {
    this.bytes = [];
  }

  varint(value) {
    let n = Number(value);
    if (!Number.isFinite(n) || n < 0 || !Number.isInteger(n)) {
      throw new RangeError(`not a non-negative integer: ${value}`);
    }
    while (n >= 0x80) {
      this.bytes.push((n % 0x80) | 0x80);
      n = Math.floor(n / 0x80);
    }
    this.bytes.push(n);
    return this;
  }

  key(field, wireType) {
    return this.varint(field * 8 + wireType);
  }

  uint(field, value) {
    if (value) this.key(field, VARINT).varint(value);
    return this;
  }

  bool(field, value) {
    if (value) this.key(field, VARINT).varint(1);
    return this;
  }

  string(field, value) {
    if (value) this.lengthDelimited(field, textEncoder.encode(String(value)));
    return this;
  }

  lengthDelimited(field, bytes) {
    this.key(field, LENGTH_DELIMITED).varint(bytes.length);
    for (const b of bytes) this.bytes.push(b);
    return this;
  }

  /** A nested message, always written (an empty message still selects a oneof). */
  message(field, bytes) {
    return this.lengthDelimited(field, bytes);
  }

  finish() {
    return Uint8Array.from(this.bytes);
  }
}

export function encodeClientHelloRequest({ clientName = "", protocolMajor = 0, protocolMinor = 0, apiToken = "" } = {}) {
  return new Writer().string(1, clientName).uint(2, protocolMajor).uint(3, protocolMinor).string(4, apiToken).finish();
}

export function encodeSubscribeRequest({ edgeId = "", resume = false, sinceSequence = 0 } = {}) {
  return new Writer().string(1, edgeId).bool(2, resume).uint(3, sinceSequence).finish();
}

/** ClientEnvelope body field numbers (the oneof). */
export const BODY_FIELDS = Object.freeze({
  error: 10,
  client_hello_request: 11,
  client_hello_response: 12,
  subscribe_request: 13,
  subscribe_response: 14,
  unsubscribe_request: 15,
  event: 16,
  events_lost: 17,
});

/**
 * Encode a ClientEnvelope carrying one request body.
 * `body` is one of "client_hello_request", "subscribe_request",
 * "unsubscribe_request"; `fields` the message's fields (camelCase).
 */
export function encodeClientEnvelope(requestId, body, fields = {}) {
  let inner;
  if (body === "client_hello_request") inner = encodeClientHelloRequest(fields);
  else if (body === "subscribe_request") inner = encodeSubscribeRequest(fields);
  else if (body === "unsubscribe_request") inner = new Uint8Array(0);
  else throw new Error(`cannot encode a ${body}`);
  return new Writer().uint(1, requestId).message(BODY_FIELDS[body], inner).finish();
}

// ------------------------------------------------------------------ reading

class Reader {
  constructor(bytes) {
    this.bytes = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
    this.pos = 0;
  }

  get done() {
    return this.pos >= this.bytes.length;
  }

  varint() {
    let result = 0;
    let scale = 1;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= this.bytes.length) throw new ProtoDecodeError("truncated varint");
      const b = this.bytes[this.pos++];
      result += (b & 0x7f) * scale;
      if (b < 0x80) return result;
      scale *= 0x80;
    }
    throw new ProtoDecodeError("varint too long");
  }

  take(length) {
    if (length < 0 || this.pos + length > this.bytes.length) throw new ProtoDecodeError("truncated field");
    const out = this.bytes.subarray(this.pos, this.pos + length);
    this.pos += length;
    return out;
  }

  lengthDelimited() {
    return this.take(this.varint());
  }

  string() {
    return textDecoder.decode(this.lengthDelimited());
  }

  skip(wireType) {
    if (wireType === VARINT) this.varint();
    else if (wireType === FIXED64) this.take(8);
    else if (wireType === LENGTH_DELIMITED) this.lengthDelimited();
    else if (wireType === FIXED32) this.take(4);
    else throw new ProtoDecodeError(`unsupported wire type ${wireType}`);
  }

  /** Call `onField(number, wireType)` for each field; it returns false to skip. */
  fields(onField) {
    while (!this.done) {
      const key = this.varint();
      const field = Math.floor(key / 8);
      const wireType = key % 8;
      if (field === 0) throw new ProtoDecodeError("field number 0");
      if (!onField(field, wireType)) this.skip(wireType);
    }
  }
}

function expect(wireType, wanted) {
  if (wireType !== wanted) throw new ProtoDecodeError(`wire type ${wireType} where ${wanted} was expected`);
}

/** Decode a message whose fields are all scalars: spec maps number -> [name, kind]. */
function decodeScalars(bytes, spec, initial) {
  const out = { ...initial };
  const r = new Reader(bytes);
  r.fields((field, wireType) => {
    const entry = spec[field];
    if (!entry) return false;
    const [name, kind] = entry;
    if (kind === "string") {
      expect(wireType, LENGTH_DELIMITED);
      out[name] = r.string();
    } else if (kind === "strings") {
      expect(wireType, LENGTH_DELIMITED);
      out[name] = [...out[name], r.string()];
    } else if (kind === "bool") {
      expect(wireType, VARINT);
      out[name] = r.varint() !== 0;
    } else if (kind === "uint") {
      expect(wireType, VARINT);
      out[name] = r.varint();
    } else if (kind === "map") {
      expect(wireType, LENGTH_DELIMITED);
      const entry = decodeScalars(r.lengthDelimited(), { 1: ["key", "string"], 2: ["value", "string"] }, { key: "", value: "" });
      out[name] = { ...out[name], [entry.key]: entry.value };
    } else {
      return false;
    }
    return true;
  });
  return out;
}

export function decodeError(bytes) {
  return decodeScalars(bytes, { 1: ["code", "uint"], 2: ["message", "string"] }, { code: 0, message: "" });
}

export function decodeClientHelloResponse(bytes) {
  return decodeScalars(
    bytes,
    {
      1: ["accepted", "bool"],
      2: ["reason", "string"],
      3: ["server_version", "string"],
      4: ["protocol_major", "uint"],
      5: ["protocol_minor", "uint"],
      6: ["features", "strings"],
    },
    { accepted: false, reason: "", server_version: "", protocol_major: 0, protocol_minor: 0, features: [] },
  );
}

export function decodeSubscribeResponse(bytes) {
  return decodeScalars(
    bytes,
    { 1: ["edge_id", "string"], 2: ["last_sequence", "uint"], 3: ["oldest_sequence", "uint"] },
    { edge_id: "", last_sequence: 0, oldest_sequence: 0 },
  );
}

export function decodeFleetEvent(bytes) {
  return decodeScalars(
    bytes,
    {
      1: ["sequence", "uint"],
      2: ["fleet_sequence", "uint"],
      3: ["edge_id", "string"],
      4: ["kind", "string"],
      5: ["occurred_at_ms", "uint"],
      6: ["recorded_at_ms", "uint"],
      7: ["node_id", "string"],
      8: ["provider_id", "string"],
      9: ["command_id", "string"],
      10: ["message", "string"],
      11: ["attributes", "map"],
    },
    {
      sequence: 0,
      fleet_sequence: 0,
      edge_id: "",
      kind: "",
      occurred_at_ms: 0,
      recorded_at_ms: 0,
      node_id: "",
      provider_id: "",
      command_id: "",
      message: "",
      attributes: {},
    },
  );
}

export function decodeEventsLost(bytes) {
  return decodeScalars(
    bytes,
    { 1: ["count", "uint"], 2: ["first_sequence", "uint"], 3: ["last_sequence", "uint"], 4: ["reason", "string"] },
    { count: 0, first_sequence: 0, last_sequence: 0, reason: "" },
  );
}

const BODY_DECODERS = {
  10: ["error", decodeError],
  12: ["client_hello_response", decodeClientHelloResponse],
  14: ["subscribe_response", decodeSubscribeResponse],
  16: ["event", decodeFleetEvent],
  17: ["events_lost", decodeEventsLost],
};

/**
 * Decode a ClientEnvelope: `{request_id, body, message}` where `body` names
 * the oneof field that was set (null if none the console understands).
 */
export function decodeClientEnvelope(bytes) {
  const r = new Reader(bytes);
  const out = { request_id: 0, body: null, message: null };
  r.fields((field, wireType) => {
    if (field === 1) {
      expect(wireType, VARINT);
      out.request_id = r.varint();
      return true;
    }
    const decoder = BODY_DECODERS[field];
    if (!decoder) return false;
    expect(wireType, LENGTH_DELIMITED);
    out.body = decoder[0];
    out.message = decoder[1](r.lengthDelimited());
    return true;
  });
  return out;
}

/** Error codes of the ErrorCode enum, as short snake_case names. */
export const ERROR_CODES = Object.freeze({
  0: "unspecified",
  1: "malformed_frame",
  2: "frame_too_large",
  3: "unexpected_message",
  4: "hello_required",
  5: "hello_timeout",
  6: "unsupported_version",
  7: "keepalive_timeout",
  8: "superseded",
  9: "internal",
  10: "unknown_command",
  11: "invalid_argument",
  12: "unauthenticated",
});
