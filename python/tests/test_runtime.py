"""The Python package over the runtime: runs, tools, errors, validation, and that a run neither
holds the GIL nor blocks an event loop. Run from anywhere: the tests' copy of the shipped
catalogue (tests/fixtures/catalogue) is used, not routes/, where users add their own routes."""

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from conftest import ticking, ticking_async
from fabric_runtime import ConfigError, FabricError, Runtime, StartError, ValidationError, validate

REPO = Path(__file__).resolve().parents[2]
# The shipped routes, packs and stub scripts as copied for the tests (kept equal to the shipped
# files by the e2e test catalogue::the_fixture_catalogue_is_the_shipped_one).
CATALOGUE = REPO / "tests" / "fixtures" / "catalogue"
ROUTES, PACKS, STUB = CATALOGUE / "routes", CATALOGUE / "prompt-packs", CATALOGUE / "stub"


@pytest.fixture(autouse=True)
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def runtime(**kwargs):
    return Runtime(str(ROUTES), str(PACKS), stub_dir=str(STUB), llm_stub=True, **kwargs)


def test_a_staged_route_runs_offline_with_its_events():
    result = runtime().run("support-triage", {"ticket": "I was charged twice"})
    assert result["status"] == "completed", result
    assert "refund" in result["output"]
    seqs = [e["seq"] for e in result["events"]]
    assert seqs == list(range(1, len(seqs) + 1))
    assert (result["events"][0]["type"], result["events"][-1]["type"]) == ("run.started", "run.completed")


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_python_tool_serves_the_decision_loop(kind):
    calls = []

    def add(a, b):
        calls.append((a, b))
        return {"sum": a + b}

    async def add_async(a, b):
        await asyncio.sleep(0)
        return add(a, b)

    result = runtime(tools={"add": add if kind == "sync" else add_async}).run("support-agent", {"question": "What is 2 + 3?"})
    assert result["status"] == "completed", result
    assert calls == [(2, 3), (5, 7)]
    assert result["output"] == "12"


def test_a_failing_tool_becomes_a_note_the_model_sees():
    def add(a, b):
        raise ValueError("no adding today")

    result = runtime(tools={"add": add}).run("support-agent", {"question": "What is 2 + 3?"})
    assert any("no adding today" in n and "tool_failed" in n for n in result["notes"]), result["notes"]


def test_a_python_tool_gets_only_arguments_its_input_schema_accepts(tmp_path):
    # A model that calls `add` with a string: the runtime refuses it before the tool sees it,
    # as it does for a Rust tool, and the model is told.
    for f in STUB.iterdir():
        (tmp_path / f.name).write_text(f.read_text())
    (tmp_path / "support-agent.yaml").write_text(
        "stages:\n  decide:\n    - 'CALL add {\"a\":\"two\",\"b\":3}'\n    - 'DONE no'\n"
    )
    calls = []
    rt = Runtime(str(ROUTES), str(PACKS), stub_dir=str(tmp_path), llm_stub=True, tools={"add": lambda **kw: calls.append(kw)})
    result = rt.run("support-agent", {"question": "?"})
    assert calls == []
    assert any("invalid_tool_arguments" in n for n in result["notes"]), result["notes"]


def test_a_route_without_its_tool_cannot_start():
    with pytest.raises(StartError) as e:
        runtime().run("support-agent", {"question": "?"})
    assert e.value.reason_class == "tool_not_registered"


def test_refusals_are_fabric_errors_with_a_reason_class():
    with pytest.raises(StartError) as e:
        runtime().run("no-such-route", {})
    assert e.value.reason_class == "unknown_route" and isinstance(e.value, FabricError)
    with pytest.raises(StartError) as e:
        runtime().run("support-triage", ["not", "a", "dict"])
    assert e.value.reason_class == "invalid_goal"
    with pytest.raises(ConfigError) as e:
        runtime(llm_stub_latency_ms="soon")
    assert "FABRIC_LLM_STUB_LATENCY_MS" in str(e.value) and e.value.reason_class == "config"
    with pytest.raises(ConfigError):
        runtime(tools={"add": 42})
    with pytest.raises(ConfigError) as e:
        runtime(llm_stubb=True)
    assert "llm_stubb" in str(e.value)
    for goal in ({"s": {1, 2}}, {"x": float("nan")}, {"n": 2**64 + 1}):
        with pytest.raises(StartError) as e:
            runtime().run("support-triage", goal)
        assert e.value.reason_class == "invalid_goal", goal


def test_validate_is_what_a_stage_does_with_a_reply():
    envelope = {"type": "object", "properties": {"text": {"type": "string"}}}
    assert validate(envelope, '{"text": "hi", "extra": 1}') == "hi"
    counted = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert validate(counted, '{"n": "7"}') == '{"n":7}'
    with pytest.raises(ValidationError) as e:
        validate(counted, '{"n": "seven"}')
    assert e.value.reason_class == "schema_validation"
    with pytest.raises(ValidationError) as e:
        validate(counted, "not json")
    assert e.value.reason_class == "invalid_json"


def test_a_run_releases_the_gil():
    rt = runtime(llm_stub_latency_ms=100)
    with ticking() as ticks:
        before = len(ticks)
        rt.run("support-triage", {"ticket": "x"})
        during = len(ticks) - before
    assert during > 10, during


def test_run_async_does_not_block_the_event_loop():
    rt = runtime(llm_stub_latency_ms=100)

    async def main():
        async with ticking_async() as ticks:
            results = await asyncio.gather(*(rt.run_async("support-triage", {"ticket": str(k)}) for k in range(3)))
        return len(ticks), results

    ticks, results = asyncio.run(main())
    assert all(r["status"] == "completed" for r in results)
    assert ticks > 10, ticks


def test_settings_and_the_environment_are_those_of_fabric(monkeypatch):
    monkeypatch.setenv("FABRIC_FLEET", "agent-runtime-custom")
    rt = runtime()
    with pytest.raises(StartError) as e:
        rt.run("support-triage", {"ticket": "x"})
    assert e.value.reason_class == "wrong_fleet"
    assert "support-triage" in runtime(fleet="agent-runtime-shared").routes()


def test_ctrl_c_interrupts_a_run():
    import signal

    rt = runtime(llm_stub_latency_ms=5000)
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        rt.run("support-triage", {"ticket": "x"})
    # Interrupted at once, not after the run's 15 s of model calls.
    assert time.monotonic() - started < 10


def test_cancelling_run_async_interrupts_the_run():
    rt = runtime(llm_stub_latency_ms=5000)

    async def main():
        started = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(rt.run_async("support-triage", {"ticket": "x"}), 0.3)
        return time.monotonic() - started

    # asyncio.run waits for the worker thread: it ends with the run, interrupted, not after 15 s.
    started = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - started < 10


def test_a_cancel_token_cancels_the_run_with_its_reason():
    from fabric_runtime import CancelToken

    rt = runtime(llm_stub_latency_ms=5000)
    token = CancelToken()
    timer = threading.Timer(0.3, lambda: token.cancel("the user left"))
    timer.start()
    started = time.monotonic()
    result = rt.run("support-triage", {"ticket": "x"}, cancel=token)
    # Ended at once (the model call in flight aborted), not after the run's 15 s of calls.
    assert time.monotonic() - started < 10
    assert result["status"] == "cancelled", result
    assert result["error"]["reason_class"] == "cancelled"
    assert result["error"]["message"] == "the user left"
    last = result["events"][-1]
    assert (last["type"], last["reason"]) == ("run.cancelled", "the user left")


def test_a_python_tool_that_takes_too_long_times_out_and_the_loop_goes_on():
    done = threading.Event()

    def slow(a, b):
        done.wait(30)  # released at the end of the test: the abandoned call then returns
        return {"sum": a + b}

    try:
        result = runtime(tools={"add": slow}, tool_timeout_ms=100).run("support-agent", {"question": "What is 2 + 3?"})
    finally:
        done.set()
    assert result["status"] == "completed", result
    timeouts = [n for n in result["notes"] if n.startswith("add: error: tool_timeout: tool `add`: no result within 100 ms")]
    assert timeouts, result["notes"]
    assert [e["reason_class"] for e in result["events"] if e["type"] == "run.tool.failed"] == ["tool_timeout"] * len(timeouts)


def test_a_bad_tool_timeout_is_refused():
    with pytest.raises(ConfigError, match="FABRIC_TOOL_TIMEOUT_MS"):
        runtime(tool_timeout_ms=0)


def test_a_runtime_dropped_while_its_tool_runs_does_not_hang(tmp_path):
    import gc
    import signal

    def slow(a, b):
        time.sleep(2)
        return {"sum": a + b}

    rt = runtime(tools={"add": slow})
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        rt.run("support-agent", {"question": "What is 2 + 3?"})
    del rt
    gc.collect()  # returns: the tool's thread is not waited for with the GIL held
    time.sleep(2.5)  # the abandoned tool finishes in the background


def test_paths_may_be_path_objects():
    rt = Runtime(ROUTES, PACKS, stub_dir=STUB, llm_stub=True)
    assert "support-triage" in rt.routes()


def test_the_catalogue_version_names_the_files(tmp_path):
    import shutil

    rt = Runtime(ROUTES, PACKS, stub_dir=STUB, llm_stub=True)
    version = rt.catalogue_version
    assert len(version) == 64 and all(c in "0123456789abcdef" for c in version)
    # The same files elsewhere: the same version; a changed prompt: another.
    routes, packs = tmp_path / "routes", tmp_path / "packs"
    shutil.copytree(ROUTES, routes)
    shutil.copytree(PACKS, packs)
    assert Runtime(routes, packs, stub_dir=STUB, llm_stub=True).catalogue_version == version
    pack = next(packs.glob("*.yaml"))
    pack.write_text(pack.read_text() + "\n# changed\n")
    assert Runtime(routes, packs, stub_dir=STUB, llm_stub=True).catalogue_version != version


def team_dirs(tmp_path):
    """A team's catalogue (one route on the shipped `default` profile) and pack directory."""
    team, packs = tmp_path / "team", tmp_path / "team-packs"
    team.mkdir()
    packs.mkdir()
    (team / "faq.yaml").write_text(
        "capabilities:\n  faq_answer:\n    output_schema: {type: object, properties: {text: {type: string}}, required: [text]}\n"
        "workflows:\n  team-faq:\n    stages:\n      - {id: answer, llm_role: synthesis, capability: faq_answer}\n"
        "routes:\n  team-faq: {model_profile: default, prompt_pack: team, workflow: team-faq}\n"
    )
    (packs / "team.yaml").write_text("host: You answer from the team's FAQ.\n")
    return team, packs


def test_catalogues_are_layered_from_a_list_or_an_a_colon_b_string(tmp_path):
    team, packs = team_dirs(tmp_path)
    layers = [
        ([REPO / "routes", team], (REPO / "prompt-packs", str(packs))),
        (f"{REPO / 'routes'}:{team}", f"{REPO / 'prompt-packs'}:{packs}"),
    ]
    for catalogue, prompt_packs in layers:
        rt = Runtime(catalogue, prompt_packs, stub_dir=str(REPO / "stub"), llm_stub=True)
        assert {"team-faq", "support-triage"} <= set(rt.routes()), rt.routes()
        assert rt.run("team-faq", {"question": "VPN?"})["status"] == "completed"
    with pytest.raises(ConfigError, match="is empty"):
        Runtime(f"{REPO / 'routes'}:", llm_stub=True)
    with pytest.raises(ConfigError, match="each item must be a path"):
        Runtime([REPO / "routes", 42], llm_stub=True)


def test_a_missing_directory_is_refused_when_the_runtime_is_built(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError) as e:
        Runtime(str(missing), str(REPO / "prompt-packs"), llm_stub=True)
    assert str(e.value) == f"catalogue directory `{missing}` does not exist (the `catalogue` argument of Runtime)"
    assert e.value.reason_class == "config"
    with pytest.raises(ConfigError) as e:
        Runtime(REPO / "routes", [REPO / "prompt-packs", missing], llm_stub=True)
    assert str(e.value) == f"prompt pack directory `{missing}` does not exist (the `prompt_packs` argument of Runtime)"


def test_an_idempotency_key_runs_once_per_store_across_runtimes(tmp_path):
    store = f"sqlite://{tmp_path / 'runs.db'}"
    first = runtime(store=store).run("support-triage", {"ticket": "charged twice"}, idempotency_key="ticket-7")
    assert first["status"] == "completed", first
    assert first["idempotent_replayed"] is False
    # Another Runtime on the same store (another process would do the same): nothing runs again.
    again = runtime(store=store).run("support-triage", {"ticket": "charged twice"}, idempotency_key="ticket-7")
    assert again["idempotent_replayed"] is True
    assert (again["run_id"], again["status"], again["output"]) == (first["run_id"], "completed", first["output"])
    assert [e["type"] for e in again["events"]] == [e["type"] for e in first["events"]]
    with pytest.raises(StartError) as e:
        runtime(store=store).run("support-triage", {"ticket": "another"}, idempotency_key="ticket-7")
    assert e.value.reason_class == "idempotency_key_reused"
    assert first["run_id"] in str(e.value)
    other = runtime(store=store).run("support-triage", {"ticket": "charged twice"}, idempotency_key="ticket-8")
    assert other["run_id"] != first["run_id"]


def test_an_idempotency_key_needs_a_store_and_a_valid_key(tmp_path):
    with pytest.raises(StartError) as e:
        runtime().run("support-triage", {"ticket": "x"}, idempotency_key="k")
    assert e.value.reason_class == "no_store"
    with pytest.raises(StartError) as e:
        runtime(store=f"sqlite://{tmp_path / 'r.db'}").run("support-triage", {"ticket": "x"}, idempotency_key="has space")
    assert e.value.reason_class == "invalid_idempotency_key"
    assert "has space" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        Runtime(str(ROUTES), str(PACKS), store="postgres://u:Pw8SECRET@127.0.0.1:1/db", llm_stub=True)
    assert "Pw8SECRET" not in str(e.value)


def test_schedules_are_created_and_listed_on_a_store_and_refused_with_why(tmp_path):
    store = f"sqlite://{tmp_path / 'runs.db'}"
    rt = runtime(store=store)
    made = rt.create_schedule("support-triage", {"ticket": "nightly"}, "30 7 * * MON-FRI", timezone="Europe/Berlin", catchup="all", max_catchup_runs=3)
    assert made["id"].startswith("sch_")
    assert made["timezone"] == "Europe/Berlin" and made["max_catchup_runs"] == 3 and len(made["next_fires"]) == 3
    # Another Runtime on the same store sees it (as `fabric serve` would, which fires it).
    listed = runtime(store=store).schedules()
    assert [s["id"] for s in listed] == [made["id"]]
    assert runtime(store=store).schedule_fires(made["id"]) == []
    with pytest.raises(StartError) as e:
        rt.create_schedule("support-triage", {"ticket": "x"}, "0 0 31 2 *")
    assert e.value.reason_class == "invalid_schedule" and "never fires" in str(e.value)
    with pytest.raises(StartError) as e:
        rt.create_schedule("support-triage", {"ticket": "x"}, "* * * * *", timezone="Mars/Olympus")
    assert "IANA" in str(e.value)
    with pytest.raises(StartError) as e:
        runtime().schedules()
    assert e.value.reason_class == "no_store"
