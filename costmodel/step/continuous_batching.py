"""Continuous batching, simulated request by request: what a served model's users wait for.

Orca's iteration-level scheduling (Yu et al., OSDI 2022) as vLLM runs it (Kwon et al., SOSP 2023;
vLLM's scheduler): requests arrive (a Poisson process at ``rate_per_s``, or given arrival
times), each with a prompt and an output length drawn from its `LengthDistribution`. Every
iteration the scheduler runs each admitted request's next token together; with chunked
prefill (vLLM's ``max_num_batched_tokens``, `ServeConfig.prefill_chunk_tokens`) the decode
tokens come first and prompt chunks fill the iteration's token budget, else waiting prompts are
prefilled whole in an iteration of their own before decoding resumes. The KV cache is paged
(``kv_block_size`` tokens a block); a request is admitted only when its first chunk's blocks are
free, and when a running request needs a block and none is free the latest admitted one is
preempted (its blocks freed, its prompt and generated tokens recomputed on readmission: vLLM's
recompute preemption). A stack that reserves whole requests
(`costmodel.inputs.serving_stack.ServingStack.reserves_whole_request`, TensorRT-LLM's
GUARANTEED_NO_EVICT) admits one only when the blocks of its prompt and its whole output are free,
and so never preempts; its output is the one drawn (a server reserving a larger ``max_tokens``
admits fewer). Each iteration is costed by the step model at its actual batch, cached
tokens and prompt tokens (`costmodel.step.inference.iteration_s`). A prompt's completion emits
its first token; the time to first token is from arrival to then, the time per output token the
rest of the request's time over its remaining tokens.

One replica is simulated; replicas share the arrivals round-robin (a Poisson stream thinned by
``replicas`` is Poisson at ``rate / replicas``). In a closed loop (`ServeConfig.concurrency`, as
benchmark clients with a concurrency limit run) each client sends its next request the moment its
previous one completes, the clients split evenly over the replicas. Deterministic under ``seed``.

>>> from costmodel.hardware.machine import load_machine
>>> from costmodel.inputs.model_config import ModelConfig
>>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=4, ffn_size=4096, vocab_size=1000)
>>> cfg = ServeConfig(rate_per_s=20, input_len=LengthDistribution(fixed=128), output_len=LengthDistribution(fixed=32), requests=50)
>>> result = simulate_serving(m, TrainConfig(workload="decode"), Layout(), load_machine("h100-sxm"), cfg)
>>> result.completed, result.ttft_p50_s < result.ttft_p99_s, result == simulate_serving(m, TrainConfig(workload="decode"), Layout(),
...                                                                                 load_machine("h100-sxm"), cfg)
(50, True, True)
"""

from __future__ import annotations

import math
import random
from collections import deque
from functools import lru_cache
from typing import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from costmodel.errors import InfeasibleError
from costmodel.hardware.machine import Machine
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.inference import inference_memory, iteration_s, kv_heads_per_device
from costmodel.step.serving_kernels import kv_element_bytes
from costmodel.step.speculative import Speculation, speculative_step_s

# Cached tokens are costed at this relative resolution (the cost is linear in them; one cost per bucket).
_CACHE_BUCKETS_PER_DOUBLING = 32


class LengthDistribution(BaseModel):
    """Token counts drawn per request: one fixed count, uniform between two, or an empirical histogram.

    >>> rng = random.Random(0)
    >>> LengthDistribution(fixed=512).sample(rng), LengthDistribution(low=10, high=20).sample(rng) in range(10, 21)
    (512, True)
    >>> LengthDistribution(histogram=((100, 1.0), (300, 3.0))).mean
    250.0
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    fixed: PositiveInt | None = Field(None, description="Every request has this many tokens.")
    low: PositiveInt | None = Field(None, description="Uniform: the fewest tokens (with high).")
    high: PositiveInt | None = Field(None, description="Uniform: the most tokens, inclusive (with low).")
    histogram: tuple[tuple[PositiveInt, PositiveFloat], ...] = Field((), description="Empirical: (tokens, weight) pairs.")

    @model_validator(mode="after")
    def _one_kind(self) -> LengthDistribution:
        kinds = [self.fixed is not None, self.low is not None or self.high is not None, bool(self.histogram)]
        if sum(kinds) != 1 or (kinds[1] and (self.low is None or self.high is None or self.low > self.high)):
            raise ValueError("give one of: fixed=N; low=A, high=B with A <= B; histogram=((tokens, weight), ...)")
        return self

    def sample(self, rng: random.Random) -> int:
        """One request's tokens."""
        if self.fixed is not None:
            return self.fixed
        if self.histogram:
            tokens, weights = zip(*self.histogram)
            return rng.choices(tokens, weights=weights)[0]
        return rng.randint(self.low, self.high)

    @property
    def mean(self) -> float:
        """The expected tokens."""
        if self.fixed is not None:
            return float(self.fixed)
        if self.histogram:
            return sum(t * w for t, w in self.histogram) / sum(w for _, w in self.histogram)
        return (self.low + self.high) / 2

    @property
    def most(self) -> int:
        """The largest count it can draw."""
        return self.fixed or self.high or max(t for t, _ in self.histogram)


class ServeConfig(BaseModel):
    """The load and the scheduler's limits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rate_per_s: PositiveFloat | None = Field(None, description="Requests arriving per second, over all replicas (Poisson); "
                                             "None with a trace or a closed loop.")
    input_len: LengthDistribution = Field(description="Prompt tokens per request.")
    output_len: LengthDistribution = Field(description="Generated tokens per request.")
    requests: PositiveInt = Field(500, description="Requests simulated (per replica's share: requests / replicas).")
    seed: NonNegativeInt = Field(0, description="Seed of the arrivals and lengths.")
    max_batch: PositiveInt = Field(256, description="Most requests running at once on a replica (vLLM's max_num_seqs).")
    prefill_chunk_tokens: PositiveInt | None = Field(2048, description="Tokens an iteration processes at most, decode tokens first, "
                                                     "prompt chunks after (vLLM's max_num_batched_tokens); None: prompts prefilled "
                                                     "whole in iterations of their own.")
    arrivals_s: tuple[float, ...] | None = Field(None, description="Arrival times in seconds (a trace) instead of Poisson arrivals.")
    concurrency: PositiveInt | None = Field(None, description="A closed loop instead: this many clients over all replicas, each "
                                            "sending its next request when the previous completes (the rate and trace unused).")
    speculation: Speculation | None = Field(None, description="Speculative decoding with a draft model (`costmodel.step.speculative`): "
                                            "each decode iteration is a speculative step yielding its expected tokens.")

    @model_validator(mode="after")
    def _some_load(self) -> ServeConfig:
        if self.rate_per_s is None and self.arrivals_s is None and self.concurrency is None:
            raise ValueError("give the load: rate_per_s (Poisson), arrivals_s (a trace) or concurrency (a closed loop)")
        return self


class ServeResult(BaseModel):
    """What a replica's users see under the load, and what the replica holds."""

    model_config = ConfigDict(frozen=True)

    completed: int = Field(description="Requests served (one replica's share).")
    duration_s: float = Field(description="From the first arrival to the last completion.")
    requests_per_s: float = Field(description="Completed requests per second over all replicas: an open loop's in its steady "
                                  "part (`_steady_window`), a closed loop's over the whole run.")
    output_tokens_per_s: float = Field(description="Generated tokens per second over all replicas, counted as `requests_per_s`.")
    service_rate_per_s: float = Field(description="Completed requests per second over all replicas between the completions of "
                                      "the first and the last tenth of the requests: a run given more work than it serves "
                                      "(a burst of many batches' worth) reads its sustained rate, warm-up and tail left out.")
    ttft_p50_s: float = Field(description="Median time to first token (arrival to the prompt's first token).")
    ttft_p99_s: float = Field(description="99th percentile time to first token.")
    tpot_p50_s: float = Field(description="Median time per output token after the first.")
    tpot_p99_s: float = Field(description="99th percentile time per output token after the first.")
    latency_p50_s: float = Field(description="Median time from arrival to the last token.")
    mean_batch: float = Field(description="Requests decoding per iteration, on average over iterations.")
    iterations: int = Field(description="Scheduler iterations run.")
    kv_blocks: int = Field(description="KV-cache blocks a replica's memory holds beside the weights and temporaries.")
    kv_blocks_mean_in_use: float = Field(description="Blocks in use, averaged over time.")
    kv_blocks_max_in_use: int = Field(description="Most blocks in use at once.")
    preemptions: int = Field(description="Requests preempted for want of blocks (recomputed on readmission).")
    queue_growing: bool = Field(description="The last tenth of requests waited over three times the first tenth and over a second: "
                                            "the rate is beyond what the replica serves.")


class _Request:
    __slots__ = ("arrival_s", "prompt", "output", "prefilled", "generated", "blocks", "first_token_s", "done_s", "credit")

    def __init__(self, arrival_s: float, prompt: int, output: int) -> None:
        self.arrival_s, self.prompt, self.output = arrival_s, prompt, output
        self.prefilled = self.generated = self.blocks = 0  # blocks: KV-cache blocks held
        self.credit = 0.0  # speculative decoding: expected tokens not yet emitted (whole tokens are, each step)
        self.first_token_s = self.done_s = math.nan

    @property
    def to_prefill(self) -> int:
        """Tokens still to run through the model before the next token can be generated (after a
        preemption: the prompt and what was generated, recomputed)."""
        return self.prompt + self.generated - self.prefilled

    @property
    def context(self) -> int:
        return self.prefilled


def kv_block_bytes(model: ModelConfig, train: TrainConfig, layout: Layout) -> float:
    """Bytes one paged KV-cache block takes on one device (every layer's keys and values)."""
    per_token = 2 * model.num_layers * kv_heads_per_device(model, layout.tp) * model.head_dim * kv_element_bytes(train)
    return per_token * train.workload.serving.kv_block_size


def _held_beside_cache(model: ModelConfig, train: TrainConfig, layout: Layout) -> float:
    one_block = train.model_copy(update={"global_batch": 1, "seq_len": train.workload.serving.kv_block_size})
    mem = inference_memory(model, one_block, layout)
    return mem.total_bytes - mem.kv_cache_bytes


def kv_block_capacity(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine, draft: ModelConfig | None = None) -> int:
    """Blocks that fit one device beside the weights and a decode step's temporaries (the draft
    model's too, whose cache takes its share of each block), within the usable memory less the
    runtime reserve, of which the serving stack gives the cache its fraction
    (`costmodel.inputs.serving_stack.ServingStack.kv_free_memory_fraction`)."""
    held = _held_beside_cache(model, train, layout) + (_held_beside_cache(draft, train, layout) if draft else 0.0)
    per_block = kv_block_bytes(model, train, layout) + (kv_block_bytes(draft, train, layout) if draft else 0.0)
    free = (hw.hbm_bytes - hw.memory_reserve_bytes - held) * train.workload.serving.stack.kv_free_memory_fraction
    return max(0, int(free // per_block))


def _bucket(tokens: int) -> int:
    """``tokens`` rounded up to the cost cache's resolution (`_CACHE_BUCKETS_PER_DOUBLING` steps per doubling)."""
    if tokens <= _CACHE_BUCKETS_PER_DOUBLING:
        return tokens
    step = 2 ** (tokens.bit_length() - 1) // _CACHE_BUCKETS_PER_DOUBLING
    return -(-tokens // step) * step


def arrivals(cfg: ServeConfig, replicas: int, rng: random.Random) -> list[float]:
    """One replica's arrival times: its round-robin share of the trace, or a Poisson stream at ``rate / replicas``."""
    n = math.ceil(cfg.requests / replicas)
    if cfg.arrivals_s is not None:
        return sorted(cfg.arrivals_s)[::replicas][:n]
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(cfg.rate_per_s / replicas)
        out.append(t)
    return out


def simulate_serving(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine, cfg: ServeConfig) -> ServeResult:
    """Serve ``cfg``'s requests on ``layout`` (its ``dp`` the replicas, module docstring); refuses a
    layout whose memory holds no request's whole context."""
    block, spec = train.workload.serving.kv_block_size, cfg.speculation
    capacity = kv_block_capacity(model, train, layout, hw, spec.draft if spec else None)
    longest = math.ceil((cfg.input_len.most + cfg.output_len.most) / block)
    if capacity < longest:
        raise InfeasibleError(f"one device holds {capacity} KV blocks beside the weights; the longest request needs {longest}",
                              fix="add tensor parallelism (--tp), or shorten --input-len/--output-len")
    replica = layout.model_copy(update={"dp": 1})

    @lru_cache(maxsize=None)
    def cost_s(decode: int, cached: int, prompt: int) -> float:
        if spec is None or not decode:
            return iteration_s(model, train, replica, hw, decode_sequences=decode, cached_tokens=cached, prompt_tokens=prompt)
        chunk_s = iteration_s(model, train, replica, hw, decode_sequences=0, prompt_tokens=prompt) if prompt else 0.0
        return speculative_step_s(model, spec, train, replica, hw, decode_sequences=decode, cached_tokens=cached) + chunk_s

    rng = random.Random(cfg.seed)
    n = math.ceil(cfg.requests / layout.dp)
    starts = [0.0] * min(n, math.ceil(cfg.concurrency / layout.dp)) if cfg.concurrency else arrivals(cfg, layout.dp, rng)
    pending = deque(_Request(t, cfg.input_len.sample(rng), cfg.output_len.sample(rng)) for t in starts)
    requests = list(pending)

    def follow_up(done: _Request) -> None:  # a closed loop's client sends its next request at once
        if cfg.concurrency and len(requests) < n:
            requests.append(_Request(done.done_s, cfg.input_len.sample(rng), cfg.output_len.sample(rng)))
            pending.append(requests[-1])

    sim = _Scheduler(cfg, block, capacity, lambda d, c, p: cost_s(d, _bucket(c), p), spec.expected_tokens if spec else 1.0,
                     on_done=follow_up, reserve_whole=train.workload.serving.stack.reserves_whole_request)
    while pending or sim.waiting or sim.running:
        if not sim.waiting and not sim.running:
            sim.now_s = max(sim.now_s, pending[0].arrival_s)
        while pending and pending[0].arrival_s <= sim.now_s:
            sim.waiting.append(pending.popleft())
        sim.iterate()
    return _result(requests, sim, layout.dp, capacity, open_loop=cfg.concurrency is None)


class _Scheduler:
    """The scheduler's state and one iteration's choices (module docstring)."""

    def __init__(self, cfg: ServeConfig, block: int, capacity: int, cost_s: Callable[[int, int, int], float],
                 tokens_per_step: float, on_done: Callable[[_Request], None], reserve_whole: bool = False) -> None:
        self.cfg, self.block, self.capacity, self.cost_s, self.tokens_per_step = cfg, block, capacity, cost_s, tokens_per_step
        self.on_done, self.reserve_whole = on_done, reserve_whole
        self.most_per_step = math.ceil(tokens_per_step)
        self.now_s = 0.0
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []
        self.used = self.iterations = self.preemptions = self.max_used = 0
        self.block_seconds = self.decoding_sum = 0.0

    def _need(self, r: _Request, tokens: int) -> int:
        """More blocks ``r`` needs to hold ``tokens`` tokens of context."""
        return max(0, math.ceil(tokens / self.block) - r.blocks)

    def _held(self, r: _Request, tokens: int) -> int:
        """Tokens of context ``r`` holds blocks for once it has ``tokens``: those, or under a whole-request
        reservation its prompt and whole output from admission on (a speculative step past its end caches no more)."""
        return r.prompt + r.output if self.reserve_whole else tokens

    def _grant(self, r: _Request, tokens: int) -> None:
        more = self._need(r, tokens)
        r.blocks += more
        self.used += more

    def _release(self, r: _Request) -> None:
        self.used -= r.blocks
        r.blocks = 0

    def _preempt(self) -> None:
        victim = self.running.pop()
        self._release(victim)
        victim.prefilled = 0
        self.waiting.appendleft(victim)
        self.preemptions += 1

    def iterate(self) -> None:
        decoding = [r for r in self.running if r.to_prefill == 0]
        # Each decoding request's next tokens need room; the latest admitted give theirs up first.
        step = self.most_per_step
        while sum(self._need(r, self._held(r, r.context + step)) for r in decoding) > self.capacity - self.used:
            self._preempt()
            decoding = [r for r in self.running if r.to_prefill == 0]
        for r in decoding:
            self._grant(r, self._held(r, r.context + step))
        budget = (self.cfg.prefill_chunk_tokens - len(decoding)) if self.cfg.prefill_chunk_tokens else math.inf
        chunks = self._chunks(budget)
        if not decoding and not chunks and self.running:  # prompts stuck for want of blocks: free the latest's
            self._preempt()
            return
        if chunks:
            decoding = [] if self.cfg.prefill_chunk_tokens is None else decoding  # a whole-prompt iteration decodes nothing
        cached = sum(r.context for r in decoding)
        step_s = self.cost_s(len(decoding), cached, sum(n for _, n in chunks)) if decoding or chunks else 0.0
        self.block_seconds += self.used * step_s
        self.now_s += step_s
        self.iterations += 1
        self.decoding_sum += len(decoding)
        self.max_used = max(self.max_used, self.used)
        for r, n in chunks:
            r.prefilled += n
            if r.to_prefill == 0 and math.isnan(r.first_token_s):
                r.first_token_s = self.now_s
                r.generated = max(r.generated, 1)
        for r in decoding:
            r.credit += self.tokens_per_step
            emitted = min(int(r.credit), r.output - r.generated)
            r.credit -= int(r.credit)
            r.prefilled += emitted
            r.generated += emitted
        for r in [r for r in self.running if r.generated >= r.output and r.to_prefill == 0]:
            r.done_s = self.now_s
            self.running.remove(r)
            self._release(r)
            self.on_done(r)

    def _chunks(self, budget: float) -> list[tuple[_Request, int]]:
        """(request, prompt tokens) run this iteration: running prompts' next chunks, then newly
        admitted requests while blocks, the batch limit and the token budget allow (whole prompts:
        no budget, and the iteration then decodes nothing, prefill first as vLLM's default)."""
        chunks = []
        for r in [r for r in self.running if r.to_prefill > 0]:
            n = int(min(r.to_prefill, budget))
            if n <= 0 or self._need(r, r.context + n) > self.capacity - self.used:
                break
            self._grant(r, r.context + n)
            chunks.append((r, n))
            budget -= n
        while self.waiting and len(self.running) < self.cfg.max_batch and budget > 0:
            r = self.waiting[0]
            n = int(min(r.to_prefill, budget))
            held = self._held(r, r.context + n)
            if self._need(r, held) > self.capacity - self.used:
                break
            self.waiting.popleft()
            self.running.append(r)
            self._grant(r, held)
            chunks.append((r, n))
            budget -= n
        return chunks


def _steady_window(requests: list[_Request], *, keeping_up: bool) -> tuple[list[_Request], float]:
    """The requests of an open-loop run (arrivals that do not wait for completions) completed in its
    steady part, and its seconds: from the completion of the first tenth of the requests to the last
    arrival, leaving out the warm-up (an empty server filling) and the drain (no new work), as a long
    benchmark run's average all but does. A run too short for that (a request's latency near its
    arrivals' span): the arrivals' span where the server kept up with them (``keeping_up``: it served
    what arrived), else the whole run, first arrival to last completion (a burst's too).

    >>> burst = [_Request(0.0, 8, 4) for _ in range(2)]
    >>> burst[0].done_s, burst[1].done_s = 30.0, 40.0
    >>> len(_steady_window(burst, keeping_up=True)[0]), _steady_window(burst, keeping_up=True)[1]
    (2, 40.0)
    """
    arrivals, completions = sorted(r.arrival_s for r in requests), sorted(r.done_s for r in requests)
    begin, finish = completions[len(requests) // 10], arrivals[-1]
    steady = [r for r in requests if begin < r.done_s <= finish]
    if finish > begin and len(steady) >= len(requests) // 2:
        return steady, finish - begin
    if keeping_up and arrivals[-1] > arrivals[0]:
        return requests, arrivals[-1] - arrivals[0]
    return requests, completions[-1] - arrivals[0]


def _service_rate_per_s(requests: list[_Request]) -> float:
    """Completions per second between the completions of the first and the last tenth of the requests
    (`ServeResult.service_rate_per_s`); where they coincide, over the whole run."""
    completions, tenth = sorted(r.done_s for r in requests), len(requests) // 10
    begin, end = completions[tenth], completions[-1 - tenth]
    inside = sum(begin < t <= end for t in completions)
    if end > begin and inside:
        return inside / (end - begin)
    return len(requests) / (completions[-1] - min(r.arrival_s for r in requests))


def _result(requests: list[_Request], sim: _Scheduler, replicas: int, capacity: int, *, open_loop: bool) -> ServeResult:
    ttft = np.array([r.first_token_s - r.arrival_s for r in requests])
    tpot = np.array([(r.done_s - r.first_token_s) / (r.output - 1) for r in requests if r.output > 1] or [0.0])
    latency = np.array([r.done_s - r.arrival_s for r in requests])
    start, end = min(r.arrival_s for r in requests), max(r.done_s for r in requests)
    tenth = max(1, len(requests) // 10)
    first, last = float(ttft[:tenth].mean()), float(ttft[-tenth:].mean())
    duration = end - start
    growing = last > 3 * first and last > 1.0
    # A closed loop's clients are busy from the start to their last request: its whole run is steady.
    served, window_s = _steady_window(requests, keeping_up=not growing) if open_loop else (requests, duration)
    return ServeResult(
        completed=len(requests), duration_s=duration, requests_per_s=replicas * len(served) / window_s,
        output_tokens_per_s=replicas * sum(r.output for r in served) / window_s,
        service_rate_per_s=replicas * _service_rate_per_s(requests),
        ttft_p50_s=float(np.percentile(ttft, 50)), ttft_p99_s=float(np.percentile(ttft, 99)),
        tpot_p50_s=float(np.percentile(tpot, 50)), tpot_p99_s=float(np.percentile(tpot, 99)),
        latency_p50_s=float(np.percentile(latency, 50)), mean_batch=sim.decoding_sum / max(1, sim.iterations),
        iterations=sim.iterations, kv_blocks=capacity, kv_blocks_mean_in_use=sim.block_seconds / max(sim.now_s - start, 1e-12),
        kv_blocks_max_in_use=sim.max_used, preemptions=sim.preemptions, queue_growing=growing)
