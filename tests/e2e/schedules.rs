//! Scheduled runs (issue 50) on real stores (SQLite and PostgreSQL) and real `fabric serve`
//! processes: each fire time decided once however many replicas race for it, a claimed start
//! taken over once its replica died, and the service's API, loop and policies end to end.

use std::sync::Arc;

use fabric::store::schedules::{FireEnd, NewFire, StoredSchedule};
use serde_json::json;

use crate::store::stores;

fn schedule(id: &str, next_fire_ms: i64) -> StoredSchedule {
    StoredSchedule {
        id: id.into(),
        route_id: "support-triage".into(),
        body: json!({"cron": "* * * * * *"}),
        origin: "api".into(),
        paused: false,
        paused_reason: None,
        next_fire_ms: Some(next_fire_ms),
        last_run_id: None,
        created_at: String::new(),
        updated_at: String::new(),
    }
}

fn fire(ms: i64, outcome: &'static str, claim_until: i64) -> NewFire {
    NewFire { fire_ms: ms, fire_time: format!("t{ms}"), outcome, why: None, manual: false, claim_until }
}

#[tokio::test]
async fn a_fire_time_is_decided_once_and_a_dead_deciders_start_is_taken_over_once_on_every_store() {
    let (stores, _dir) = stores().await;
    for (name, url) in stores {
        let store = fabric::store::open(&url).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        let s = store.schedules().expect("a SQL store keeps schedules");
        assert!(s.create_schedule(&schedule("s1", 1_000)).await.unwrap(), "{name}");
        assert!(!s.create_schedule(&schedule("s1", 1_000)).await.unwrap(), "{name}: the id is taken");
        assert_eq!(s.due_schedules(999, 10).await.unwrap().len(), 0, "{name}");
        assert_eq!(s.due_schedules(1_000, 10).await.unwrap()[0].id, "s1", "{name}");
        // Eight deciders race for the same cursor: one wins, the fire is recorded once.
        let mut racers = Vec::new();
        for _ in 0..8 {
            let store = store.clone();
            racers.push(tokio::spawn(async move {
                let fires = [fire(1_000, "starting", 5_000)];
                store.schedules().unwrap().decide("s1", 1_000, Some(2_000), &fires).await.unwrap()
            }));
        }
        let mut won = 0;
        for r in racers {
            won += usize::from(r.await.unwrap());
        }
        assert_eq!(won, 1, "{name}: one decider per fire time");
        assert_eq!(s.get_schedule("s1").await.unwrap().unwrap().next_fire_ms, Some(2_000), "{name}");
        // The decider holds its start until 5 000: no one else claims it before.
        assert!(s.claim_starts(4_999, 9_000, 10).await.unwrap().is_empty(), "{name}");
        // It died: the first claimer after its claim takes it over, and only that one.
        let (a, b) = tokio::join!(s.claim_starts(5_000, 9_000, 10), s.claim_starts(5_000, 9_000, 10));
        assert_eq!(a.unwrap().len() + b.unwrap().len(), 1, "{name}: one claimer");
        s.record_fire("s1", 1_000, FireEnd::Started { run_id: "r1", lag_ms: 12 }).await.unwrap();
        let fires = s.fires("s1", 10).await.unwrap();
        assert_eq!((fires[0].outcome.as_str(), fires[0].run_id.as_deref(), fires[0].lag_ms), ("started", Some("r1"), Some(12)), "{name}");
        assert_eq!(s.get_schedule("s1").await.unwrap().unwrap().last_run_id.as_deref(), Some("r1"), "{name}");
        // A buffered fire is moved to starting once.
        assert!(s.decide("s1", 2_000, Some(3_000), &[fire(2_000, "buffered", 0)]).await.unwrap(), "{name}");
        assert_eq!(s.buffered_fires(10).await.unwrap().len(), 1, "{name}");
        assert!(s.unbuffer("s1", 2_000, 9_000).await.unwrap(), "{name}");
        assert!(!s.unbuffer("s1", 2_000, 9_000).await.unwrap(), "{name}");
        // A trigger at a recorded fire time adds nothing; the schedule and its fires go together.
        assert!(!s.add_fire("s1", &fire(1_000, "starting", 0)).await.unwrap(), "{name}");
        assert_eq!(s.prune_fires(i64::MAX, 100).await.unwrap(), 1, "{name}: the ended fire; the starting one stays");
        assert!(s.delete_schedule("s1").await.unwrap(), "{name}");
        assert!(s.fires("s1", 10).await.unwrap().is_empty(), "{name}");
        assert!(!s.delete_schedule("s1").await.unwrap(), "{name}");
        let _: Arc<dyn fabric::store::RunStore> = store;
    }
}
