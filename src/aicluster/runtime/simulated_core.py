"""The model behind the simulated LLM engine: prefix KV cache and continuous batching.

Vocabulary (all times in simulated seconds):
- token: a whitespace-separated word of the text (`tokenize`).
- block: `block_size` consecutive tokens; a block is named by the chained hash of every
  token before and in it, so equal names mean equal prefixes (`core.routing.block_hashes`).
- prefix KV cache: at most capacity_tokens // block_size blocks, least recently used
  evicted first. A request's cached tokens are those of its longest run of leading blocks
  found in the cache. After the lookup, the full blocks of prompt + output enter the cache.
- slot: one of `max_concurrency` places in the running batch. Requests take slots in
  arrival order (first come, first served); a request that finds none waits for the
  earliest to free.
- plan: a request's timeline, fixed when it arrives:
  start = max(arrival, earliest free slot);
  first token = start + base_ttft_s + prefill_s_per_token x uncached prompt tokens;
  token i (0-based) at first token + i x decode_s_per_token; finish = the last token.
  Time to first token = first token - arrival = queueing + base + uncached prefill.

Invariants:
- Deterministic: the same options and the same sequence of (arrival, prompt, max_tokens)
  give the same plans, cache contents, counters and output text.
- At any time at most `max_concurrency` plans are running (start <= t < finish).
- Cache lookup and insertion happen in arrival order (an approximation: a real engine
  fills the cache as it computes). Running requests do not pin cache blocks.
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from aicluster.core.routing import block_hashes, stable_hash

VOCABULARY = (  # noqa: SIM905
    "the of and to in is that it for on with as was at by an be this from or which are "
    "not have had one all were but they can their there been if more when will would "
    "who so no model token cache prefix batch replica gateway cluster latency throughput"
).split()


class SimulatedEngineOptions(BaseModel):
    """Settings of one simulated engine (also its command-line flags, `--block-size` ...)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(default="simulated", min_length=1, description="served model name")
    seed: int = Field(default=0, description="seeds the output text")
    block_size: int = Field(default=16, ge=1, description="tokens per KV cache block")
    cache_capacity_tokens: int = Field(default=65536, ge=0, description="prefix cache size")
    max_concurrency: int = Field(default=64, ge=1, description="running batch size")
    base_ttft_s: float = Field(default=0.02, ge=0, description="fixed part of TTFT")
    prefill_s_per_token: float = Field(default=0.0002, ge=0, description="per uncached token")
    decode_s_per_token: float = Field(default=0.01, ge=0, description="per output token")
    default_max_tokens: int = Field(default=16, ge=1, description="when a request has none")
    max_model_len: int = Field(default=32768, ge=1, description="prompt + output limit")
    time_scale: float = Field(
        default=1.0, gt=0, description="wall seconds per simulated second (0.01: 100x faster)"
    )
    startup_s: float = Field(
        default=0.0,
        ge=0,
        le=3600,
        description="wall seconds of loading before the engine serves (a cold start): "
        "until then every route but /metrics answers 503",
    )


def tokenize(text: str) -> list[str]:
    return text.split()


class RequestError(Exception):
    """A request the engine refuses: OpenAI error `param` and HTTP `status`."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


def chat_prompt(messages: Any) -> str:
    """The text a chat request's tokens come from: one `role: content` line per message, then
    `assistant:` (the generation prompt), so that turn n's prompt + output is a prefix of
    turn n+1's prompt, as with a real chat template."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list", "messages")
    parts: list[str] = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise RequestError("each message needs a 'role'", "messages")
        content = m.get("content") or ""
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"{m['role']}: {content}")
    return "\n".join(parts + ["assistant:"])


def completion_prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return " ".join(str(t) for t in prompt)
    if not isinstance(prompt, str):
        raise RequestError("'prompt' must be a string (one prompt per request)", "prompt")
    return prompt


def token_id(token: str) -> int:
    return stable_hash(0, token) % 50_000


class PrefixKVCache:
    """Blocks named by chained hashes, in LRU order, at most `capacity_blocks` of them.

    Invariant: the cached blocks of any inserted sequence stay prefix-closed, because an
    insert touches blocks deepest first, so ancestors are evicted after descendants.
    """

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def matched_blocks(self, hashes: Sequence[int]) -> int:
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            n += 1
        return n

    def insert(self, hashes: Sequence[int]) -> None:
        if self.capacity_blocks == 0:
            return
        for h in reversed(hashes):
            if h in self._blocks:
                self._blocks.move_to_end(h)
            else:
                self._blocks[h] = None
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    @property
    def usage(self) -> float:
        return len(self._blocks) / self.capacity_blocks if self.capacity_blocks else 0.0


@dataclass(frozen=True)
class Plan:
    request_id: int
    arrival: float
    start: float
    first_token: float
    decode_s_per_token: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def finish(self) -> float:
        return self.token_time(self.output_tokens - 1)

    def token_time(self, i: int) -> float:
        return self.first_token + max(0, i) * self.decode_s_per_token


@dataclass
class Counters:
    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0


class EngineModel:
    """Admits requests, plans them, and answers what is waiting and running at a time."""

    def __init__(self, options: SimulatedEngineOptions | None = None) -> None:
        self.options = options or SimulatedEngineOptions()
        o = self.options
        self.cache = PrefixKVCache(o.cache_capacity_tokens // o.block_size)
        self.counters = Counters()
        self._slots = [0.0] * o.max_concurrency  # a heap of the times slots free up
        self._active: list[Plan] = []
        self._last_arrival = 0.0

    def admit(self, arrival: float, prompt: Sequence[str], max_tokens: int) -> Plan:
        """Plan a request arriving at `arrival` (clamped to be no earlier than the last)."""
        o = self.options
        arrival = max(arrival, self._last_arrival)
        self._last_arrival = arrival
        n_out = max(1, max_tokens)
        hashes = block_hashes(prompt, o.block_size)
        cached = self.cache.matched_blocks(hashes) * o.block_size
        output = self.output_tokens(prompt, n_out)
        self.cache.insert(block_hashes(list(prompt) + output, o.block_size))
        start = max(arrival, heapq.heappop(self._slots))
        uncached = len(prompt) - cached
        first = start + o.base_ttft_s + o.prefill_s_per_token * uncached
        plan = Plan(
            request_id=self.counters.requests,
            arrival=arrival,
            start=start,
            first_token=first,
            decode_s_per_token=o.decode_s_per_token,
            prompt_tokens=len(prompt),
            cached_tokens=cached,
            output_tokens=n_out,
        )
        heapq.heappush(self._slots, plan.finish)
        c = self.counters
        c.requests += 1
        c.prompt_tokens += len(prompt)
        c.generation_tokens += n_out
        c.prefix_queries += len(prompt)
        c.prefix_hits += cached
        self._active.append(plan)
        return plan

    def output_tokens(self, prompt: Sequence[str], n: int) -> list[str]:
        """The text a prompt gets: the same for the same (seed, prompt, n)."""
        rng = random.Random(stable_hash(self.options.seed, " ".join(prompt)))
        return [rng.choice(VOCABULARY) for _ in range(n)]

    def counts(self, now: float) -> tuple[int, int]:
        """(waiting, running) at `now`; forgets plans that finished before it."""
        self._active = [p for p in self._active if p.finish > now]
        waiting = sum(1 for p in self._active if p.start > now)
        return waiting, len(self._active) - waiting
