"""The serving simulation: requests routed to instances that batch continuously, KV caches on the fabric.

Instances (role `both`: co-located, vLLM-style; `prefill`; `decode`) run iterations back to back:

- a co-located iteration takes the queued prompts that fit the token budget and the KV memory
  (first come, first served; a prompt larger than the budget runs alone) together with every running
  decode; it lasts prefill(prompt tokens + decodes) x MIXED_FACTOR when it mixes both (Splitwise's
  simulator does the same), prefill(tokens) with prompts only, decode(batch, context) otherwise;
- a prefill instance runs prompt-only iterations; a prompt's first token comes out when its
  iteration ends (TTFT), then its KV cache flows to the decode instance chosen at arrival;
- a decode instance takes the requests whose KV cache has arrived (up to `max_batch` and its KV
  memory) and makes one token for each running request per iteration.

KV memory: a request holds prompt + output tokens on the instance that decodes it from admission to
its last token (the simulator knows the output length; a paged allocator holds less early on), and
its prompt on a prefill instance until its KV cache has left. With `overlap` the transfer starts
with the prefill iteration (layer by layer, as Splitwise does) and the request is ready once the
flow has ended and the last layer (1/layers of the bytes) has crossed after the prefill.

Routing (Splitwise's JSQ): a prompt goes to the prefill (or co-located) instance with the fewest
queued tokens (waiting or in the running iteration; then the fewest running requests, so that idle
co-located instances share the prompts); a decode instance is chosen at arrival: `jsq` the most
free KV memory, `fabric` the lowest estimated KV transfer time, plus the time the flows already on
its path lose to it (`KVNetwork.others_delay_s`), plus its decode step time x the mean output
length seen so far (the request waits one step per token; among those with room); `fabric-local`
the same with the step counted once (locality first, load balance a tie-breaker).
With `mixed_pool` (Splitwise's split designs: its simulator's `MixedPoolScheduler`), a prompt that
finds even the least-loaded prefill instance with a queue of more than MIXED_POOL_TOKENS prompt tokens
goes to the decode instance with the fewest queued prompt tokens instead, which runs it there as a
co-located instance would (mixed iterations) and decodes it itself: under a prompt burst the split
cluster borrows decode machines rather than queueing, as Splitwise's does.
`first_token` says where the user gets the first token: `prefill`
(Splitwise) or `decode` (the KV transfer is then part of TTFT). Ties go to the lowest instance
index: a run is a pure function of its inputs.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gpupool.sim.serving.network import KVNetwork
from gpupool.sim.serving.profiles import StepProfile
from gpupool.sim.serving.trace import Request

MIXED_FACTOR = 1.1
MIXED_POOL_TOKENS = 8192
"""Queued prompt tokens past which a split cluster runs prompts on decode instances (Splitwise's
`prompt_max_pending_batch_tokens`)."""
DEFAULT_OUTPUT_GUESS = 128
"""Output tokens the fabric router assumes before any request has finished."""
ARRIVE, ITER_END, NET, READY = 0, 1, 2, 3


@dataclass(slots=True)
class Instance:
    """One serving instance and its batching state."""

    index: int
    role: str
    node: int
    profile: StepProfile
    kv_capacity: int
    token_budget: int = 2048
    max_batch: int = 64
    queue: deque[int] = field(default_factory=deque)
    queued_tokens: int = 0
    """Prompt tokens waiting or in the running iteration: what JSQ compares."""
    joins: deque[int] = field(default_factory=deque)
    kv_used: int = 0
    kv_reserved: int = 0
    running: list[tuple[int, int]] = field(default_factory=list)
    """Heap of (tick at which it makes its last token, request index)."""
    ctx_sum: float = 0.0
    tick: int = 0
    busy: bool = False
    batch: list[int] = field(default_factory=list)
    batch_decodes: int = 0
    busy_s: float = 0.0

    @property
    def free_kv(self) -> int:
        return self.kv_capacity - self.kv_used - self.kv_reserved


@dataclass(frozen=True, slots=True)
class EngineOptions:
    router: str = "jsq"
    overlap: bool = False
    first_token: str = "prefill"
    """Where a split request's first token reaches the user: `prefill` (Splitwise: the prefill
    instance sends it) or `decode` (the decode instance streams every token, the first once the KV
    cache has arrived, as disaggregated vLLM and Dynamo do): the KV transfer is then in the TTFT."""
    kv_bytes_per_token: int = 327_680
    layers: int = 80
    mixed_pool: bool = False
    """Split modes: decode instances take prompts when the prefill queues are long (Splitwise)."""


@dataclass(slots=True)
class Outcome:
    """Per-request times (seconds; nan where it never got there)."""

    ttft: np.ndarray
    e2e: np.ndarray
    tbt: np.ndarray
    end_s: float
    busy_s: tuple[float, ...]
    kv_wait: np.ndarray
    """From the end of a request's prefill to its KV cache being ready at the decode instance
    (the transfer, or its last layer with `overlap`); nan where it was decoded where it was prefilled."""


class ServingSim:
    """One run over one trace (see the module docstring)."""

    def __init__(
        self,
        instances: Sequence[Instance],
        requests: Sequence[Request],
        net: KVNetwork,
        options: EngineOptions,
    ) -> None:
        self.inst = list(instances)
        self.reqs = list(requests)
        self.net = net
        self.opt = options
        n = len(self.reqs)
        self.first = np.full(n, math.nan)
        self.prefilled = np.full(n, math.nan)
        self.done = np.full(n, math.nan)
        self.decoder = [-1] * n
        self.kv_at = [-1] * n
        self.ready_floor = np.zeros(n)
        self.kv_ready = np.full(n, math.nan)
        self.flow_pending: dict[int, float] = {}
        self.events: list[tuple[float, int, int, int, int]] = []
        self.out_sum = 0
        self.out_count = 0
        self.borrowed = 0
        """Prompts a decode instance ran (the mixed pool)."""
        self.seq = 0
        self.front = [i for i in self.inst if i.role in ("both", "prefill")]
        self.back = [i for i in self.inst if i.role == "decode"]

    def _push(self, at: float, kind: int, a: int, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, a, b))

    # ------------------------------------------------------------------ run

    def run(self) -> Outcome:
        for r, req in enumerate(self.reqs):
            self._push(req.arrival_s, ARRIVE, r)
        now = 0.0
        while self.events:
            now, _, kind, a, b = heapq.heappop(self.events)
            if kind == ARRIVE:
                self._arrive(now, a)
            elif kind == ITER_END:
                self._iter_end(now, self.inst[a])
            elif kind == READY:
                self._ready(now, a)
            elif b == self.net.version:
                self._net_done(now, a)
        ttft = self.first - np.array([q.arrival_s for q in self.reqs])
        e2e = self.done - np.array([q.arrival_s for q in self.reqs])
        out = np.array([q.output_tokens for q in self.reqs], dtype=float)
        with np.errstate(invalid="ignore", divide="ignore"):
            tbt = np.where(out > 1, (self.done - self.first) / np.maximum(out - 1, 1), 0.0)
        busy = tuple(i.busy_s for i in self.inst)
        return Outcome(ttft, e2e, tbt, now, busy, self.kv_ready - self.prefilled)

    # ------------------------------------------------------------------ routing

    def _arrive(self, now: float, r: int) -> None:
        req = self.reqs[r]
        front = min(self.front, key=lambda i: (i.queued_tokens, len(i.running), i.index))
        if (
            self.opt.mixed_pool
            and self.back
            and front.role == "prefill"
            and front.queued_tokens > 0
            and front.queued_tokens + req.prompt_tokens > MIXED_POOL_TOKENS
        ):
            front = min(self.back, key=lambda i: (i.queued_tokens, len(i.running) + len(i.joins), i.index))
            front.queue.append(r)
            front.queued_tokens += req.prompt_tokens
            self.decoder[r] = front.index
            self.borrowed += 1
            if not front.busy:
                self._start(now, front)
            return
        front.queue.append(r)
        front.queued_tokens += req.prompt_tokens
        if self.back and req.output_tokens > 1:
            dec = self._pick_decode(front, req)
            self.decoder[r] = dec.index
            dec.kv_reserved += req.prompt_tokens + req.output_tokens
        if not front.busy:
            self._start(now, front)

    def _pick_decode(self, front: Instance, req: Request) -> Instance:
        need = req.prompt_tokens + req.output_tokens
        if self.opt.router == "jsq":
            return max(self.back, key=lambda i: (i.free_kv, -i.index))
        nbytes = req.prompt_tokens * self.opt.kv_bytes_per_token
        roomy = [i for i in self.back if i.free_kv >= need] or self.back

        # The request will wait one step of the instance per output token: its length is not
        # known when it arrives, so the router takes the mean of the outputs finished so far.
        tokens = self.out_sum / self.out_count if self.out_count else DEFAULT_OUTPUT_GUESS
        if self.opt.router == "fabric-local":
            tokens = 1.0  # locality first: the step counts once, as a tie-breaker among near ones

        def cost(i: Instance) -> tuple[float, int]:
            batch = len(i.running) + len(i.joins) + 1
            step = i.profile.decode_s(batch, i.ctx_sum + need)
            net = self.net.estimate_s(front.node, i.node, nbytes) + self.net.others_delay_s(
                front.node, i.node, nbytes
            )
            return net + tokens * step, i.index

        return min(roomy, key=cost)

    # ------------------------------------------------------------------ iterations

    def _start(self, now: float, inst: Instance) -> None:
        batch: list[int] = []
        tokens = 0
        local = inst.role != "prefill"  # decodes what it prefills: co-located, or a borrowed decode instance
        if inst.role == "decode":
            while inst.joins and len(inst.running) < inst.max_batch:
                r = inst.joins[0]
                req = self.reqs[r]
                need = req.prompt_tokens + req.output_tokens
                if need > inst.kv_capacity - inst.kv_used:
                    break
                inst.joins.popleft()
                inst.kv_reserved -= need
                inst.kv_used += need
                self._join(inst, r, req.output_tokens - 1)
        while inst.queue:
            r = inst.queue[0]
            req = self.reqs[r]
            hold = req.prompt_tokens + (req.output_tokens if local else 0)
            if batch and tokens + req.prompt_tokens > inst.token_budget:
                break
            full = local and len(inst.running) + len(batch) >= inst.max_batch
            if hold > inst.free_kv or full:
                break
            inst.queue.popleft()
            inst.kv_used += hold
            tokens += req.prompt_tokens
            batch.append(r)
        decodes = len(inst.running)
        if not batch and not decodes:
            inst.busy = False
            return
        if batch and decodes:
            dur = inst.profile.prefill_s(tokens + decodes) * MIXED_FACTOR
        elif batch:
            dur = inst.profile.prefill_s(tokens)
        else:
            dur = inst.profile.decode_s(decodes, inst.ctx_sum)
        inst.busy, inst.batch, inst.batch_decodes = True, batch, decodes
        inst.busy_s += dur
        if batch and inst.role == "prefill" and self.opt.overlap:
            for r in batch:
                self._send(now, inst, r, floor=now + dur)
        self._push(now + dur, ITER_END, inst.index)

    def _join(self, inst: Instance, r: int, remaining: int) -> None:
        req = self.reqs[r]
        heapq.heappush(inst.running, (inst.tick + remaining, r))
        inst.ctx_sum += req.prompt_tokens + 1

    def _iter_end(self, now: float, inst: Instance) -> None:
        if inst.batch_decodes:
            inst.tick += 1
            inst.ctx_sum += inst.batch_decodes
            while inst.running and inst.running[0][0] <= inst.tick:
                _, r = heapq.heappop(inst.running)
                req = self.reqs[r]
                self.done[r] = now
                self.out_sum += req.output_tokens
                self.out_count += 1
                inst.ctx_sum -= req.prompt_tokens + req.output_tokens
                inst.kv_used -= req.prompt_tokens + req.output_tokens
        local = inst.role != "prefill"
        for r in inst.batch:
            req = self.reqs[r]
            inst.queued_tokens -= req.prompt_tokens
            self.prefilled[r] = now
            if local or self.opt.first_token == "prefill" or req.output_tokens <= 1:
                self.first[r] = now
            if req.output_tokens <= 1:
                self.done[r] = now
                inst.kv_used -= req.prompt_tokens + (req.output_tokens if local else 0)
            elif local:
                self._join(inst, r, req.output_tokens - 1)
            elif not self.opt.overlap:
                self._send(now, inst, r, floor=now)
            else:
                self._maybe_ready(now, r)
        inst.batch = []
        self._start(now, inst)

    # ------------------------------------------------------------------ KV transfer

    def _send(self, now: float, inst: Instance, r: int, floor: float) -> None:
        req = self.reqs[r]
        dec = self.inst[self.decoder[r]]
        nbytes = req.prompt_tokens * self.opt.kv_bytes_per_token
        self.kv_at[r] = inst.index
        self.ready_floor[r] = floor
        if dec.node == inst.node or nbytes <= 0:
            self.flow_pending[r] = floor
            if floor <= now:
                self._ready(now, r)
            return
        self.net.start(now, r, inst.node, dec.node, nbytes)
        if self.opt.overlap:
            # The last layer leaves once the prefill is over, at the rate the flow has now.
            self.ready_floor[r] = floor + nbytes / self.opt.layers / self.net.rate_bps(r)
        self._schedule_net()

    def _schedule_net(self) -> None:
        nxt = self.net.next_finish()
        if nxt is not None:
            self._push(nxt[0], NET, nxt[1], self.net.version)

    def _net_done(self, now: float, r: int) -> None:
        self.net.finish(now, r)
        self._schedule_net()
        self.flow_pending[r] = max(now, self.ready_floor[r])
        self._maybe_ready(now, r)

    def _maybe_ready(self, now: float, r: int) -> None:
        at = self.flow_pending.get(r)
        if at is None or math.isnan(self.prefilled[r]):
            return  # the flow or the prefill is still going
        at = max(at, self.ready_floor[r])
        if at > now:
            self.ready_floor[r] = at
            self.flow_pending[r] = at
            self._push(at, READY, r)
            return
        self._ready(now, r)

    def _ready(self, now: float, r: int) -> None:
        self.flow_pending.pop(r, None)
        self.kv_ready[r] = now
        if math.isnan(self.first[r]):
            self.first[r] = now
        src = self.inst[self.kv_at[r]]
        src.kv_used -= self.reqs[r].prompt_tokens
        if not src.busy:
            self._start(now, src)
        dec = self.inst[self.decoder[r]]
        dec.joins.append(r)
        if not dec.busy:
            self._start(now, dec)
