"""Edge events: sequencing, the bounded outbox, and relay to the Control Plane.

Every event gets the Edge's clock time and the next ``edge_sequence``. While
the Control Plane is not attached (disconnected, or hello not yet accepted)
events wait in an outbox bounded in count and in estimated bytes; when it
overflows the oldest are dropped and counted, and the next flush ends with an ``outbox.overflow`` event carrying
the count, so a loss is never silent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Optional

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from twisted_iop.wire import control_pb2 as pb

#: Something that sends one event to the Control Plane.
EventSink = Callable[[pb.EdgeEvent], None]

#: Estimated bytes of one event message and of one attribute entry in
#: memory, besides twice the event's wire size (measured with upb: about
#: 450 for a small event, 200 per attribute).
EVENT_BYTES = 512
ATTRIBUTE_BYTES = 320
#: The default byte budget of the outbox.
DEFAULT_OUTBOX_BYTES = 4 * 1024 * 1024


def outbox_event_size(event: pb.EdgeEvent) -> int:
    """Estimated bytes an event holds while it waits in the outbox."""
    return EVENT_BYTES + ATTRIBUTE_BYTES * len(event.attributes) + 2 * event.ByteSize()


class EventRelay:
    """Numbers events and delivers them now or after reconnect, in order."""

    _log = Logger()

    def __init__(self, clock: IReactorTime, outbox_size: int, outbox_bytes: int = DEFAULT_OUTBOX_BYTES) -> None:
        self._clock = clock
        #: Waiting events with their estimated sizes.
        self._outbox: deque[tuple[pb.EdgeEvent, int]] = deque()
        self._outbox_size = outbox_size
        self._outbox_bytes = outbox_bytes
        #: Estimated bytes of the waiting events.
        self.outbox_bytes = 0
        self._sink: Optional[EventSink] = None
        self._sequence = 0
        self._dropped = 0
        self._dropped_total = 0
        self._first_dropped = 0
        self._last_dropped = 0
        self._listeners: list[EventSink] = []

    @property
    def last_sequence(self) -> int:
        """The sequence of the newest event."""
        return self._sequence

    @property
    def outbox_length(self) -> int:
        """Events waiting for the Control Plane."""
        return len(self._outbox)

    @property
    def dropped_total(self) -> int:
        """Events ever dropped by outbox overflow."""
        return self._dropped_total

    @property
    def attached(self) -> bool:
        """Whether events go straight to the Control Plane."""
        return self._sink is not None

    def add_listener(self, listener: EventSink) -> None:
        """Also call ``listener`` with every event as it is emitted (tests, logs)."""
        self._listeners.append(listener)

    def emit(
        self,
        kind: str,
        *,
        node_id: str = "",
        provider_id: str = "",
        command_id: str = "",
        message: str = "",
        attributes: Optional[Mapping[str, str]] = None,
    ) -> pb.EdgeEvent:
        """Record one event and deliver or queue it."""
        self._sequence += 1
        event = pb.EdgeEvent(
            kind=kind,
            occurred_at_ms=int(self._clock.seconds() * 1000),
            node_id=node_id,
            provider_id=provider_id,
            command_id=command_id,
            message=message,
            attributes=dict(attributes or {}),
            edge_sequence=self._sequence,
        )
        for listener in list(self._listeners):
            listener(event)
        if self._sink is not None:
            self._sink(event)
        else:
            self._queue(event)
        return event

    def attach(self, sink: EventSink) -> int:
        """Start delivering to ``sink``: flush the outbox first, in order.

        Returns how many events were flushed (the overflow event included).
        """
        flushed = 0
        while self._outbox:
            event, size = self._outbox.popleft()
            self.outbox_bytes -= size
            sink(event)
            flushed += 1
        self._sink = sink
        if self._dropped:
            dropped, first, last = self._dropped, self._first_dropped, self._last_dropped
            self._dropped = 0
            self.emit(
                "outbox.overflow",
                message=f"{dropped} events were dropped while the control plane was unreachable",
                attributes={
                    "dropped": str(dropped),
                    "first_dropped_sequence": str(first),
                    "last_dropped_sequence": str(last),
                },
            )
            flushed += 1
        return flushed

    def detach(self) -> None:
        """Stop delivering; queue events in the outbox from now on."""
        self._sink = None

    def _queue(self, event: pb.EdgeEvent) -> None:
        size = outbox_event_size(event)
        outbox = self._outbox
        outbox.append((event, size))
        self.outbox_bytes += size
        # The newest event always stays, whatever its size.
        while len(outbox) > 1 and (len(outbox) > self._outbox_size or self.outbox_bytes > self._outbox_bytes):
            lost, lost_size = outbox.popleft()
            self.outbox_bytes -= lost_size
            if self._dropped == 0:
                self._first_dropped = lost.edge_sequence
            self._last_dropped = lost.edge_sequence
            self._dropped += 1
            self._dropped_total += 1
