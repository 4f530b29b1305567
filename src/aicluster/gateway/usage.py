"""Usage capture in the gateway: what each request used, summed in memory and flushed in
acknowledged batches to the usage ledger of tokens (store.token_usage).

Vocabulary:
- a *record*: one request that reached a service, after its answer completed: the
  caller's team ('' for an admin without one), user and token id, the service
  (`TEAM/NAME`), the model the engine served, prompt and completion tokens, requests=1,
  errors (1 when the answer was an error: the gateway's or the engine's), limited (1 when
  a rate limit refused it: a 429, counted as an error too, before any service was chosen,
  so with service and model '').
- tokens come from the engine's `usage`: the JSON answer's (non-streaming), or the last
  chunk that carries one on a server-sent-event stream (`stream_options.include_usage`;
  the Ollama routes always ask for it). A stream without usage counts one completion
  token per content chunk (a chunk with text or tool calls; engines send one per token)
  and no prompt tokens. An answer the gateway cannot read (compressed) counts no tokens.
- a *batch*: the records of about a second summed per key (UTC minute, team, user,
  token, service, model), with an id unique to this gateway process and a sequence
  number: `{"batch_id", "source", "rows": [{KEY..., requests, errors, prompt_tokens,
  completion_tokens, limited}]}`, plain JSON.

Invariants:
- Nothing on a request's path reads or writes the store: `record` adds to a dict in
  memory. A background thread (`sync_loop`) seals what was recorded into a batch about
  once a second and hands sealed batches, oldest first, to the *sink*; a batch is
  acknowledged when the sink returns (in this process: control.token_usage.TokenLedger
  .accept, which commits the batch id with its sums). A batch that fails stays queued,
  unchanged (same id), and is sent again: the ledger takes an id once, so a retried
  flush never counts twice.
- At most `max_queued` batches wait for an acknowledgement: past it (the control plane
  away for about an hour) the oldest is dropped, logged as an error and counted in
  `dropped_rows`, so a gateway's memory stays bounded.
- The last flush runs at shutdown (SIGTERM). A gateway killed with -9 loses what it had
  not flushed: at most the last second of records (and the queued batches, only while
  the store is unreachable).
- A gateway process (gateway.process) POSTs the same batch dicts to the control plane
  (`/v1/gateway/usage`), which hands them to the same `accept`: the sink is the only change.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)
SYNC_EVERY_S = 1.0
MAX_QUEUED_BATCHES = 3600  # about an hour of a busy gateway's batches while none is taken
MAX_JSON_BYTES = 1 << 20  # a JSON answer parsed whole; past it, its tail is searched
TAIL_BYTES = 64 << 10
SUMS = ("requests", "errors", "prompt_tokens", "completion_tokens", "limited")

Sink = Callable[[dict], object]  # takes a batch; returns once it is committed, else raises


@dataclass
class Batch:
    batch_id: str
    source: str
    rows: list[dict]

    def doc(self) -> dict:
        return {"batch_id": self.batch_id, "source": self.source, "rows": self.rows}


class UsageRecorder:
    def __init__(
        self,
        sink: Sink | None,
        source: str | None = None,
        clock=time.time,
        max_queued: int = MAX_QUEUED_BATCHES,
    ):
        self.sink, self.clock, self.max_queued = sink, clock, max_queued
        self.dropped_rows = 0  # rows of batches dropped unacknowledged (max_queued passed)
        self.source = source or f"gw-{uuid.uuid4().hex[:12]}"
        self._seq = 0
        self._pending: dict[tuple, list[int]] = {}
        self._queue: list[Batch] = []
        self._lock = threading.Lock()  # records come from the loop, flushes from a thread
        self._flushing = threading.Lock()

    def record(
        self,
        who,
        service: str,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        error: bool = False,
        limited: bool = False,
    ) -> None:
        key = (
            int(self.clock() // 60),
            who.team or "",
            who.user,
            int(getattr(who, "token_id", None) or 0),
            service,
            model,
        )
        add = (
            1,
            int(error or limited),
            max(0, int(prompt_tokens)),
            max(0, int(completion_tokens)),
            int(limited),
        )
        with self._lock:
            sums = self._pending.setdefault(key, [0, 0, 0, 0, 0])
            for i, n in enumerate(add):
                sums[i] += n

    def seal(self) -> None:
        """What was recorded since the last seal becomes the newest queued batch."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return
        self._seq += 1
        rows = [
            dict(
                zip(("minute", "team", "user", "token_id", "service", "model"), k, strict=True),
                **dict(zip(SUMS, v, strict=True)),
            )
            for k, v in pending.items()
        ]
        self._queue.append(Batch(f"{self.source}-{self._seq}", self.source, rows))
        while len(self._queue) > self.max_queued:  # the control plane away for too long
            lost = self._queue.pop(0)
            self.dropped_rows += len(lost.rows)
            log.error(
                "usage batch %s dropped unacknowledged: %d batches queued",
                lost.batch_id,
                self.max_queued,
            )

    def flush(self) -> int:
        """Seal, then send queued batches oldest first until one fails: the batches
        acknowledged."""
        if self.sink is None:
            return 0
        with self._flushing:
            self.seal()
            sent = 0
            while self._queue:
                batch = self._queue[0]
                try:
                    self.sink(batch.doc())
                except Exception as exc:  # noqa: BLE001 - kept; the next flush resends it
                    log.warning("usage batch %s not delivered: %s", batch.batch_id, exc)
                    break
                self._queue.pop(0)
                sent += 1
            return sent

    def unflushed(self) -> int:
        """Records not yet acknowledged (keys pending + rows queued)."""
        with self._lock:
            return len(self._pending) + sum(len(b.rows) for b in self._queue)


@dataclass
class Meter:
    """Reads one proxied answer as it passes (`feed`, its raw bytes) for its usage."""

    stream: bool  # server-sent events; else one JSON document
    readable: bool = True  # False: compressed, nothing to read
    usage: dict | None = None
    chunks: int = 0  # content chunks of a stream
    _line: bytes = b""
    _head: list[bytes] = field(default_factory=list)
    _size: int = 0
    _tail: bytes = b""

    def feed(self, chunk: bytes) -> None:
        if not self.readable or not chunk:
            return
        if self.stream:
            data = self._line + chunk
            *lines, self._line = data.split(b"\n")
            for line in lines:
                self._event(line.strip())
            if len(self._line) > MAX_JSON_BYTES:
                self._line = b""  # an endless line: not an event we can read
            return
        self._size += len(chunk)
        if self._size <= MAX_JSON_BYTES:
            self._head.append(chunk)
        else:
            self._head = []
        self._tail = (self._tail + chunk)[-TAIL_BYTES:]

    def _event(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if not data or data == b"[DONE]":
            return
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            return
        if not isinstance(doc, dict):
            return
        if isinstance(doc.get("usage"), dict):
            self.usage = doc["usage"]
        for choice in doc.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") or {}
            if choice.get("text") or (
                isinstance(delta, dict) and (delta.get("content") or delta.get("tool_calls"))
            ):
                self.chunks += 1

    def tokens(self) -> tuple[int, int]:
        """(prompt, completion) tokens of the answer read so far."""
        if self.stream and self._line:
            self._event(self._line.strip())
            self._line = b""
        if not self.stream and self.readable and self.usage is None:
            self.usage = _json_usage(self._head, self._size, self._tail)
        if self.usage is not None:
            return _int(self.usage.get("prompt_tokens")), _int(self.usage.get("completion_tokens"))
        return 0, self.chunks if self.stream else 0


def _int(v) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def _json_usage(head: list[bytes], size: int, tail: bytes) -> dict | None:
    if head and size <= MAX_JSON_BYTES:
        try:
            doc = json.loads(b"".join(head))
        except (ValueError, RecursionError):
            return None
        u = doc.get("usage") if isinstance(doc, dict) else None
        return u if isinstance(u, dict) else None
    at = tail.rfind(b'"usage"')
    if at < 0:
        return None
    start = tail.find(b"{", at)
    try:
        u, _ = json.JSONDecoder().raw_decode(tail[start:].decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None
    return u if isinstance(u, dict) else None


def meter_for(headers) -> Meter:
    """A meter for an answer with these (upstream) headers."""
    ctype = headers.get("content-type", "")
    encoding = headers.get("content-encoding", "identity").lower()
    return Meter(stream="text/event-stream" in ctype, readable=encoding in ("", "identity"))


def sync_loop(steps: list[Callable[[], object]], stopping: threading.Event, every_s=SYNC_EVERY_S):
    """Run each step every `every_s` until `stopping` is set, then once more (the last
    flush); a step that fails is logged and run again next time."""
    while True:
        stop = stopping.wait(every_s)
        for step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - the next round retries
                log.warning("gateway sync step %s failed: %s", getattr(step, "__name__", step), exc)
        if stop:
            return


__all__ = ["Batch", "Meter", "UsageRecorder", "meter_for", "sync_loop"]
