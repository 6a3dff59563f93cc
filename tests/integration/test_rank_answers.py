"""Rank 0's answers to the front: a step's answers leave as one message (scheduler.Scheduler._flush_outbox),
as SGLang's scheduler sends a step's outputs in one BatchTokenIDOut; each request's chunks come before its
final answer, and nothing waits for the batch to end. The real Scheduler over the tiny target, on a real
pipe, read the way the front's dispatcher reads it (ranks.RankGroup._dispatch)."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

from spec_decode.engines.embedded.decoding import Decoder
from spec_decode.engines.embedded.model import load_target
from spec_decode.engines.embedded.scheduler import Scheduler

TARGET = Path(__file__).resolve().parents[2] / "models" / "tiny" / "target"


def test_a_steps_answers_reach_the_front_as_one_message():
    front, rank_end = multiprocessing.Pipe()
    sched = Scheduler(Decoder(load_target(TARGET), None, 0), 0, 10, rank_end, max_running=4)
    for i in range(4):  # four streamed requests of 12 tokens, queued before the loop starts: one batch
        front.send(("generate", f"r{i}", [65 + i] * 5, 12, True))
    serving = threading.Thread(target=sched.serve, daemon=True)
    serving.start()
    messages, answers, done = [], [], set()
    while len(done) < 4:
        assert front.poll(60), "no answer from the rank in 60 s"
        msg = front.recv()
        messages.append(msg)
        tag, rid, payload = msg
        for a in payload if tag == "batch" else [msg]:
            answers.append(a)
            if a[0] == "ok":
                done.add(a[1])
    front.send(("stop",))
    serving.join(30)
    assert not serving.is_alive()
    for i in range(4):  # every request: chunks in order, then its final answer with all of its tokens
        mine = [a for a in answers if a[1] == f"r{i}"]
        assert [a[0] for a in mine] == ["chunk"] * (len(mine) - 1) + ["ok"]
        streamed = [t for a in mine[:-1] for t in a[2]]
        assert streamed == mine[-1][2]["generation"]["output_ids"][: len(streamed)] and len(streamed) == 11
    # one message a step: the four requests prefill and decode together, so each of their steps answers
    # all four in one message (before: a message per answer, 48 here)
    assert len(answers) == 48 and len(messages) <= sched.loop.forward_ct < len(answers)
    assert sum(m[0] == "batch" and len(m[2]) == 4 for m in messages) >= 10
