"""The scheduling loop of one rank: continuous batching and the overlap scheduler (SGLang 0.5.23's
``Scheduler.event_loop_overlap`` / ``event_loop_normal``, managers/scheduler.py).

Each ``step()``:

1. **schedule** (``get_next_batch_to_run``): waiting requests that fit under ``max_running``
   (SGLang's ``--max-running-requests``) form a prefill (extend) batch and join the running batch;
   otherwise the running requests form the next decode batch;
2. **launch** it (``Decoder.run_batch``: the hooked cycle);
3. **process a result** (``process_batch_result``): commit each request's tokens, count its verify,
   stream, finish requests that reached ``max_new_tokens`` and drop them from the running batch.

With ``overlap`` on (SGLang's default) step 3 processes the *previous* batch's result, after the next
batch was launched: the result queue is one deep, as SGLang's ``result_queue``. So when batch N+1 is
scheduled, result N is not yet known, and SGLang's rule decides who runs in N+1 (scheduler.py
4444-4457 ``_reqs_finishing_inflight``): a request of batch N is left out only when
``len(output_ids) + 1 >= max_new_tokens`` (schedule_batch.py 1661-1663). A request that result N
finishes by accepting >= 2 tokens therefore runs one more full draft/verify/extend cycle in N+1, whose
result is skipped for it (batch_result_processor.py 819-832: a finished request's verify is not
counted): ``Req.inflight_cycles``. With overlap off (``--disable-overlap-schedule``) every result is
processed before the next batch is scheduled: no such cycle.

On CPU the launch computes the whole cycle before it returns (there is no device queue to run ahead
on), so the structure -- what is scheduled before which result is read -- is SGLang's, while the
host-side processing is not hidden behind the compute. The decision state a cycle needs (last token,
first draft, caches) lives on the request and is advanced by the cycle itself ("device side"), as
SGLang's future tokens are; ``output_ids`` and the counters only by processing.
"""

from __future__ import annotations

import collections

from spec_decode.engines.embedded.batch import ForwardMode, Req, ScheduleBatch


class BatchLoop:
    """``on_chunk(req, ids)``: tokens committed by a result that did not finish the request (a stream's
    event); ``on_finish(req)``: once, when the request's output is complete; ``on_decode(batch,
    counted)``: after a decode batch's result, with ``counted`` = [(req, tokens, accepted drafts)]
    for its requests whose verify counted (the rank's counters and decode log)."""

    def __init__(self, decoder, max_running: int, overlap: bool, on_chunk=None, on_finish=None, on_decode=None):
        if max_running < 1:
            raise ValueError(f"--max-running-requests must be >= 1 (got {max_running})")
        self.decoder = decoder
        self.release = getattr(decoder, "release", None)  # frees a finished request's static slot
        cap = getattr(decoder, "max_batch", None)
        self.max_running = min(max_running, cap) if cap else max_running
        self.overlap = overlap
        self.on_chunk, self.on_finish, self.on_decode = on_chunk, on_finish, on_decode
        self.waiting: collections.deque[Req] = collections.deque()
        self.running: list[Req] = []
        self.pending: tuple[ScheduleBatch, object] | None = None  # the result queue, one deep
        self.forward_ct = 0

    def add(self, req: Req) -> None:
        self.waiting.append(req)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running or self.pending)

    def run_until_idle(self) -> None:
        while self.busy:
            self.step()

    def step(self) -> None:
        batch = self.next_batch()
        result = self.decoder.run_batch(batch) if batch is not None else None
        if batch is not None:
            self.forward_ct += 1
            result.copy_to_cpu()  # SGLang's run_batch does the same: the host reads wait for this batch only
        if self.overlap:
            last, self.pending = self.pending, (batch.copy(), result) if batch is not None else None
            if last is not None:
                self.process(*last)
        elif batch is not None:
            self.process(batch, result)

    def next_batch(self) -> ScheduleBatch | None:
        room = self.max_running - len(self.running)
        if self.waiting and room > 0:  # prefill first, as SGLang's get_new_batch_prefill
            new = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
            self.running.extend(new)
            return ScheduleBatch(new, ForwardMode.EXTEND)
        queued = set(self.pending[0].reqs) if self.pending is not None else set()
        reqs = [
            r
            for r in self.running
            if not (r in queued and r.next_output_finishes_by_length()) and self.decoder.room_for_cycle(r)
        ]
        return ScheduleBatch(reqs, ForwardMode.DECODE) if reqs else None

    def process(self, batch: ScheduleBatch, result) -> None:
        if batch.forward_mode.is_extend():
            for req, ids in zip(batch.reqs, result.host_ids()):
                self._commit(req, ids)
            return
        counted, host_ids = [], result.host_ids()
        for i, req in enumerate(batch.reqs):
            if req.finished:  # the in-flight cycle after its finishing result: not counted
                req.inflight_cycles += 1
                self._release_if_done(req)
                continue
            ids = host_ids[i]
            a = None
            if result.accepted_drafts is not None:
                a = result.accepted_drafts[i]
                req.spec_verify_ct += 1
                req.spec_num_correct_drafts += a
                req.histogram[a] += 1
            req.decode_steps += 1
            counted.append((req, len(ids), a))
            self._commit(req, ids)
        if self.on_decode is not None:
            self.on_decode(batch, counted)

    def _commit(self, req: Req, ids: list[int]) -> None:
        req.output_ids.extend(ids)
        if len(req.output_ids) >= req.max_new_tokens:
            del req.output_ids[req.max_new_tokens :]
            req.finished = True
            self.running.remove(req)
            self._release_if_done(req)
            if self.on_finish is not None:
                self.on_finish(req)
        elif self.on_chunk is not None:
            self.on_chunk(req, ids)

    def _release_if_done(self, req: Req) -> None:
        """A finished request's slot is freed once no launched cycle holds it: at once, or after its
        in-flight cycle (overlap: the batch already launched when its finishing result is processed)."""
        if self.release is not None and not (self.pending is not None and req in self.pending[0].reqs):
            self.release(req)
