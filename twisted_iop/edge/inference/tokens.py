"""Tokens counted from the engines' usage, per provider and model (no I/O).

Every ``InferenceDone`` that carries ``usage`` adds its prompt and
completion tokens to its (node, provider, model) totals, and its
completion tokens to the provider's last minute: one bucket per second
in a ring of :data:`WINDOW_SECONDS` (bounded, whatever the traffic), from
which tokens per second are read. A request's tokens count when it ends,
so a long stream shows in the rate at its end, as the engine reports it.

A usage the Node estimated (``InferenceUsage.estimated``: the engine sent
none, as llama-cpp-python's streams) counts in the totals like an exact
one, and in :meth:`TokenCounter.estimated_totals` too: the part of the
totals that is an estimate.
"""

from __future__ import annotations

import attrs

#: The rate is averaged over this many seconds.
WINDOW_SECONDS = 60
#: Tokens accepted from one request's usage (anything above is clamped).
MAX_TOKENS_PER_REQUEST = 100_000_000


@attrs.define
class _Window:
    seconds: list[int] = attrs.field(factory=lambda: [-1] * WINDOW_SECONDS)
    counts: list[int] = attrs.field(factory=lambda: [0] * WINDOW_SECONDS)


class TokenCounter:
    """Prompt and completion tokens in total, and completion tokens per second."""

    def __init__(self) -> None:
        #: (node, provider, model) -> [prompt, completion]
        self._totals: dict[tuple[str, str, str], list[int]] = {}
        self._windows: dict[tuple[str, str], _Window] = {}
        #: (node, provider, model) -> [prompt, completion] of the estimated usages only
        self._estimated: dict[tuple[str, str, str], list[int]] = {}

    def add(
        self,
        node_id: str,
        provider_id: str,
        model: str,
        prompt: int,
        completion: int,
        now: float,
        estimated: bool = False,
    ) -> None:
        """Count one request's usage at ``now`` (``estimated``: the Node's estimate, not the engine's count)."""
        prompt = max(0, min(prompt, MAX_TOKENS_PER_REQUEST))
        completion = max(0, min(completion, MAX_TOKENS_PER_REQUEST))
        totals = self._totals.setdefault((node_id, provider_id, model), [0, 0])
        totals[0] += prompt
        totals[1] += completion
        if estimated:
            part = self._estimated.setdefault((node_id, provider_id, model), [0, 0])
            part[0] += prompt
            part[1] += completion
        window = self._windows.setdefault((node_id, provider_id), _Window())
        second = int(now)
        slot = second % WINDOW_SECONDS
        if window.seconds[slot] != second:
            window.seconds[slot] = second
            window.counts[slot] = 0
        window.counts[slot] += completion

    def tokens_per_second(self, node_id: str, provider_id: str, now: float) -> float:
        """Completion tokens per second over the last :data:`WINDOW_SECONDS`."""
        window = self._windows.get((node_id, provider_id))
        if window is None:
            return 0.0
        oldest = int(now) - WINDOW_SECONDS
        total = sum(c for s, c in zip(window.seconds, window.counts, strict=True) if s > oldest)
        return total / WINDOW_SECONDS

    def provider_totals(self, node_id: str, provider_id: str) -> tuple[int, int]:
        """Prompt and completion tokens of one provider, every model."""
        return _provider_sum(self._totals, node_id, provider_id)

    def provider_estimated_totals(self, node_id: str, provider_id: str) -> tuple[int, int]:
        """The estimated part of :meth:`provider_totals`."""
        return _provider_sum(self._estimated, node_id, provider_id)

    def totals(self) -> list[tuple[str, str, str, int, int]]:
        """Every (node, provider, model, prompt, completion), sorted."""
        return sorted((n, p, m, tp, tc) for (n, p, m), (tp, tc) in self._totals.items())

    def estimated_totals(self) -> list[tuple[str, str, str, int, int]]:
        """The estimated part of :meth:`totals`: every (node, provider, model, prompt, completion), sorted."""
        return sorted((n, p, m, tp, tc) for (n, p, m), (tp, tc) in self._estimated.items())


def _provider_sum(totals: dict[tuple[str, str, str], list[int]], node_id: str, provider_id: str) -> tuple[int, int]:
    """Prompt and completion tokens of one provider in ``totals``, every model."""
    prompt = completion = 0
    for (n, p, _), (tp, tc) in totals.items():
        if n == node_id and p == provider_id:
            prompt += tp
            completion += tc
    return prompt, completion
