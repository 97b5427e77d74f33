//! A new user's second hour with the CLI (issue 23): the stub says when a script names nothing,
//! a run that asked is answered from the CLI on the same store, a store that is read but does
//! not exist is named and not created, goals from a file or standard input, shell completions,
//! and a first run without a model that says what to do.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::support::{fabric_cli, repo};

fn out(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A stub directory with the shipped scripts, support-triage's given a misspelled stage key,
/// and a script named after no route.
fn mistaken_stub() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["ticket-router.yaml", "refund-review.yaml", "support-agent.yaml"] {
        std::fs::copy(repo().join("stub").join(f), dir.path().join(f)).unwrap();
    }
    std::fs::write(dir.path().join("support-triage.yaml"), "stages:\n  replies:\n    - 'hello'\n").unwrap();
    std::fs::write(dir.path().join("faqs.yaml"), "stages:\n  answer:\n    - 'x'\n").unwrap();
    dir
}

#[tokio::test]
async fn stub_script_keys_that_name_nothing_are_warned_about_and_refused_when_strict() {
    let stub = mistaken_stub();
    let dir = stub.path().to_str().unwrap().to_owned();
    let args = ["--stub-dir", &dir, "run", "support-triage", "--goal", r#"{"ticket":"x"}"#];
    let o = fabric_cli(&args, &[("FABRIC_LLM_STUB", "1".into())]).await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let e = err(&o);
    assert!(e.contains("faqs.yaml:1:1") && e.contains("named after no route"), "{e}");
    assert!(e.contains("support-triage.yaml:2:3") && e.contains("stage `replies` is no stage of route `support-triage`"), "{e}");
    assert!(e.contains("warning"), "{e}");
    let strict = [("FABRIC_LLM_STUB", "1".to_owned()), ("FABRIC_LLM_STUB_STRICT", "1".to_owned())];
    let o = fabric_cli(&args, &strict).await;
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("named after no route"), "{}", err(&o));
    // Without the stray file, strict mode refuses the route whose script names no stage of it.
    std::fs::remove_file(stub.path().join("faqs.yaml")).unwrap();
    let o = fabric_cli(&args, &strict).await;
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("stage `replies` is no stage"), "{}", err(&o));
    let other = ["--stub-dir", &dir, "run", "ticket-router", "--goal", r#"{"ticket":"invoice wrong"}"#];
    assert_eq!(fabric_cli(&other, &strict).await.status.code(), Some(0), "the other routes still run");
}

#[tokio::test]
async fn a_run_that_asked_is_answered_from_the_cli_on_the_same_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("runs.db").display());
    let env = [("FABRIC_LLM_STUB", "1".to_owned()), ("FABRIC_DATABASE_URL", db.clone())];
    let stub = repo().join("examples/stub-asking");
    let stub = stub.to_str().unwrap();
    // `--store` alone: the store `fabric runs` reads.
    let o = fabric_cli(&["--stub-dir", stub, "run", "support-agent", "--goal", r#"{"question":"refund?"}"#, "--store"], &env).await;
    assert_eq!(o.status.code(), Some(3), "{}", err(&o));
    let asked: Value = serde_json::from_str(&out(&o)).unwrap();
    assert_eq!(asked["question"], "Which order number?");
    let id = asked["run_id"].as_str().unwrap();
    let o = fabric_cli(&["--stub-dir", stub, "runs", "reply", id, "--message", "order 42"], &env).await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let done: Value = serde_json::from_str(&out(&o)).unwrap();
    assert_eq!((done["status"].as_str(), done["output"].as_str()), (Some("completed"), Some("Order 42 is refunded.")), "{done}");
    let o = fabric_cli(&["runs", "show", id], &env).await;
    assert_eq!(serde_json::from_str::<Value>(&out(&o)).unwrap()["status"], "completed");
    // Not awaiting any more; an empty answer is refused before anything is claimed.
    let o = fabric_cli(&["--stub-dir", stub, "runs", "reply", id, "--message", "again"], &env).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("not awaiting the user"), "{}", err(&o));
    let o = fabric_cli(&["--stub-dir", stub, "runs", "reply", id, "--message", "  "], &env).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("empty"), "{}", err(&o));
}

#[tokio::test]
async fn reading_a_store_that_does_not_exist_says_so_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nothing.db");
    let db = format!("sqlite://{}", file.display());
    let id = "01a23566-3b25-7585-9fe7-0294179d3837";
    for args in [&["runs", "list"][..], &["runs", "show", id][..], &["replay", id][..], &["runs", "reply", id, "--message", "x"][..]] {
        let o = fabric_cli(args, &[("FABRIC_DATABASE_URL", db.clone()), ("FABRIC_LLM_STUB", "1".into())]).await;
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(err(&o).contains("no run store at") && err(&o).contains("nothing.db"), "{args:?}: {}", err(&o));
        assert!(!file.exists(), "{args:?} created the store");
    }
}

#[test]
fn a_goal_comes_from_a_file_or_standard_input() {
    let dir = tempfile::tempdir().unwrap();
    // Larger than the kernel's limit on one argument (128 KiB).
    let big = format!(r#"{{"ticket":"charged twice","pad":"{}"}}"#, "x".repeat(200 * 1024));
    let goal_file = dir.path().join("goal.json");
    std::fs::write(&goal_file, &big).unwrap();
    let run = |goal: &str, stdin: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fabric"));
        cmd.current_dir(repo()).args(["run", "support-triage", "--goal", goal]).env("FABRIC_LLM_STUB", "1").env_remove("FABRIC_DATABASE_URL");
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
        drop(input);
        child.wait_with_output().unwrap()
    };
    let o = run(&format!("@{}", goal_file.display()), None);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert_eq!(serde_json::from_str::<Value>(&out(&o)).unwrap()["status"], "completed");
    let o = run("-", Some(&big));
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let o = run("@/no/such/goal.json", None);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("--goal @/no/such/goal.json"), "{}", err(&o));
    let o = run("-", Some("[1, 2]"));
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
}

#[tokio::test]
async fn completions_are_printed_for_bash_zsh_and_fish() {
    for shell in ["bash", "zsh", "fish"] {
        let o = fabric_cli(&["completions", shell], &[]).await;
        assert_eq!(o.status.code(), Some(0), "{shell}: {}", err(&o));
        let script = out(&o);
        assert!(script.contains("fabric") && script.contains("runs") && script.contains("reply"), "{shell}: {script}");
    }
    assert_eq!(fabric_cli(&["completions", "tcsh"], &[]).await.status.code(), Some(2));
}

/// No model and no stub: the default provider (a local Ollama) cannot be reached, and the error
/// says which model was used by default, what changes it, and that the stub exists.
#[tokio::test]
async fn a_first_run_without_a_model_says_what_to_do() {
    let env = [("OLLAMA_BASE_URL", "http://127.0.0.1:1".to_owned()), ("FABRIC_LLM_RETRY_MAX", "1".to_owned())];
    let o = fabric_cli(&["run", "support-triage", "--goal", r#"{"ticket":"x"}"#], &env).await;
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    let e = err(&o);
    assert!(e.contains("ollama:qwen3:14b") && e.contains("FABRIC_LLM_MODEL") && e.contains("FABRIC_LLM_STUB=1"), "{e}");
    let o = fabric_cli(&["doctor"], &env).await;
    assert!(out(&o).contains("model: ollama:qwen3:14b (default"), "{}", out(&o));
    // A model that was chosen gets no such hint, and doctor says where it came from.
    let chosen = [("FABRIC_LLM_MODEL", "ollama:qwen3:8b".to_owned()), env[0].clone(), env[1].clone()];
    let o = fabric_cli(&["run", "support-triage", "--goal", r#"{"ticket":"x"}"#], &chosen).await;
    assert!(!err(&o).contains("FABRIC_LLM_STUB=1"), "{}", err(&o));
    assert!(out(&fabric_cli(&["doctor"], &chosen).await).contains("model: ollama:qwen3:8b (from FABRIC_LLM_MODEL)"));
}
