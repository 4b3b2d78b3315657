"""One connection of the WebSocket ``/client`` wire: its envelopes and request pairing.

:class:`ClientWireClientProtocol` is one Autobahn connection to the
Control Plane's ``/client`` wire. It owns what is per connection: every
binary message is one ``ClientEnvelope``; answers to our requests are
paired with them by ``request_id`` (:class:`~twisted_iop.wire.pending.PendingRequests`),
and everything else (events, lost-event notices, unsolicited errors) goes
to the listener. :mod:`twisted_iop.client.wire` dials these connections,
says hello and keeps subscriptions alive on them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

from autobahn.twisted.websocket import WebSocketClientProtocol
from google.protobuf.message import DecodeError
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.client.errors import WireClientError, WireConnectionLost, WireRequestError
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.enums import enum_label
from twisted_iop.wire.pending import PendingRequests

#: How long a request (hello, subscribe) may wait for its answer.
REQUEST_TIMEOUT_SECONDS = 10.0

#: Bodies that answer a request of ours; everything else is unsolicited.
RESPONSE_BODIES = frozenset({"error", "client_hello_response", "subscribe_response"})


def make_client_envelope(body: str, message: Any, request_id: int = 0) -> pb.ClientEnvelope:
    """Wrap ``message`` as the ``body`` field of a ``ClientEnvelope``."""
    envelope = pb.ClientEnvelope(request_id=request_id)
    getattr(envelope, body).CopyFrom(message)
    return envelope


def decode_client_envelope(payload: bytes) -> tuple[pb.ClientEnvelope, Optional[str]]:
    """Parse one binary message; returns the envelope and the name of its body.

    Raises :class:`google.protobuf.message.DecodeError` for bytes that do
    not parse.
    """
    envelope = pb.ClientEnvelope()
    envelope.ParseFromString(payload)
    return envelope, envelope.WhichOneof("body")


def error_code_name(code: int) -> str:
    """``ERROR_CODE_UNKNOWN_COMMAND`` -> ``unknown_command`` (stable and readable)."""
    return enum_label(pb.ErrorCode, code, unknown="error_{value}")


class ClientWireClientProtocol(WebSocketClientProtocol):
    """One WebSocket connection: request/response pairing by ``request_id``.

    Answers to our requests fire the Deferred of :meth:`request`;
    everything else (events, lost-event notices, unsolicited errors) goes to
    ``envelope_received``. ``opened`` fires when the WebSocket is open (or
    fails when it never opens); ``lost`` fires when the TCP connection is
    gone.
    """

    _log = Logger()

    def __init__(self) -> None:
        super().__init__()
        self.opened: Deferred[ClientWireClientProtocol] = Deferred()
        self.lost: Deferred[None] = Deferred()
        self.close_reason = ""
        self.envelope_received: Optional[Callable[[pb.ClientEnvelope, str], None]] = None
        self._pending: PendingRequests[pb.ClientEnvelope] = PendingRequests()
        self._is_open = False
        self._closed = False

    # -- Autobahn hooks ---------------------------------------------------------

    def onOpen(self) -> None:
        """The opening handshake completed."""
        self._is_open = True
        self.opened.callback(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        """Decode one envelope and route it to its request or the listener."""
        try:
            self._message_received(payload, isBinary)
        except Exception:
            # Autobahn would swallow it; a bug in a listener must be seen.
            self._log.failure("handling a message from the Control Plane failed")

    def onClose(self, wasClean: bool, code: Optional[int], reason: Optional[str]) -> None:
        """The WebSocket closed: fail what is pending."""
        self.close_reason = reason or ("closed cleanly" if wasClean else "connection lost")
        self._finish()

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:
        """The TCP connection is gone."""
        try:
            super().connectionLost(reason)
        finally:
            if not self.close_reason:
                self.close_reason = reason.getErrorMessage()
            self._finish()
            if not self.lost.called:
                self.lost.callback(None)

    # -- our API ------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        """Whether messages can be sent now."""
        return self._is_open and not self._closed

    def send_envelope(self, envelope: pb.ClientEnvelope) -> None:
        """Send one envelope as a binary message."""
        self.sendMessage(envelope.SerializeToString(), isBinary=True)

    def request(
        self, body: str, message: Any, clock: IReactorTime, timeout: float = REQUEST_TIMEOUT_SECONDS
    ) -> Deferred[pb.ClientEnvelope]:
        """Send a request and wait for the envelope that answers it.

        Fails with :class:`WireRequestError` when the answer is an
        ``Error``, :class:`WireClientError` after ``timeout`` and
        :class:`WireConnectionLost` when the connection drops first.
        """
        if not self.usable:
            raise WireConnectionLost("the connection is not open")
        request_id, d = self._pending.add(
            clock, timeout, lambda: WireClientError(f"no answer to {body} within {timeout:g} s")
        )
        self.send_envelope(make_client_envelope(body, message, request_id))
        return d

    def close(self) -> Deferred[None]:
        """Close the WebSocket; the Deferred fires when the TCP connection is gone."""
        if self.lost.called:
            return succeed(None)
        if self._is_open and not self._closed:
            self.sendClose(code=1000, reason="client closing")
        elif self.transport is not None:
            transport: Any = self.transport
            transport.abortConnection()
        d: Deferred[None] = Deferred()
        self.lost.addBoth(lambda _: d.callback(None))
        return d

    def abort(self) -> None:
        """Drop the TCP connection at once (tests use it to simulate a failure)."""
        if self.transport is not None:
            transport: Any = self.transport
            transport.abortConnection()

    # -- internals ----------------------------------------------------------------

    def _message_received(self, payload: bytes, is_binary: bool) -> None:
        if not is_binary:
            self._log.warn("ignoring a text message on the client wire")
            return
        try:
            envelope, body = decode_client_envelope(payload)
        except DecodeError:
            self._log.warn("ignoring a message that is not a ClientEnvelope ({size} bytes)", size=len(payload))
            return
        if body is None:
            return
        if body in RESPONSE_BODIES and envelope.request_id in self._pending:
            if body == "error":
                error = WireRequestError(error_code_name(envelope.error.code), envelope.error.message)
                self._pending.fail(envelope.request_id, error)
            else:
                self._pending.answer(envelope.request_id, envelope)
            return
        if self.envelope_received is not None:
            self.envelope_received(envelope, body)

    def _finish(self) -> None:
        if not self._closed:
            self._closed = True
        if not self.opened.called:
            self.opened.errback(WireConnectionLost(self.close_reason or "the WebSocket did not open"))
        self._pending.fail_all(lambda: WireConnectionLost(f"the connection closed: {self.close_reason}"))
