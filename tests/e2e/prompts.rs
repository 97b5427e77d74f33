//! System prompts stored once, by digest, on every store: many runs of a route keep one row per
//! distinct prompt, and every reader (the journal, replay, a recovered run) still sees the
//! whole prompt; rows written before prompts were split out still read.

use std::sync::Arc;

use fabric::cancel::Cancel;
use fabric::events::NullSink;
use fabric::exec::JournalEntry;
use serde_json::json;

use crate::store::{runtime, sql, start, stores};
use crate::support::stub_dir;

#[tokio::test]
async fn runs_of_a_route_share_one_row_per_prompt_and_read_back_whole_on_every_store() {
    let (stores, _dir) = stores().await;
    let stub = tempfile::tempdir().unwrap();
    std::fs::copy(stub_dir().join("support-triage.yaml"), stub.path().join("support-triage.yaml")).unwrap();
    for (name, url) in stores {
        let store = fabric::store::open(&url).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        let rt = runtime(store.clone(), stub.path());
        let mut ids = Vec::new();
        for ticket in ["charged twice", "cannot log in", "charged twice"] {
            let req = start("support-triage", json!({"ticket": ticket}));
            let accepted = rt.accept(&req, true).await.unwrap();
            rt.execute(&accepted.lease.clone().unwrap(), &req, &accepted.edition, Arc::new(NullSink), Cancel::never()).await.unwrap();
            ids.push(accepted.run_id);
        }
        // Three stages with three different system prompts: three rows, whatever the runs.
        let digests = sql(&url, "SELECT digest FROM run_prompts ORDER BY digest").await;
        assert_eq!(digests.len(), 3, "{name}: {digests:?}");
        let entries = sql(&url, "SELECT entry FROM run_journal").await;
        assert!(entries.iter().all(|e| !e.contains("support desk assistant")), "{name}: no journal row copies a prompt");
        let named = sql(&url, "SELECT prompt FROM run_journal WHERE prompt IS NOT NULL").await;
        assert_eq!(named.len(), 9, "{name}: each model reply names its prompt");
        for id in &ids {
            let systems: Vec<String> = store
                .journal(id)
                .await
                .unwrap()
                .into_iter()
                .filter_map(|e| match e {
                    JournalEntry::ModelReply { system, .. } => Some(system),
                    _ => None,
                })
                .collect();
            assert_eq!(systems.len(), 3, "{name}");
            assert_eq!(systems[1], "Write one short knowledge-base search query for the customer's problem.\n", "{name}");
            assert!(systems[0].starts_with("You are the support desk assistant of Example Corp."), "{name}: {systems:?}");
            // Replay compares each recorded prompt with the one the catalogue makes now.
            let report = rt.replay(id, fabric::runtime::ReplayOn::Recorded).await.unwrap();
            assert!(report.divergences.is_empty(), "{name}: {:?}", report.divergences);
        }
        // A second store on the same database (another replica: nothing known yet) writes
        // nothing twice.
        let other = fabric::store::open(&url).await.unwrap();
        let rt2 = runtime(other, stub.path());
        let req = start("support-triage", json!({"ticket": "late delivery"}));
        let accepted = rt2.accept(&req, true).await.unwrap();
        rt2.execute(&accepted.lease.clone().unwrap(), &req, &accepted.edition, Arc::new(NullSink), Cancel::never()).await.unwrap();
        assert_eq!(sql(&url, "SELECT digest FROM run_prompts").await.len(), 3, "{name}");
    }
}

#[tokio::test]
async fn a_journal_row_written_before_prompts_were_split_out_still_reads_on_every_store() {
    let (stores, _dir) = stores().await;
    let stub = tempfile::tempdir().unwrap();
    std::fs::copy(stub_dir().join("support-triage.yaml"), stub.path().join("support-triage.yaml")).unwrap();
    for (name, url) in stores {
        let store = fabric::store::open(&url).await.unwrap();
        let rt = runtime(store.clone(), stub.path());
        let req = start("support-triage", json!({"ticket": "charged twice"}));
        let accepted = rt.accept(&req, true).await.unwrap();
        let id = accepted.run_id.clone();
        rt.execute(&accepted.lease.clone().unwrap(), &req, &accepted.edition, Arc::new(NullSink), Cancel::never()).await.unwrap();
        // The row as the runtime before migration 4 wrote it: the whole entry, no digest.
        let old = JournalEntry::ModelReply {
            stage_id: "extra".into(),
            turn: 0,
            system: "An old prompt".into(),
            user: "u".into(),
            raw: "{}".into(),
            value: "{}".into(),
            model: None,
        };
        let text = serde_json::to_string(&old).unwrap().replace('\'', "''");
        let insert = format!("INSERT INTO run_journal (run_id, entry) VALUES ('{id}', '{text}') RETURNING entry");
        sql(&url, &insert).await;
        let journal = store.journal(&id).await.unwrap();
        assert_eq!(journal.last(), Some(&old), "{name}");
        assert_eq!(journal.len(), 7, "{name}: the run's own six entries read too");
        // A row whose prompt the store lost is an error naming the run and the digest.
        sql(&url, "DELETE FROM run_prompts RETURNING digest").await;
        let err = store.journal(&id).await.unwrap_err().to_string();
        assert!(err.contains(&id) && err.contains("names the prompt"), "{name}: {err}");
    }
}
