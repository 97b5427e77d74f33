"""``Runtime.stream``: a run's events as they happen, deltas included, the iterator ending after
the run's last event; closing it early cancels the run instead of leaving it running."""

import asyncio
import gc
import time
from pathlib import Path

import pytest

from conftest import ticking, ticking_async
from fabric_runtime import CancelToken, Runtime, StartError

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = REPO / "tests" / "fixtures" / "catalogue"
# Two synthesis stages with no output schema: each one's output is its text as streamed.
STREAMING = REPO / "tests" / "fixtures" / "streaming"
ENDS = {"run.completed", "run.failed", "run.cancelled", "run.awaiting_input"}


def runtime(latency_ms=600):
    return Runtime(
        [str(CATALOGUE / "routes"), str(STREAMING / "routes")],
        str(CATALOGUE / "prompt-packs"),
        stub_dir=str(STREAMING / "stub"),
        llm_stub=True,
        llm_stub_latency_ms=latency_ms,
    )


def texts(events, stage):
    return [e["text"] for e in events if e["type"] == "run.llm.delta" and e["stage_id"] == stage]


def test_deltas_arrive_as_the_run_goes_and_join_into_each_stage_s_output():
    stream = runtime().stream("two-streams", {"ticket": "charged twice"})
    seen = []  # (event, when it arrived)
    for event in stream:
        seen.append((event, time.monotonic()))
    events = [e for e, _ in seen]
    assert events[-1]["type"] == "run.completed"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    # The first delta came well before the end: the events arrive as they happen.
    first_delta = next(t for e, t in seen if e["type"] == "run.llm.delta")
    assert seen[-1][1] - first_delta > 0.5, "the run's end came more than a stub call after its first delta"
    assert len(texts(events, "draft")) >= 2 and len(texts(events, "answer")) >= 2
    outputs = {e["stage_id"]: e["output"] for e in events if e["type"] == "run.stage.completed"}
    assert "".join(texts(events, "draft")) == outputs["draft"]
    assert "".join(texts(events, "answer")) == outputs["answer"] == events[-1]["output"]
    assert stream.result["status"] == "completed" and stream.result["output"] == outputs["answer"]
    assert "events" not in stream.result
    with pytest.raises(StopIteration):
        next(stream)


def test_breaking_out_early_cancels_the_run_and_does_not_hang():
    token = CancelToken()
    started = time.monotonic()
    for event in runtime(latency_ms=6000).stream("two-streams", {"ticket": "x"}, cancel=token):
        if event["type"] == "run.llm.delta":
            break
    gc.collect()
    # The stream dropped, the run was cancelled through its token: another run on it ends at once.
    events = list(runtime(latency_ms=6000).stream("two-streams", {"ticket": "x"}, cancel=token))
    assert events[-1]["type"] == "run.cancelled" and events[-1]["reason"] == "the stream was closed", events[-1]
    assert time.monotonic() - started < 6, "no wait for the 6 s calls"
    # The run was cancelled through its token: a stream kept open sees it end at once.
    stream = runtime(latency_ms=6000).stream("two-streams", {"ticket": "x"})
    for event in stream:
        if event["type"] == "run.llm.started":
            stream.close()
    assert event["type"] == "run.cancelled" and event["reason"] == "the stream was closed", event
    assert stream.result["status"] == "cancelled"
    assert time.monotonic() - started < 6


def test_a_route_that_cannot_run_raises_at_once():
    with pytest.raises(StartError) as e:
        runtime().stream("no-such-route", {})
    assert e.value.reason_class == "unknown_route"
    with pytest.raises(StartError):
        runtime().stream("two-streams", [1, 2])


def test_the_gil_is_released_while_waiting():
    with ticking(0.01) as ticks:
        kinds = [e["type"] for e in runtime(latency_ms=300).stream("two-streams", {"ticket": "x"})]
    assert kinds[-1] == "run.completed"
    assert len(ticks) > 20, "another thread ran while the stream waited"


def test_stream_async_yields_the_same_events_without_blocking_the_loop():
    async def main():
        async with ticking_async(0.01) as ticks:
            events = [e async for e in runtime(latency_ms=300).stream_async("two-streams", {"ticket": "x"})]
        # Leaving early cancels the run.
        async for e in runtime(latency_ms=6000).stream_async("two-streams", {"ticket": "x"}):
            if e["type"] == "run.llm.delta":
                break
        return events, len(ticks)

    started = time.monotonic()
    events, ticks = asyncio.run(main())
    assert events[-1]["type"] == "run.completed" and ticks > 20
    assert "".join(texts(events, "answer")) == events[-1]["output"]
    assert time.monotonic() - started < 6
