//! Datasets of other tools (issue 51): one written by the `pydantic_evals` package (PyPI, in a
//! venv) runs, one exported loads in it; LangSmith's examples JSON; a dataset harvested from
//! recorded runs, in every format.

use std::path::Path;

use serde_json::Value;

use crate::support::{fabric_cli, python_venv, run_python};

const STUB: [(&str, &str); 1] = [("FABRIC_LLM_STUB", "1")];

async fn fabric(args: &[&str]) -> (Option<i32>, String, String) {
    let env: Vec<(&str, String)> = STUB.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
    let out = fabric_cli(args, &env).await;
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn pydantic_evals() -> Option<std::path::PathBuf> {
    let why = "eval_datasets::pydantic_evals_datasets_round_trip reads and writes pydantic_evals' datasets with the package itself";
    python_venv("eval-pydantic", "pydantic-evals==2.62.0", "import pydantic_evals", why)
}

const WRITE: &str = r#"import sys
from pydantic_evals import Case, Dataset
from pydantic_evals.evaluators import Contains, EqualsExpected, MaxDuration
answer = 'You were charged twice; the duplicate charge has been refunded.'
Dataset[dict, str, dict](
    name='from-pydantic',
    cases=[
        Case(name='double-charge', inputs={'ticket': 'I was charged twice'}, expected_output=answer,
             metadata={'route_id': 'support-triage'}, evaluators=[EqualsExpected()]),
        Case(name='crash', inputs={'ticket': 'The app crashes'}, expected_output='Reinstall it.',
             metadata={'route_id': 'support-triage'}, evaluators=[EqualsExpected()]),
    ],
    evaluators=[Contains(value='refunded'), MaxDuration(seconds=5)],
).to_file(sys.stdin.read().strip())
"#;

const READ: &str = r#"import sys
from pydantic_evals import Dataset
ds = Dataset[dict, str, dict].from_file(sys.stdin.read().strip())
print(ds.name, [(c.name, c.inputs, c.metadata['route_id'], c.expected_output) for c in ds.cases])
print(sorted(type(e).__name__ for e in ds.evaluators))
"#;

fn python(python: &Path, dir: &Path, name: &str, script: &str, input: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, script).unwrap();
    let out = run_python(python, &path, input);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn pydantic_evals_datasets_round_trip() {
    let Some(py) = pydantic_evals() else { return };
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("e.db").display());
    // Written by pydantic_evals, run here: its evaluators are ours.
    let written = dir.path().join("pydantic.yaml");
    python(&py, dir.path(), "write.py", WRITE, written.to_str().unwrap());
    let (code, out, err) = fabric(&["eval", "run", written.to_str().unwrap(), "--store", &db, "--format", "json"]).await;
    assert_eq!(code, Some(0), "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["name"], "from-pydantic");
    let evaluators: Vec<(&str, u64, u64)> = report["evaluators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["passed"].as_u64().unwrap(), e["graded"].as_u64().unwrap()))
        .collect();
    assert_eq!(evaluators, [("Contains", 2, 2), ("MaxDuration", 2, 2), ("EqualsExpected", 1, 2)], "the stub answers the refund: {report:#}");
    assert_eq!(report["cases"][0]["case_id"], "crash", "the failing case first");

    // Ours, exported, loads in pydantic_evals (what has no equivalent there said and left out).
    let ours = dir.path().join("ours.yaml");
    std::fs::write(
        &ours,
        "name: triage\nevaluators:\n  - contains: {text: refunded}\n  - duration_max: {ms: 2500}\n  - stage_equals: {stage: intake, path: category}\n\
         cases:\n  - id: a\n    route_id: support-triage\n    goal: {ticket: hi}\n    expected: {output: Refunded.}\n    evaluators: [equals]\n",
    )
    .unwrap();
    let (code, exported, err) = fabric(&["eval", "dataset", "convert", ours.to_str().unwrap(), "--to", "pydantic"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(err, "fabric: warning: evaluator `stage_equals:intake.category` has no pydantic_evals equivalent; left out\n");
    let exported_path = dir.path().join("exported.yaml");
    std::fs::write(&exported_path, &exported).unwrap();
    let read = python(&py, dir.path(), "read.py", READ, exported_path.to_str().unwrap());
    assert_eq!(read, "triage [('a', {'ticket': 'hi'}, 'support-triage', 'Refunded.')]\n['Contains', 'MaxDuration']\n");
    // And back: the same cases and evaluators.
    let (code, out, err) = fabric(&["eval", "dataset", "convert", exported_path.to_str().unwrap(), "--to", "fabric"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("- contains:\n    text: refunded\n") && out.contains("- duration_max:\n    ms: 2500"), "{out}");
}

#[tokio::test]
async fn recorded_runs_become_a_dataset_in_every_format_and_langsmith_examples_run() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("e.db").display());
    for ticket in ["I was charged twice", "Refund please"] {
        let goal = format!("{{\"ticket\": \"{ticket}\"}}");
        let (code, _, err) = fabric(&["run", "support-triage", "--goal", &goal, "--store", &db]).await;
        assert_eq!(code, Some(0), "{err}");
    }
    let (code, ours, err) =
        fabric(&["eval", "dataset", "from-runs", "--route", "support-triage", "--status", "completed", "--expect-output", "--store", &db]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(ours.matches("route_id: support-triage").count(), 2, "{ours}");
    assert!(ours.contains("output: You were charged twice; the duplicate charge has been refunded.") && ours.contains("- equals:"), "{ours}");
    let (code, examples, err) =
        fabric(&["eval", "dataset", "from-runs", "--route", "support-triage", "--expect-output", "--to", "langsmith", "--store", &db]).await;
    assert_eq!(code, Some(0), "{err}");
    let parsed: Value = serde_json::from_str(&examples).unwrap();
    assert_eq!(parsed[0]["outputs"]["output"], "You were charged twice; the duplicate charge has been refunded.");
    assert_eq!(parsed[0]["metadata"]["route_id"], "support-triage");
    // LangSmith's examples run as they are (they declare no evaluator: a case passes when its run completes).
    let path = dir.path().join("examples.json");
    std::fs::write(&path, &examples).unwrap();
    let (code, out, err) = fabric(&["eval", "run", path.to_str().unwrap(), "--store", &db, "--format", "json"]).await;
    assert_eq!(code, Some(0), "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((report["cases_total"].as_u64(), report["runs"].as_u64()), (Some(2), Some(2)));
    let (code, _, err) = fabric(&["eval", "dataset", "from-runs", "--route", "nothing-ran", "--store", &db]).await;
    assert_eq!((code, err.as_str()), (Some(2), "fabric: no run of route `nothing-ran` matches\n"));
}
