"""Runtime.evaluate (issue 51): a dataset as an experiment in the runtime's store, graded, the
report returned as Python objects."""

from pathlib import Path

import pytest

from fabric_runtime import Runtime, StartError

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = REPO / "tests" / "fixtures" / "catalogue"
ROUTES, PACKS, STUB = CATALOGUE / "routes", CATALOGUE / "prompt-packs", CATALOGUE / "stub"


def runtime(tmp_path, **kwargs):
    return Runtime(ROUTES, PACKS, stub_dir=STUB, llm_stub=True, store=f"sqlite://{tmp_path / 'evals.db'}", **kwargs)


DATASET = {
    "name": "triage",
    "cases": [
        {"id": "right", "route_id": "support-triage", "goal": {"ticket": "charged twice"}, "expected": {"stages": {"intake": {"category": "billing"}}}},
        {"id": "wrong", "route_id": "support-triage", "goal": {"ticket": "app crashes"}, "expected": {"stages": {"intake": {"category": "technical"}}}},
    ],
}


def test_a_dataset_as_a_dict_is_run_graded_and_reported(tmp_path):
    report = runtime(tmp_path).evaluate(DATASET, [{"stage_equals": {"stage": "intake", "path": "category"}}, {"contains": {"text": "refunded"}}], repeat=2)
    assert (report["cases_passed"], report["cases_total"], report["runs"]) == (1, 2, 4)
    assert [(e["name"], e["passed"], e["graded"]) for e in report["evaluators"]] == [("stage_equals:intake.category", 2, 4), ("contains", 4, 4)]
    failing = report["cases"][0]
    assert failing["case_id"] == "wrong" and not failing["passed"] and len(failing["runs"]) == 2
    assert "expected \"technical\"" in failing["runs"][0]["verdicts"][0]["reason"]


def test_a_dataset_file_of_pydantic_evals_runs(tmp_path):
    path = tmp_path / "pydantic.yaml"
    path.write_text(
        "cases:\n- name: a\n  inputs: {ticket: hi}\n  metadata: {route_id: support-triage}\n"
        "  expected_output: You were charged twice; the duplicate charge has been refunded.\nevaluators:\n- EqualsExpected\n"
    )
    report = runtime(tmp_path).evaluate(path)
    assert report["pass_rate"] == 1.0


def test_a_bad_dataset_or_no_store_is_refused_before_anything_runs(tmp_path):
    bad = {"cases": [{"id": "x", "route_id": "no-such-route", "goal": {}}]}
    with pytest.raises(StartError) as e:
        runtime(tmp_path).evaluate(bad)
    assert e.value.reason_class == "invalid_dataset"
    assert "dataset.json:1:" in str(e.value) and "unknown route `no-such-route`" in str(e.value)
    with pytest.raises(StartError) as e:
        Runtime(ROUTES, PACKS, stub_dir=STUB, llm_stub=True).evaluate(DATASET)
    assert e.value.reason_class == "no_store"
