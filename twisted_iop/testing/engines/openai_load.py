"""Clients of a real Edge's gateway, through the ``openai`` package, for the
tests against real engines: each request's outcome as the client saw it.

:func:`ask` sends one chat completion (streamed or not) and keeps how it
ended, never raising; :func:`load` runs clients in threads, one request
after another, until a number of requests have *ended* (never "as many as
fit in a time": a busy machine takes longer, not fewer), bounded by a
generous deadline. The tests then assert on every outcome.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import attrs

#: How long a load client pauses after a failed request (a real one would, rather than spin).
FAILURE_PAUSE_SECONDS = 0.2


@attrs.define
class Outcome:
    """How one request ended, as the client saw it."""

    started: float
    ended: float = 0.0
    #: The HTTP status (200 for a stream that then failed); 0 when none came.
    status: int = 0
    #: Content chunks (streaming) received, or 1 for a whole answer.
    chunks: int = 0
    finish_reason: str = ""
    error: str = ""
    #: The error's code (``not_supported``, ``model_unavailable`` ...), when the body had one.
    code: str = ""
    #: The usage the answer carried (a stream's usage chunk, when asked for), else ``None``.
    usage: Optional[dict[str, int]] = None
    #: When the first content arrived (monotonic), 0 if none did.
    first_content: float = 0.0

    @property
    def ok(self) -> bool:
        """A whole answer: no error and the engine's finish reason."""
        return not self.error and self.finish_reason == "length"


def _usage(usage: Any) -> Optional[dict[str, int]]:
    if usage is None:
        return None
    return {"prompt": int(usage.prompt_tokens), "completion": int(usage.completion_tokens)}


def ask(
    client: Any, model: str, stream: bool, max_tokens: int, prompt: str = "hi", include_usage: bool = False
) -> Outcome:
    """One chat completion of ``model``; every failure is kept in the outcome, never raised.

    ``include_usage`` asks a stream for its usage chunk (``stream_options``).
    """
    import openai  # a test extra

    outcome = Outcome(time.monotonic())
    messages: Any = [{"role": "user", "content": prompt}]
    try:
        if stream:
            extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if include_usage else {}
            for chunk in client.chat.completions.create(
                model=model, messages=messages, max_tokens=max_tokens, stream=True, **extra
            ):
                outcome.status = 200
                if chunk.usage is not None:
                    outcome.usage = _usage(chunk.usage)
                for choice in chunk.choices:
                    if choice.delta.content:
                        outcome.chunks += 1
                        outcome.first_content = outcome.first_content or time.monotonic()
                    if choice.finish_reason:
                        outcome.finish_reason = choice.finish_reason
        else:
            answer = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens)
            outcome.status, outcome.chunks = 200, 1
            outcome.first_content = time.monotonic()
            outcome.finish_reason = answer.choices[0].finish_reason or ""
            outcome.usage = _usage(answer.usage)
    except openai.APIStatusError as e:
        outcome.status, outcome.error = e.status_code, f"{e.status_code} {e.message}"
        outcome.code = str(e.code or "")
    except Exception as e:  # the client sees whatever the connection did: keep it
        outcome.error = f"{type(e).__name__}: {e}"
    outcome.ended = time.monotonic()
    return outcome


def embed(client: Any, model: str) -> Outcome:
    """One embeddings request of ``model``; how it ended (``chunks`` 1 for an answer), never raised."""
    import openai  # a test extra

    outcome = Outcome(time.monotonic())
    try:
        client.embeddings.create(model=model, input=["a"])
        outcome.status, outcome.chunks = 200, 1
    except openai.APIStatusError as e:
        outcome.status, outcome.error, outcome.code = e.status_code, f"{e.status_code} {e.message}", str(e.code or "")
    except Exception as e:
        outcome.error = f"{type(e).__name__}: {e}"
    outcome.ended = time.monotonic()
    return outcome


def load(
    new_client: Callable[[], Any],
    model: str,
    clients: int,
    requests: int,
    max_tokens: int,
    during: Optional[Callable[[], None]] = None,
    after_during: int = 0,
    deadline: float = 300.0,
    stream: Optional[bool] = None,
) -> list[Outcome]:
    """``clients`` threads each asking one request after another until ``requests`` have ended
    (and, with ``during``, ``after_during`` more have started after it ran); a generous overall
    ``deadline`` (seconds) bounds a run that hangs.

    Every other request is streamed, unless ``stream`` says all or none.
    ``during`` (if given) is called once from this thread after half of
    ``requests`` ended. Nothing depends on how many requests fit in a time:
    the caller asserts on each outcome.
    """
    give_up = time.monotonic() + deadline
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    acted: list[float] = []

    def enough() -> bool:
        with lock:
            if len(outcomes) < requests:
                return False
            if during is None:
                return True
            if not acted:
                return False
            return sum(1 for o in outcomes if o.started > acted[0]) >= after_during

    def client_loop(index: int) -> None:
        client = new_client()
        streaming = bool(index % 2) if stream is None else stream
        while not enough() and time.monotonic() < give_up:
            outcome = ask(client, model, streaming, max_tokens)
            with lock:
                outcomes.append(outcome)
            if not outcome.ok:
                time.sleep(FAILURE_PAUSE_SECONDS)  # a client backing off, not a wait in the test
            if stream is None:
                streaming = not streaming

    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(client_loop, i) for i in range(clients)]
        if during is not None:
            while time.monotonic() < give_up:
                with lock:
                    if len(outcomes) >= requests // 2:
                        break
                time.sleep(0.05)  # a bounded poll of the other threads
            acted.append(time.monotonic())
            during()
        for future in futures:
            future.result()
    assert enough(), f"the load did not finish within {deadline:g}s: " + summary(outcomes)
    return outcomes


def summary(outcomes: list[Outcome]) -> str:
    """How many ended how (status and the start of the error), most common first, for a failure message."""
    counts = Counter((o.status, o.error[:100]) for o in outcomes)
    return f"{len(outcomes)} requests: " + "; ".join(
        f"{n} x {status} {error!r}" for (status, error), n in counts.most_common(5)
    )
