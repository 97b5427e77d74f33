//! Scheduled runs (issue 50) on real stores (SQLite and PostgreSQL) and real `fabric serve`
//! processes: each fire time decided once however many replicas race for it, a claimed start
//! taken over once its replica died, and the service's API, loop and policies end to end.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use fabric::api::{ApiConfig, AppState};
use fabric::runtime::ScheduleDef;
use fabric::store::schedules::{FireEnd, NewFire, StoredSchedule};
use serde_json::{Value, json};

use crate::service::{Server, TOKEN, client, settled};
use crate::store::stores;
use crate::support::{fixtures, routes_dir};

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

// ---- the service's loop on a clock the test moves (one process, real stores) ----

/// A time on the test's clock: `T0` plus `ms`.
fn at(ms: i64) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2030-01-01T00:00:00Z").unwrap().with_timezone(&Utc) + chrono::Duration::milliseconds(ms)
}

fn def(route: &str, cron: &str, extra: Value) -> ScheduleDef {
    let mut v = json!({"route_id": route, "goal": {"q": 1}, "cron": cron});
    v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    serde_json::from_value(v).unwrap()
}

/// The outcomes of a schedule's fires, oldest first.
async fn outcomes(state: &AppState, id: &str) -> Vec<String> {
    let mut fires = state.durable().schedule_fires(id, 1000).await.unwrap();
    fires.reverse();
    fires.into_iter().map(|f| f.outcome).collect()
}

#[tokio::test]
async fn each_overlap_policy_with_a_run_that_outlives_its_interval_on_every_store() {
    let (stores, _dir) = stores().await;
    for (name, url) in stores {
        let store = fabric::store::open(&url).await.unwrap();
        let (state, _stub) = crate::service::state_on(store, None, ApiConfig::default());
        let durable = state.durable().clone();
        let mut ids = Vec::new();
        // support-agent asks the user: its run stays live (awaiting input) past every interval.
        for overlap in ["skip", "buffer_one", "allow_all", "cancel_other"] {
            let d = def("support-agent", "* * * * * *", json!({"overlap": overlap}));
            ids.push(durable.create_schedule(None, &d, false, "api", at(0)).await.unwrap().id);
        }
        for second in 1..=3 {
            assert!(state.schedule_tick(at(second * 1000 + 150)).await > 0, "{name}: a run started at second {second}");
        }
        let want =
            [["started", "skipped", "skipped"], ["started", "buffered", "skipped"], ["started", "started", "started"], ["started", "started", "started"]];
        for (id, want) in ids.iter().zip(want) {
            assert_eq!(outcomes(&state, id).await, want, "{name}: {id}");
        }
        // cancel_other cancelled each run before the next (newest first): only the last one is live.
        let fires = durable.schedule_fires(&ids[3], 10).await.unwrap();
        assert!(fires[2].why.is_none() && fires[0].why.as_deref().unwrap().contains("cancelled the live run"), "{name}: {fires:?}");
        for f in &fires[1..] {
            // A running run's cancel is requested; its holder ends it at once.
            let mut status = String::new();
            for _ in 0..100 {
                status = durable.store().get_run(f.run_id.as_deref().unwrap()).await.unwrap().unwrap().status.as_str().to_owned();
                if status == "cancelled" {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(status, "cancelled", "{name}");
        }
        // buffer_one: once its live run ends, the buffered fire starts.
        let live = durable.schedule(&ids[1]).await.unwrap().last_run_id.unwrap();
        durable.cancel(&live, None, Arc::new(fabric::events::NullSink)).await.unwrap();
        state.schedule_tick(at(3_500)).await;
        assert_eq!(outcomes(&state, &ids[1]).await, ["started", "started", "skipped"], "{name}");
        // Every started fire's run is keyed by its fire time.
        let fire = &durable.schedule_fires(&ids[2], 10).await.unwrap()[0];
        let key = fabric::store::IdempotencyKey::parse(&format!("schedule:{}:{}", ids[2], fire.fire_time)).unwrap();
        assert_eq!(durable.store().run_of_key(&key).await.unwrap().unwrap().run_id, fire.run_id.clone().unwrap(), "{name}");
    }
}

#[tokio::test]
async fn an_hour_outage_with_catchup_all_three_runs_three_the_rest_missed_and_two_replicas_fire_each_time_once() {
    let (stores, _dir) = stores().await;
    for (name, url) in stores {
        let store = fabric::store::open(&url).await.unwrap();
        let (a, _stub_a) = crate::service::state_on(store.clone(), None, ApiConfig::default());
        let (b, _stub_b) = crate::service::state_on(store, None, ApiConfig::default());
        let d = def(
            "support-triage",
            "* * * * *",
            json!({"overlap": "allow_all", "catchup": "all", "max_catchup_runs": 3, "catchup_window": "2h", "goal": {"ticket": "t"}}),
        );
        let id = a.durable().create_schedule(None, &d, false, "api", at(0)).await.unwrap().id;
        // No replica was up for an hour: both come back at once.
        let (ra, rb) = tokio::join!(a.schedule_tick(at(3_600_000 + 300)), b.schedule_tick(at(3_600_000 + 300)));
        assert_eq!(ra + rb, 3, "{name}: three runs, however long the outage");
        let fires = outcomes(&a, &id).await;
        assert_eq!(fires.len(), 60, "{name}: 00:01 to 01:00, each minute once");
        assert_eq!(fires.iter().filter(|o| *o == "missed").count(), 57, "{name}");
        assert_eq!(&fires[57..], ["started", "started", "started"], "{name}: the newest three");
        // Back to normal: each minute once, whichever replica looks first.
        for minute in 61..=63 {
            let (ra, rb) = tokio::join!(a.schedule_tick(at(minute * 60_000 + 200)), b.schedule_tick(at(minute * 60_000 + 200)));
            assert_eq!(ra + rb, 1, "{name}: minute {minute}");
        }
        let why = a.durable().schedule_fires(&id, 100).await.unwrap().last().unwrap().why.clone().unwrap();
        assert!(why.contains("`max_catchup_runs`: 3"), "{name}: {why}");
        assert_eq!(outcomes(&a, &id).await.len(), 63, "{name}");
        // Retention: fire records go with the ended runs past it (none is to start or buffered here).
        a.durable().prune(Duration::ZERO, false).await.unwrap();
        assert!(outcomes(&a, &id).await.is_empty(), "{name}");
    }
}

// ---- `fabric serve` over real sockets ----

/// A server over the fixture catalogue with `order-status` (a route with a `goal_schema`) layered on it.
fn serve(store: &str) -> (Server, tempfile::TempDir) {
    let stub = crate::service::asking_stub();
    let catalogue = format!("{}:{}", routes_dir().display(), fixtures().join("mcp/routes").display());
    (Server::start(store, stub.path(), &[("FABRIC_CATALOGUE_DIR", catalogue.as_str())]), stub)
}

async fn call(server: &Server, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = client().request(method.parse().unwrap(), format!("{}{path}", server.url)).bearer_auth(TOKEN);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn the_api_refuses_bad_schedules_with_where_and_fires_a_good_one_every_second() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _stub) = serve(&format!("sqlite://{}", dir.path().join("fabric.db").display()));
    let triage = |cron: &str| json!({"route_id": "support-triage", "goal": {"ticket": "t"}, "cron": cron});
    for (body, says) in [
        (triage("0 0 0 1 1 * 2030"), "this one has 7 (the extra field starts at column 13)"),
        (triage("0 0 31 2 *"), "never fires"),
        (triage("0 61 * * *"), "field 2 (hour) at column 3"),
        (json!({"route_id": "support-triage", "goal": {}, "cron": "* * * * *", "timezone": "Mars/Olympus"}), "not an IANA time zone"),
        (json!({"route_id": "no-such-route", "goal": {}, "cron": "* * * * *"}), "unknown route `no-such-route`"),
        (json!({"route_id": "order-status", "goal": {"order_id": "x"}, "cron": "* * * * *"}), "goal_schema"),
        (json!({"route_id": "support-triage", "goal": {}, "crn": "* * * * *"}), "unknown field `crn`"),
        (json!({"route_id": "support-triage", "goal": {}, "cron": "* * * * *", "catchup": "all", "max_catchup_runs": 500}), "max_catchup_runs"),
    ] {
        let (status, error) = call(&server, "POST", "/v1/schedules", Some(body.clone())).await;
        assert_eq!(status, 422, "{body}: {error}");
        assert!(error["error"]["message"].as_str().unwrap().contains(says), "{body}: {error}");
    }
    let mut every_second = triage("* * * * * *");
    every_second["overlap"] = json!("allow_all");
    let (status, made) = call(&server, "POST", "/v1/schedules", Some(every_second)).await;
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_str().unwrap().to_owned();
    assert_eq!(made["next_fires"].as_array().unwrap().len(), 3, "{made}");
    tokio::time::sleep(Duration::from_millis(3_300)).await;
    let (_, paused) = call(&server, "PATCH", &format!("/v1/schedules/{id}"), Some(json!({"paused": true}))).await;
    assert_eq!(paused["paused"], true, "{paused}");
    let (_, fires) = call(&server, "GET", &format!("/v1/schedules/{id}/fires"), None).await;
    let fires = fires["fires"].as_array().unwrap().clone();
    assert!((2..=4).contains(&fires.len()), "{fires:?}");
    for f in &fires {
        assert_eq!(f["outcome"], "started", "{f}");
        assert!(f["lag_ms"].as_i64().unwrap() < 1_000, "started within a second of its time: {f}");
        let run = settled(&server, f["run_id"].as_str().unwrap()).await;
        assert_eq!(run["status"], "completed", "{run}");
    }
    // Paused: no fire; a trigger fires it all the same, with a key of its own.
    let (status, fire) = call(&server, "POST", &format!("/v1/schedules/{id}/trigger"), None).await;
    assert_eq!((status, fire["manual"].clone(), fire["outcome"].clone()), (202, json!(true), json!("starting")), "{fire}");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (_, after) = call(&server, "GET", &format!("/v1/schedules/{id}/fires"), None).await;
    let after = after["fires"].as_array().unwrap();
    assert_eq!(after.len(), fires.len() + 1, "{after:?}");
    assert_eq!((after[0]["manual"].clone(), after[0]["outcome"].clone()), (json!(true), json!("started")), "{after:?}");
    let metrics = client().get(format!("{}/metrics", server.url)).bearer_auth(TOKEN).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("fabric_schedule_fires_total{outcome=\"started\"}") && metrics.contains("fabric_schedule_lag_seconds_count"), "{metrics}");
    let (_, list) = call(&server, "GET", "/v1/schedules", None).await;
    assert_eq!(list["schedules"][0]["id"], id.as_str());
    assert_eq!(call(&server, "DELETE", &format!("/v1/schedules/{id}"), None).await.0, 204);
    assert_eq!(call(&server, "GET", &format!("/v1/schedules/{id}"), None).await.0, 404);
}

/// The issue's fleet test: three replicas on PostgreSQL, a schedule every second for a minute,
/// one replica `kill -9`'d in the middle: a run per second (one at each edge aside), none twice,
/// each within a second of its time but those the killed replica held (taken over after their
/// claim, 10 s).
#[tokio::test]
async fn three_replicas_on_postgres_one_killed_fire_every_second_once() {
    let Some(url) = crate::store::fresh_postgres().await else { return };
    let (a, _sa) = serve(&url);
    let (b, _sb) = serve(&url);
    let (c, _sc) = serve(&url);
    let body = json!({"route_id": "support-triage", "goal": {"ticket": "t"}, "cron": "* * * * * *", "overlap": "allow_all"});
    let (status, made) = call(&a, "POST", "/v1/schedules", Some(body)).await;
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_secs(30)).await;
    b.signal("KILL");
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (_, paused) = call(&c, "PATCH", &format!("/v1/schedules/{id}"), Some(json!({"paused": true}))).await;
    assert_eq!(paused["paused"], true, "{paused}");
    // A start the killed replica held is taken over once its claim ends.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let (_, fires) = call(&a, "GET", &format!("/v1/schedules/{id}/fires?limit=1000"), None).await;
    let fires = fires["fires"].as_array().unwrap().clone();
    assert!((59..=61).contains(&fires.len()), "{} fires", fires.len());
    let runs: std::collections::BTreeSet<&str> = fires.iter().map(|f| f["run_id"].as_str().unwrap_or_else(|| panic!("a fire without its run: {f}"))).collect();
    assert_eq!(runs.len(), fires.len(), "a run per fire, none twice");
    assert!(fires.iter().all(|f| f["outcome"] == "started"), "{fires:?}");
    let late: Vec<&Value> = fires.iter().filter(|f| f["lag_ms"].as_i64().unwrap() >= 1_000).collect();
    assert!(late.len() <= 2, "only the fires the killed replica held start late: {late:?}");
    // The store holds exactly those runs of the route: no fire started a second run.
    let (_, page) = call(&a, "GET", "/v1/runs?route_id=support-triage&limit=200", None).await;
    assert_eq!(page["runs"].as_array().unwrap().len(), fires.len(), "{page}");
    drop(b);
}

#[tokio::test]
async fn fabric_schedules_creates_lists_pauses_triggers_and_deletes_on_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("fabric.db").display());
    let env = [("FABRIC_LLM_STUB", "1".to_owned())];
    let cli = |args: Vec<String>| {
        let mut all = vec!["schedules".to_owned(), "--store".to_owned(), store.clone()];
        all.extend(args);
        let env = env.clone();
        async move { crate::support::fabric_cli(&all.iter().map(String::as_str).collect::<Vec<_>>(), &env).await }
    };
    let v = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let never = cli(v(&["create", "--route", "support-triage", "--goal", r#"{"ticket": "t"}"#, "--cron", "0 0 31 2 *"])).await;
    assert_eq!(never.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&never.stderr).contains("never fires"), "{never:?}");
    let made =
        cli(v(&["create", "--route", "support-triage", "--goal", r#"{"ticket": "t"}"#, "--cron", "30 7 * * MON-FRI", "--timezone", "Europe/Berlin"])).await;
    assert!(made.status.success(), "{made:?}");
    let view: Value = serde_json::from_slice(&made.stdout).unwrap();
    let id = view["id"].as_str().unwrap().to_owned();
    let list = String::from_utf8(cli(v(&["list"])).await.stdout).unwrap();
    assert!(list.starts_with(&format!("{id}\tsupport-triage\t30 7 * * MON-FRI\tEurope/Berlin\tactive\t")), "{list}");
    let paused: Value = serde_json::from_slice(&cli(v(&["pause", &id])).await.stdout).unwrap();
    assert_eq!(paused["paused"], true);
    assert!(cli(v(&["trigger", &id])).await.status.success());
    let shown = String::from_utf8(cli(v(&["show", &id, "--fires", "5"])).await.stdout).unwrap();
    let fire: Value = serde_json::from_str(shown.lines().nth(1).unwrap()).unwrap();
    assert_eq!((fire["manual"].clone(), fire["outcome"].clone()), (json!(true), json!("starting")), "{shown}");
    assert!(cli(v(&["delete", &id])).await.status.success());
    assert_eq!(cli(v(&["show", &id])).await.status.code(), Some(2));
}

#[tokio::test]
async fn a_schedule_whose_route_no_replica_knows_a_minute_after_its_fire_is_paused_with_why() {
    let store = fabric::store::open("sqlite::memory:").await.unwrap();
    let (state, _stub) = crate::service::state_on(store.clone(), None, ApiConfig::default());
    // A schedule of a route this catalogue does not have (it left it, or a newer one adds it).
    let mut row = schedule("gone", at(1_000).timestamp_millis());
    row.route_id = "retired-route".into();
    row.body = json!({"route_id": "retired-route", "goal": {}, "cron": "* * * * * *"});
    store.schedules().unwrap().create_schedule(&row).await.unwrap();
    // Within the minute a replica on a newer catalogue may decide it: nothing here.
    assert_eq!(state.schedule_tick(at(30_000)).await, 0);
    let view = state.durable().schedule("gone").await.unwrap();
    assert!(!view.paused && outcomes(&state, "gone").await.is_empty(), "{view:?}");
    state.schedule_tick(at(61_500)).await;
    let view = state.durable().schedule("gone").await.unwrap();
    assert!(view.paused, "{view:?}");
    assert!(view.paused_reason.unwrap().contains("route `retired-route` is not in the catalogue"));
    assert!(outcomes(&state, "gone").await.is_empty(), "no fire decided for it");
}
