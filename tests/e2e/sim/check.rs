//! The invariants checked after every seed, on what the store holds and what the processes
//! saw (the model's own checks run at every call: `model`; the fence's at every commit:
//! `store`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use fabric::exec::JournalEntry;
use fabric::runtime::Durable;
use fabric::store::{RunFilter, StoredStatus};
use serde_json::Value;

use super::run::RETRY_MAX;
use super::store::Real;
use super::world::World;

/// The fields every event of a type has, as docs/events.md lists them (the test below checks
/// that the document names each).
const FIELDS: &[(&str, &[&str])] = &[
    ("run.started", &["model_profile", "path"]),
    ("run.stage.started", &["llm_role", "stage_idx", "kind"]),
    ("run.llm.started", &["provider", "model", "turn", "structured"]),
    ("run.llm.waiting", &["limit", "waited_ms"]),
    ("run.llm.retrying", &["attempt", "delay_ms", "reason_class", "message"]),
    ("run.llm.delta", &["turn", "attempt", "index", "text"]),
    ("run.llm.restarted", &["turn", "attempt"]),
    ("run.llm.fallback", &["from", "to", "reason", "reason_class"]),
    ("run.llm.completed", &["duration_ms"]),
    ("run.llm.failed", &["reason_class", "message", "duration_ms"]),
    ("run.tool.started", &["tool", "method"]),
    ("run.tool.completed", &["tool", "status", "bytes", "duration_ms"]),
    ("run.tool.failed", &["tool", "reason_class", "message"]),
    ("run.stage.completed", &["duration_ms", "output", "output_chars"]),
    ("run.stage.failed", &["reason_class", "message", "duration_ms"]),
    ("run.completed", &["output", "duration_ms"]),
    // `duration_ms` is absent from the `run.failed` of a recovered run given up without a walk.
    ("run.failed", &["reason_class", "message"]),
    ("run.awaiting_input", &["question", "duration_ms"]),
    ("run.resumed", &["reply"]),
];
const COMMON: [&str; 5] = ["type", "run_id", "route_id", "seq", "ts"];

fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The reason classes docs/events.md documents (its table's first column).
pub fn documented_classes() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(repo().join("docs/events.md")).unwrap();
    let section = doc.split("## Reason classes").nth(1).expect("docs/events.md has a section `Reason classes`");
    let section = section.split("\n## ").next().unwrap_or_default();
    let mut out = BTreeSet::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let first = line.split('|').nth(1).unwrap_or_default();
        for name in first.split('`').skip(1).step_by(2) {
            out.insert(name.to_owned());
        }
    }
    out
}

/// A run's end as the store has it, and the reason class it gives, against the events.
fn ends(run_id: &str, status: StoredStatus, reason: Option<&str>, kinds: &[String], classes: &BTreeSet<String>, out: &mut Vec<String>) {
    let terminal: Vec<&String> = kinds.iter().filter(|k| *k == "run.completed" || *k == "run.failed").collect();
    let last = kinds.last().map(String::as_str);
    match status {
        StoredStatus::Completed | StoredStatus::Failed => {
            let want = if status == StoredStatus::Completed { "run.completed" } else { "run.failed" };
            if terminal.len() != 1 || last != Some(want) {
                out.push(format!("run {run_id} is {status:?} but its events end {terminal:?} (last {last:?}): a run ends exactly once, last"));
            }
        }
        StoredStatus::AwaitingInput => {
            if !terminal.is_empty() || last != Some("run.awaiting_input") {
                out.push(format!("run {run_id} awaits input but its events end {terminal:?} (last {last:?})"));
            }
        }
        other => out.push(format!("run {run_id} is still {other:?} when everything settled")),
    }
    if let Some(r) = reason
        && !classes.contains(r)
    {
        out.push(format!("run {run_id} failed with `{r}`, which docs/events.md does not document"));
    }
}

pub fn after(real: &Real, replay: Durable, world: &World, seen: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let classes = documented_classes();
    let store = real.store.clone();
    let runs = real.block(async move { store.list_runs(&RunFilter { limit: 100_000, ..Default::default() }).await }).expect("the store lists its runs");
    let replay = Arc::new(replay);
    for run in runs {
        let (store, id) = (real.store.clone(), run.run_id.clone());
        let (events, journal) = real.block(async move { (store.events_after(&id, 0).await, store.journal(&id).await) });
        let (events, journal) = (events.expect("events read"), journal.expect("journal read"));
        let id = &run.run_id;
        // Contiguous, well formed.
        let mut kinds = Vec::new();
        for (i, e) in events.iter().enumerate() {
            if e.seq != i as u64 + 1 {
                out.push(format!("run {id}: event {} has seq {} (events are 1, 2, 3 ... without gaps)", i + 1, e.seq));
                break;
            }
            let body: Value = match serde_json::from_str(&e.body) {
                Ok(v) => v,
                Err(err) => {
                    out.push(format!("run {id}: event {} is not JSON: {err}", e.seq));
                    continue;
                }
            };
            let fields = FIELDS.iter().find(|(k, _)| *k == e.kind).map(|(_, f)| *f);
            match fields {
                None => out.push(format!("run {id}: event {} has the undocumented type `{}`", e.seq, e.kind)),
                Some(fields) => {
                    for f in COMMON.iter().chain(fields) {
                        if body.get(*f).is_none() {
                            out.push(format!("run {id}: event {} ({}) lacks `{f}`", e.seq, e.kind));
                        }
                    }
                }
            }
            if body.get("seq").and_then(Value::as_u64) != Some(e.seq) || body.get("type").and_then(Value::as_str) != Some(e.kind.as_str()) {
                out.push(format!("run {id}: event {} says otherwise of its seq or type: {}", e.seq, e.body));
            }
            if let Some(c) = body.get("reason_class").and_then(Value::as_str)
                && !classes.contains(c)
            {
                out.push(format!("run {id}: event {} has the undocumented reason class `{c}`", e.seq));
            }
            if body.get("run_id").and_then(Value::as_str) == Some(id.as_str()) {
                kinds.push(e.kind.clone());
            }
        }
        ends(id, run.status, run.reason_class.map(|c| c.as_str()), &kinds, &classes, &mut out);
        // Each completed stage, and each model reply, recorded once. (A decision loop's stages
        // complete once per turn, and a branched workflow's may loop: there, each turn's reply
        // is the unit.)
        let path =
            events.first().and_then(|e| serde_json::from_str::<Value>(&e.body).ok()).and_then(|b| b.get("path").and_then(Value::as_str).map(str::to_owned));
        let looped = !matches!(path.as_deref(), Some("workflow" | "manifest"));
        let mut stages = HashSet::new();
        let mut replies = HashSet::new();
        for entry in &journal {
            match entry {
                JournalEntry::StageCompleted { stage_id, .. } if !looped && !stages.insert(stage_id.clone()) => {
                    out.push(format!("run {id}: stage {stage_id} is recorded as completed twice"));
                }
                JournalEntry::ModelReply { stage_id, turn, .. } if !replies.insert((stage_id.clone(), *turn)) => {
                    out.push(format!("run {id}: the model's reply for {stage_id} turn {turn} is recorded twice"));
                }
                _ => {}
            }
        }
        // A replay of a completed run diverges nowhere.
        if run.status == StoredStatus::Completed {
            let (rt, rid) = (replay.clone(), id.clone());
            match real.block(async move { rt.replay(&rid, fabric::runtime::ReplayOn::Recorded).await.map_err(|e| e.to_string()) }) {
                Ok(report) if !report.divergences.is_empty() => out.push(format!("run {id}: its replay diverges: {:?}", report.divergences)),
                Ok(_) => {}
                Err(e) => out.push(format!("run {id}: its replay could not run: {e}")),
            }
        }
        // No secret in what the store holds.
        let result = run.result.as_ref().and_then(|r| serde_json::to_string(r).ok()).unwrap_or_default();
        if events.iter().any(|e| e.body.contains(&world.secret)) || result.contains(&world.secret) {
            out.push(format!("run {id}: the world's secret is in its record"));
        }
    }
    if seen.iter().any(|e| e.contains(&world.secret)) {
        out.push("the world's secret is in an event a sink saw".to_owned());
    }
    out.extend(retries(seen));
    out
}

/// The retry layer, as its events tell it: a non-retryable failure is never tried again, a
/// retryable one is tried `FABRIC_LLM_RETRY_MAX` times in all before the call fails with it.
/// A call of a run whose older segment still calls the same stage (a takeover) is not judged:
/// their events interleave.
fn retries(seen: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    // Per (run, stage): the open call's retries, or None when two calls are open at once.
    let mut open: HashMap<(String, String), Option<u32>> = HashMap::new();
    for line in seen {
        let e: Value = serde_json::from_str(line).expect("a sink's event is JSON");
        let text = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
        let key = (text("run_id"), text("stage_id"));
        let class = text("reason_class");
        match text("type").as_str() {
            "run.llm.started" => {
                let twice = open.contains_key(&key);
                open.insert(key, if twice { None } else { Some(0) });
            }
            "run.llm.retrying" => {
                if !class_retryable(&class) {
                    out.push(format!("run {} stage {}: a `{class}` failure was tried again", key.0, key.1));
                }
                if let Some(Some(n)) = open.get_mut(&key) {
                    *n += 1;
                    if *n >= RETRY_MAX {
                        out.push(format!("run {} stage {}: attempt {} made (FABRIC_LLM_RETRY_MAX={RETRY_MAX})", key.0, key.1, *n + 1));
                    }
                }
            }
            "run.llm.completed" => {
                open.remove(&key);
            }
            "run.llm.failed" => {
                if let Some(Some(n)) = open.remove(&key)
                    && class_retryable(&class)
                    && n + 1 != RETRY_MAX
                {
                    out.push(format!("run {} stage {}: failed with `{class}` after {} attempt(s), not {RETRY_MAX}", key.0, key.1, n + 1));
                }
            }
            _ => {}
        }
    }
    out
}

fn class_retryable(class: &str) -> bool {
    ["timeout", "connection", "rate_limited", "server_error"].contains(&class)
}

#[test]
fn the_checked_fields_and_classes_are_the_documented_ones() {
    let doc = std::fs::read_to_string(repo().join("docs/events.md")).unwrap();
    for (kind, fields) in FIELDS {
        let row = doc.lines().find(|l| l.starts_with(&format!("| `{kind}` |"))).unwrap_or_else(|| panic!("docs/events.md has no row for {kind}"));
        for f in *fields {
            assert!(row.contains(&format!("`{f}`")), "docs/events.md's row for {kind} does not name `{f}`");
        }
    }
    let classes = documented_classes();
    for c in ["store_error", "replay_diverged", "interrupted", "rate_limited"] {
        assert!(classes.contains(c), "{c} not found among {classes:?}");
    }
}
