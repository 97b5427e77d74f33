//! Streaming (issue 48, its first part): a stage's model text as `run.llm.delta` events through a
//! real `fabric serve`, the seeded stub cutting its reply into pieces, the `stream:` switch of a
//! stage, and the deltas joined being the reply the journal keeps.

use serde_json::{Value, json};

use crate::service::{Server, asking_stub, get, post, sse};
use crate::support::{copy_dir, fixtures};

/// The deltas of `stage` in a run's events, in order: (seq, attempt, index, text).
fn deltas(events: &[(u64, String, Value)], stage: &str) -> Vec<(u64, u64, u64, String)> {
    events
        .iter()
        .filter(|(_, kind, d)| kind == "run.llm.delta" && d["stage_id"] == stage)
        .map(|(seq, _, d)| (*seq, d["attempt"].as_u64().unwrap(), d["index"].as_u64().unwrap(), d["text"].as_str().unwrap().to_owned()))
        .collect()
}

#[tokio::test]
async fn a_synthesis_streams_its_text_in_pieces_that_join_into_the_journalled_reply() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("fabric.db").display());
    let stub = asking_stub();
    // 1.2 s over each call's pieces: a piece about every 20 to 80 ms, sent at most every 50 ms.
    let s = Server::start(&db, stub.path(), &[("FABRIC_LLM_STUB_LATENCY_MS", "1200")]);
    let (status, run) =
        post(&s, "/v1/runs?wait=true", json!({"route_id": "support-triage", "goal": {"ticket": "charged twice"}, "model_profile": "default"})).await;
    assert_eq!((status, run["status"].as_str()), (200, Some("completed")), "{run}");
    let id = run["run_id"].as_str().unwrap();
    let events = sse(&s, id, None).await;
    let answer = deltas(&events, "answer");
    assert!(answer.len() >= 3, "the text came in pieces: {answer:?}");
    assert!(deltas(&events, "intake").is_empty() && deltas(&events, "lookup").is_empty(), "classify and query formulation do not stream");
    assert!(answer.iter().enumerate().all(|(i, (_, attempt, index, _))| *attempt == 1 && *index == i as u64), "{answer:?}");
    // Between the call's start and its end, each with an id of its own.
    let seq_of = |kind: &str| events.iter().find(|(_, k, d)| k == kind && d["stage_id"] == "answer").unwrap().0;
    assert!(answer.iter().all(|(seq, ..)| *seq > seq_of("run.llm.started") && *seq < seq_of("run.llm.completed")));
    assert!(events.windows(2).all(|w| w[0].0 < w[1].0), "ids strictly increase");
    let shown: String = answer.iter().map(|(.., text)| text.as_str()).collect();
    let record = get(&s, &format!("/v1/runs/{id}/record")).await;
    let raw = record["entries"].as_array().unwrap().iter().find(|e| e["entry"] == "model_reply" && e["stage_id"] == "answer").unwrap()["raw"].clone();
    assert_eq!(shown, raw.as_str().unwrap(), "the deltas joined are the reply as received");
    // From the store, resumed after any one of them: the rest, nothing twice.
    let (cut, ..) = answer[1];
    let rest = sse(&s, id, Some(cut)).await;
    assert_eq!(rest.first().map(|e| e.0), Some(cut + 1));
}

#[tokio::test]
async fn a_stage_says_whether_it_streams() {
    let cat = tempfile::tempdir().unwrap();
    copy_dir(&fixtures().join("catalogue/routes"), &cat.path().join("routes"));
    let triage = cat.path().join("routes/support-triage.yaml");
    let text = std::fs::read_to_string(&triage).unwrap();
    let text = text.replacen("        llm_role: classify\n", "        llm_role: classify\n        stream: true\n", 1).replacen(
        "        llm_role: synthesis\n",
        "        llm_role: synthesis\n        stream: false\n",
        1,
    );
    std::fs::write(&triage, text).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("fabric.db").display());
    let stub = asking_stub();
    let routes = cat.path().join("routes");
    let s = Server::start(&db, stub.path(), &[("FABRIC_CATALOGUE_DIR", routes.to_str().unwrap())]);
    let (_, run) = post(&s, "/v1/runs?wait=true", json!({"route_id": "support-triage", "goal": {"ticket": "x"}, "model_profile": "default"})).await;
    let events = sse(&s, run["run_id"].as_str().unwrap(), None).await;
    assert_eq!(deltas(&events, "intake").len(), 1, "{events:?}");
    assert!(deltas(&events, "answer").is_empty(), "{events:?}");
    // And `fabric routes diff` says so.
    let before = tempfile::tempdir().unwrap();
    copy_dir(&fixtures().join("catalogue/routes"), &before.path().join("routes"));
    for side in [before.path(), cat.path()] {
        copy_dir(&fixtures().join("catalogue/prompt-packs"), &side.join("prompt-packs"));
    }
    let o = crate::support::fabric_cli(&["routes", "diff", before.path().to_str().unwrap(), cat.path().to_str().unwrap()], &[]).await;
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("stage intake: stream: false -> true") && text.contains("stage answer: stream: true -> false"), "{text}");
}

#[tokio::test]
async fn a_streamed_reply_that_fails_its_schema_was_shown_and_fails_the_stage_as_without_a_stream() {
    // The answer's script: JSON whose `text` is a number, so the schema refuses it.
    let stub = asking_stub();
    let bad = r#"{"text": 42, "note": "a reply long enough to come in several pieces of text"}"#;
    std::fs::write(
        stub.path().join("support-triage.yaml"),
        format!(
            "stages:\n  intake: ['{{\"category\":\"billing\",\"urgency\":\"high\"}}']\n  lookup: ['{{\"query\":\"refund\"}}']\n  answer: ['{}']\n",
            bad.replace('\'', "''")
        ),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("fabric.db").display());
    let s = Server::start(&db, stub.path(), &[("FABRIC_LLM_STUB_LATENCY_MS", "600")]);
    let (_, run) = post(&s, "/v1/runs?wait=true", json!({"route_id": "support-triage", "goal": {"ticket": "x"}, "model_profile": "default"})).await;
    assert_eq!((run["status"].as_str(), run["error"]["reason_class"].as_str()), (Some("failed"), Some("schema_validation")), "{run}");
    let events = sse(&s, run["run_id"].as_str().unwrap(), None).await;
    let answer = deltas(&events, "answer");
    assert!(answer.len() >= 2, "the text was shown as it came: {answer:?}");
    assert_eq!(answer.iter().map(|(.., t)| t.as_str()).collect::<String>(), bad, "all of it");
    // Then the call fails with the reply it could not use, the stage and the run with it.
    let after: Vec<&str> =
        events.iter().skip_while(|(_, k, _)| k != "run.llm.delta").filter(|(_, k, _)| k != "run.llm.delta").map(|(_, k, _)| k.as_str()).collect();
    assert_eq!(after, ["run.llm.failed", "run.stage.failed", "run.failed"], "{events:?}");
    let failed = &events.iter().find(|(_, k, _)| k == "run.llm.failed").unwrap().2;
    assert_eq!((failed["reason_class"].as_str(), failed["reply"].as_str()), (Some("schema_validation"), Some(bad)), "{failed}");
}
