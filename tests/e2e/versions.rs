//! Catalogue versions (issue 29), through real `fabric serve` processes on a copy of the fixture
//! catalogue: a run finishes on the version it started on (after a reply, after a takeover by a
//! replica that loaded another version), a reload swaps versions whole and refuses a broken one,
//! `FABRIC_RESUME_ON=current` moves a run and says so, `SIGHUP` and `FABRIC_CATALOGUE_WATCH`
//! reload.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::service::{Server, TOKEN, asking_stub, client, get, post, settled};
use crate::support::{copy_dir, fixtures};

/// The sentence of the support pack's `host` text that every support prompt holds: a version's
/// mark is written after it.
const HOST: &str = "Be accurate and brief.";

/// A writable copy of the fixture catalogue: `routes/` and `prompt-packs/`.
struct Catalogue(tempfile::TempDir);

impl Catalogue {
    fn new() -> Catalogue {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(&fixtures().join("catalogue/routes"), &dir.path().join("routes"));
        copy_dir(&fixtures().join("catalogue/prompt-packs"), &dir.path().join("prompt-packs"));
        Catalogue(dir)
    }

    fn path(&self, rel: &str) -> std::path::PathBuf {
        self.0.path().join(rel)
    }

    /// The environment of a server on it.
    fn env(&self) -> [(&'static str, String); 2] {
        let s = |p: &Path| p.to_str().unwrap().to_owned();
        [("FABRIC_CATALOGUE_DIR", s(&self.path("routes"))), ("FABRIC_PROMPT_PACKS_DIR", s(&self.path("prompt-packs")))]
    }

    /// Marks the support pack's prompts with `mark` (the fixture's text for `None`).
    fn mark(&self, mark: Option<&str>) {
        let pack = self.path("prompt-packs/support.yaml");
        let original = std::fs::read_to_string(fixtures().join("catalogue/prompt-packs/support.yaml")).unwrap();
        let text = match mark {
            Some(m) => original.replace(HOST, &format!("{HOST} ({m})")),
            None => original,
        };
        std::fs::write(pack, text).unwrap();
    }
}

fn server(db: &str, cat: &Catalogue, stub: &Path, extra: &[(&str, &str)]) -> Server {
    let env = cat.env();
    let mut all: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    all.extend_from_slice(extra);
    Server::start(db, stub, &all)
}

async fn reload(s: &Server) -> (u16, Value) {
    let r = client().post(format!("{}/v1/catalogue/reload", s.url)).bearer_auth(TOKEN).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn version(s: &Server) -> String {
    get(s, "/v1/catalogue").await["version"].as_str().unwrap().to_owned()
}

/// Whether every prompt that holds the pack's host text (the query formulation's does not) is
/// marked `mark`, and at least one does.
fn all_marked(prompts: &[String], mark: &str) -> bool {
    let hosted: Vec<&String> = prompts.iter().filter(|p| p.contains(HOST)).collect();
    !hosted.is_empty() && hosted.iter().all(|p| p.contains(&format!("{HOST} ({mark})\n")))
}

/// The system prompts of a run's model calls, in the order the journal has them.
async fn prompts(s: &Server, id: &str) -> Vec<String> {
    let record = get(s, &format!("/v1/runs/{id}/record")).await;
    let entries = record["entries"].as_array().unwrap_or_else(|| panic!("{record}"));
    entries.iter().filter(|e| e["entry"] == "model_reply").map(|e| e["system"].as_str().unwrap().to_owned()).collect()
}

fn start(route: &str, goal: Value) -> Value {
    json!({"route_id": route, "goal": goal, "model_profile": "default"})
}

fn sqlite_db(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("fabric.db").display())
}

/// A replica that takes runs over fast: a lease of 2 s, claims every 100 ms.
const TAKES_OVER: [(&str, &str); 2] = [("FABRIC_RUN_LEASE_S", "2"), ("FABRIC_CLAIM_POLL_MS", "100")];

/// A run of `route` on a slow replica over `cat` (each model call 700 ms), killed (`kill -9`)
/// once its first model reply is committed: its id, the version it started on, and how many
/// replies it committed.
async fn killed_mid_run(db: &str, cat: &Catalogue, stub: &Path, route: &str, goal: Value) -> (String, String, usize) {
    let first = server(db, cat, stub, &[("FABRIC_LLM_STUB_LATENCY_MS", "700"), TAKES_OVER[0], TAKES_OVER[1]]);
    let old = version(&first).await;
    let (status, run) = post(&first, "/v1/runs", start(route, goal)).await;
    assert_eq!(status, 201, "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    let mut done = 0;
    for _ in 0..100 {
        done = prompts(&first, &id).await.len();
        if done >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(done >= 1, "the first stage never committed");
    first.signal("KILL");
    (id, old, done)
}

/// The version in force once `until` holds of it, polled 100 times `step` apart (the last one
/// read when it never does).
async fn version_when(s: &Server, step: Duration, until: impl Fn(&str) -> bool) -> String {
    let mut now = String::new();
    for _ in 0..100 {
        now = version(s).await;
        if until(&now) {
            break;
        }
        tokio::time::sleep(step).await;
    }
    now
}

#[tokio::test]
async fn a_reply_after_a_reload_continues_on_the_old_prompt_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    a_reply_after_a_reload_continues_on_the_old_prompt(&sqlite_db(&dir)).await;
}

#[tokio::test]
async fn a_reply_after_a_reload_continues_on_the_old_prompt_on_postgres() {
    if let Some(url) = crate::store::fresh_postgres().await {
        a_reply_after_a_reload_continues_on_the_old_prompt(&url).await;
    }
}

/// A run asks; the prompt pack changes and is reloaded; the reply continues the run on the old
/// prompts, while a new run gets the new ones. Each run says its version.
async fn a_reply_after_a_reload_continues_on_the_old_prompt(db: &str) {
    let (cat, stub) = (Catalogue::new(), asking_stub());
    cat.mark(Some("old"));
    let s = server(db, &cat, stub.path(), &[]);
    let old = version(&s).await;
    let routes = client().get(format!("{}/v1/routes", s.url)).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(routes.headers()["fabric-catalogue-version"].to_str().unwrap(), old);
    let routes: Value = routes.json().await.unwrap();
    assert!(routes.as_array().unwrap().iter().all(|r| r["catalogue_version"] == old.as_str()), "{routes}");
    let (status, asked) = post(&s, "/v1/runs?wait=true", start("support-agent", json!({"question": "refund?"}))).await;
    assert_eq!((status, asked["status"].as_str()), (200, Some("awaiting_input")), "{asked}");
    assert_eq!(asked["catalogue_version"], old.as_str(), "{asked}");
    let id = asked["run_id"].as_str().unwrap().to_owned();

    cat.mark(Some("new"));
    let (status, reloaded) = reload(&s).await;
    assert_eq!(status, 200, "{reloaded}");
    assert_eq!((reloaded["previous"].as_str(), reloaded["changed"].as_bool()), (Some(old.as_str()), Some(true)), "{reloaded}");
    let new = version(&s).await;
    assert_ne!(new, old);
    assert_eq!(reloaded["version"], new.as_str());

    let (status, done) = post(&s, &format!("/v1/runs/{id}/reply?wait=true"), json!({"message": "order 42"})).await;
    assert_eq!((status, done["status"].as_str()), (200, Some("completed")), "{done}");
    assert_eq!(done["catalogue_version"], old.as_str(), "the run keeps its version: {done}");
    let continued = prompts(&s, &id).await;
    assert!(continued.len() >= 2, "{continued:?}");
    assert!(all_marked(&continued, "old"), "every call of the run, after the reply too, on the old prompt: {continued:?}");
    let events = crate::service::sse(&s, &id, None).await;
    assert!(events.iter().all(|(_, kind, _)| kind != "run.catalogue_moved"), "{events:?}");

    let (_, fresh) = post(&s, "/v1/runs?wait=true", start("support-agent", json!({"question": "refund?"}))).await;
    assert_eq!(fresh["catalogue_version"], new.as_str(), "{fresh}");
    let fresh_prompts = prompts(&s, fresh["run_id"].as_str().unwrap()).await;
    assert!(all_marked(&fresh_prompts, "new"), "{fresh_prompts:?}");
    // The metrics count the reload and name the version in force.
    let metrics = client().get(format!("{}/metrics", s.url)).bearer_auth(TOKEN).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("fabric_catalogue_reloads_total{outcome=\"applied\"} 1"), "{metrics}");
    assert!(metrics.contains(&format!("fabric_catalogue_version{{version=\"{new}\"}} 1")), "{metrics}");
}

#[tokio::test]
async fn a_replica_started_after_a_change_takes_a_run_over_on_its_old_version_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    takeover_on_the_old_version(&sqlite_db(&dir)).await;
}

#[tokio::test]
async fn a_replica_started_after_a_change_takes_a_run_over_on_its_old_version_on_postgres() {
    if let Some(url) = crate::store::fresh_postgres().await {
        takeover_on_the_old_version(&url).await;
    }
}

/// A replica dies (`kill -9`) in the middle of a run; the catalogue changes on disk; a second
/// replica started after the change (so it loaded only the new version) takes the run over and
/// finishes it on the version it started on, rebuilt from the store. With
/// `FABRIC_RESUME_ON=current` the same takeover moves the run to the new version and its events
/// say so.
async fn takeover_on_the_old_version(db: &str) {
    for resume_on in ["recorded", "current"] {
        let (cat, stub) = (Catalogue::new(), asking_stub());
        cat.mark(Some("old"));
        // Killed once its first stage is committed, before its last.
        let (id, old, done_before) = killed_mid_run(db, &cat, stub.path(), "support-triage", json!({"ticket": "charged twice"})).await;

        cat.mark(Some("new"));
        let env = [TAKES_OVER[0], TAKES_OVER[1], ("FABRIC_RESUME_ON", resume_on)];
        let second = server(db, &cat, stub.path(), &env);
        let new = version(&second).await;
        assert_ne!(new, old, "the second replica loaded only the new version");
        let view = settled(&second, &id).await;
        assert_eq!(view["status"], "completed", "{resume_on}: {view}");
        // Recorded: the version it started on and finished on; current: the one it moved to.
        let on = if resume_on == "recorded" { &old } else { &new };
        assert_eq!(view["catalogue_version"], on.as_str(), "{resume_on}: the run records the version it runs on: {view}");
        let all = prompts(&second, &id).await;
        let after = &all[done_before..];
        assert!(!after.is_empty(), "{resume_on}: the second replica made model calls: {all:?}");
        let events = crate::service::sse(&second, &id, None).await;
        let moved: Vec<&Value> = events.iter().filter(|(_, kind, _)| kind == "run.catalogue_moved").map(|(_, _, d)| d).collect();
        if resume_on == "recorded" {
            assert!(all_marked(after, "old"), "taken over on the old version, rebuilt from the store: {all:?}");
            assert!(moved.is_empty(), "{events:?}");
        } else {
            assert!(all_marked(after, "new"), "moved to the version loaded: {all:?}");
            assert_eq!(moved.len(), 1, "{events:?}");
            assert_eq!((moved[0]["from"].as_str(), moved[0]["to"].as_str()), (Some(old.as_str()), Some(new.as_str())), "{events:?}");
            assert!(moved[0]["reason"].as_str().unwrap().contains("FABRIC_RESUME_ON=current"), "{events:?}");
            // Before any event of the calls made on the new version.
            let seq_moved = events.iter().find(|(_, k, _)| k == "run.catalogue_moved").unwrap().0;
            let last_old_call = events.iter().filter(|(seq, k, _)| k == "run.llm.completed" && *seq < seq_moved).count();
            assert!(last_old_call <= done_before, "{events:?}");
        }
    }
}

/// A reload of a catalogue with a problem in it (a YAML error, an unbindable schema, a prompt that
/// is not in its pack) is refused whole with each problem located; the version in force stays
/// and new runs start on it; a metric and a log line say so. Then a good change is applied.
#[tokio::test]
async fn a_broken_change_is_refused_with_its_place_and_runs_keep_the_old_version_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    a_broken_change_is_refused(&sqlite_db(&dir)).await;
}

#[tokio::test]
async fn a_broken_change_is_refused_with_its_place_and_runs_keep_the_old_version_on_postgres() {
    if let Some(url) = crate::store::fresh_postgres().await {
        a_broken_change_is_refused(&url).await;
    }
}

async fn a_broken_change_is_refused(db: &str) {
    let (cat, stub) = (Catalogue::new(), asking_stub());
    let s = server(db, &cat, stub.path(), &[]);
    let before = version(&s).await;
    let triage = cat.path("routes/support-triage.yaml");
    let original = std::fs::read_to_string(&triage).unwrap();
    let broken = [
        ("a YAML error", original.replacen("capabilities:", "capabilities: [", 1), "support-triage.yaml:"),
        (
            "an unbindable schema",
            original.replacen("        text: {type: string}", "        text: {type: object, properties: {a: {type: object}}}", 1),
            "is not bindable",
        ),
        ("a missing prompt pack", original.replacen("prompt_pack: support", "prompt_pack: nosuchpack", 1), "nosuchpack"),
    ];
    for (what, text, expect) in &broken {
        assert_ne!(text, &original, "{what}: the change applies");
        std::fs::write(&triage, text).unwrap();
        let (status, body) = reload(&s).await;
        assert_eq!(status, 422, "{what}: {body}");
        assert_eq!(body["error"]["code"], "catalogue_refused", "{what}: {body}");
        let problems: Vec<&str> = body["error"]["problems"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
        assert!(problems.iter().any(|p| p.contains(expect)), "{what}: {problems:?}");
        // Located: `path:line:col: message`.
        let located = problems.iter().find(|p| p.contains("support-triage.yaml:")).unwrap_or_else(|| panic!("{what}: {problems:?}"));
        let place: Vec<&str> = located.split(':').collect();
        assert!(place.len() > 3 && place[1].parse::<u32>().is_ok() && place[2].parse::<u32>().is_ok(), "{what}: {located}");
        assert_eq!(version(&s).await, before, "{what}: the version in force stays");
        let (status, run) = post(&s, "/v1/runs?wait=true", start("support-triage", json!({"ticket": "charged twice"}))).await;
        assert_eq!((status, run["status"].as_str(), run["catalogue_version"].as_str()), (200, Some("completed"), Some(before.as_str())), "{what}: {run}");
    }
    let metrics = client().get(format!("{}/metrics", s.url)).bearer_auth(TOKEN).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("fabric_catalogue_reloads_total{outcome=\"refused\"} 3"), "{metrics}");
    assert!(s.logs().matches("catalogue reload refused").count() >= 3, "{}", s.logs());
    // Put right, the same reload applies; again, nothing changes.
    std::fs::write(&triage, original.replace("Classify a support ticket", "Classify a ticket")).unwrap();
    let (status, body) = reload(&s).await;
    assert_eq!((status, body["changed"].as_bool()), (200, Some(true)), "{body}");
    let (status, body) = reload(&s).await;
    assert_eq!((status, body["changed"].as_bool()), (200, Some(false)), "{body}");
}

/// 200 runs in flight while the catalogue reloads 10 times (20 runs started before each reload,
/// each run lasting several reloads): no run fails, and every model call of a run was made on one
/// version, the one the run records.
#[tokio::test]
async fn reloads_under_load_fail_no_run_and_mix_no_versions_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    reloads_under_load(&sqlite_db(&dir)).await;
}

#[tokio::test]
async fn reloads_under_load_fail_no_run_and_mix_no_versions_on_postgres() {
    if let Some(url) = crate::store::fresh_postgres().await {
        reloads_under_load(&url).await;
    }
}

async fn reloads_under_load(db: &str) {
    let (cat, stub) = (Catalogue::new(), asking_stub());
    cat.mark(Some("mark 0"));
    let s = server(db, &cat, stub.path(), &[("FABRIC_LLM_STUB_LATENCY_MS", "1000")]);
    let mut marks = std::collections::HashMap::new();
    marks.insert(version(&s).await, "mark 0".to_owned());
    let (mut ids, mut in_flight) = (Vec::new(), 0);
    for n in 1..=10 {
        let starts = (0..20).map(|i| {
            let s = &s;
            async move {
                let (status, run) = post(s, "/v1/runs", start("support-triage", json!({"ticket": format!("ticket {n}.{i}")}))).await;
                assert_eq!(status, 201, "{run}");
                run["run_id"].as_str().unwrap().to_owned()
            }
        });
        ids.extend(futures_util::future::join_all(starts).await);
        let running = get(&s, "/v1/runs?status=running&limit=200").await;
        in_flight = in_flight.max(running["runs"].as_array().map_or(0, Vec::len));
        let mark = format!("mark {n}");
        cat.mark(Some(&mark));
        let (status, body) = reload(&s).await;
        assert_eq!((status, body["changed"].as_bool()), (200, Some(true)), "{body}");
        marks.insert(body["version"].as_str().unwrap().to_owned(), mark);
    }
    assert!(in_flight > 20, "runs of earlier rounds were in flight at a reload: at most {in_flight}");
    let mut versions_used = std::collections::HashSet::new();
    for id in &ids {
        let view = settled(&s, id).await;
        assert_eq!(view["status"], "completed", "{view}");
        let v = view["catalogue_version"].as_str().unwrap().to_owned();
        let mark = &marks[&v];
        let all = prompts(&s, id).await;
        assert!(all_marked(&all, mark), "run {id} on {v} ({mark}): {all:?}");
        versions_used.insert(v);
    }
    assert_eq!(versions_used.len(), 10, "each round of starts on the version in force then: {versions_used:?}");
}

/// `SIGHUP` reloads the catalogue and the server goes on serving.
#[tokio::test]
async fn sighup_reloads_and_does_not_stop() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_db(&dir);
    let (cat, stub) = (Catalogue::new(), asking_stub());
    let s = server(&db, &cat, stub.path(), &[]);
    let before = version(&s).await;
    cat.mark(Some("hup"));
    s.signal("HUP");
    let now = version_when(&s, Duration::from_millis(50), |v| v != before).await;
    assert_ne!(now, before, "{}", s.logs());
    let (status, run) = post(&s, "/v1/runs?wait=true", start("support-triage", json!({"ticket": "x"}))).await;
    assert_eq!((status, run["catalogue_version"].as_str()), (200, Some(now.as_str())), "{run}");
    assert!(s.logs().contains("catalogue reloaded"), "{}", s.logs());
    let (exit, _) = s.stop();
    assert_eq!(exit.code(), Some(0));
}

/// With `FABRIC_CATALOGUE_WATCH=1` a change on disk is loaded by itself; a broken one is refused
/// (once) and the version in force stays until the files are put right.
#[tokio::test]
async fn a_watched_catalogue_reloads_a_change_on_disk_and_refuses_a_broken_one() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_db(&dir);
    let (cat, stub) = (Catalogue::new(), asking_stub());
    let s = server(&db, &cat, stub.path(), &[("FABRIC_CATALOGUE_WATCH", "1")]);
    let before = version(&s).await;
    // Broken: refused, once, and the version stays.
    let triage = cat.path("routes/support-triage.yaml");
    let original = std::fs::read_to_string(&triage).unwrap();
    std::fs::write(&triage, original.replacen("capabilities:", "capabilities: [", 1)).unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(version(&s).await, before);
    assert_eq!(s.logs().matches("catalogue reload refused").count(), 1, "{}", s.logs());
    // Put right with a change: loaded.
    std::fs::write(&triage, &original).unwrap();
    cat.mark(Some("watched"));
    let now = version_when(&s, Duration::from_millis(100), |v| v != before).await;
    assert_ne!(now, before, "{}", s.logs());
    let (_, run) = post(&s, "/v1/runs?wait=true", start("support-triage", json!({"ticket": "x"}))).await;
    let calls = prompts(&s, run["run_id"].as_str().unwrap()).await;
    assert!(all_marked(&calls, "watched"), "{calls:?}");
    // Another version loaded by other means, then the watched files back: loaded again.
    cat.mark(Some("by hand"));
    assert_eq!(reload(&s).await.0, 200);
    cat.mark(Some("watched"));
    let back = version_when(&s, Duration::from_millis(100), |v| v == now).await;
    assert_eq!(back, now, "{}", s.logs());
}

/// Two replicas that load the same files from different directories run one version, and say
/// so (`GET /v1/routes`); `fabric routes list` names the same version for those files.
#[tokio::test]
async fn replicas_loading_the_same_files_from_their_own_disks_agree_on_the_version() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_db(&dir);
    let (one, two, stub) = (Catalogue::new(), Catalogue::new(), asking_stub());
    let (a, b) = (server(&db, &one, stub.path(), &[]), server(&db, &two, stub.path(), &[]));
    let version_a = version(&a).await;
    assert_eq!(version_a, version(&b).await);
    let routes: Value = get(&b, "/v1/routes").await;
    assert!(routes.as_array().unwrap().iter().all(|r| r["catalogue_version"] == version_a.as_str()), "{routes}");
    let mut env: Vec<(&str, String)> = one.env().into_iter().collect();
    env.extend([("FABRIC_LLM_STUB", "1".to_owned()), ("FABRIC_LLM_STUB_DIR", stub.path().to_str().unwrap().to_owned())]);
    let o = crate::support::fabric_cli(&["routes", "list"], &env).await;
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains(&format!("catalogue version {version_a}")), "{stderr}");
    let o = crate::support::fabric_cli(&["doctor"], &env).await;
    let doctor = String::from_utf8_lossy(&o.stdout);
    assert!(doctor.contains(&format!("; version {version_a}\n")), "{doctor}");
    // Another file, another version, on the replica that reloads it only.
    two.mark(Some("two"));
    assert_eq!(reload(&b).await.0, 200);
    assert_ne!(version(&b).await, version_a);
    assert_eq!(version(&a).await, version_a);
}

/// `fabric replay ID` replays a run on the version it ran on (rebuilt from the store), so a
/// changed catalogue on disk shows no divergence; naming a catalogue (`--prompt-packs`) compares
/// with it and reports each divergence.
#[tokio::test]
async fn replay_runs_on_the_recorded_version_unless_a_catalogue_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_db(&dir);
    let cat = Catalogue::new();
    let packs = cat.path("prompt-packs");
    let mut env: Vec<(&str, String)> = cat.env().into_iter().collect();
    env.push(("FABRIC_LLM_STUB", "1".to_owned()));
    let o = crate::support::fabric_cli(&["run", "support-triage", "--goal", r#"{"ticket":"charged twice"}"#, "--store", &db], &env).await;
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let id = serde_json::from_slice::<Value>(&o.stdout).unwrap()["run_id"].as_str().unwrap().to_owned();
    cat.mark(Some("changed"));
    let text = |o: &std::process::Output| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let o = crate::support::fabric_cli(&["replay", &id, "--store", &db], &env).await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("0 divergence(s)"), "{}", text(&o));
    // Whatever version the fleet resumes runs on.
    let mut current = env.clone();
    current.push(("FABRIC_RESUME_ON", "current".to_owned()));
    let o = crate::support::fabric_cli(&["replay", &id, "--store", &db], &current).await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = crate::support::fabric_cli(&["--prompt-packs", packs.to_str().unwrap(), "replay", &id, "--store", &db], &env).await;
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("the prompt differs"), "{}", text(&o));
}

#[tokio::test]
async fn a_run_moved_once_goes_on_on_the_version_it_moved_to_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    moved_once(&sqlite_db(&dir)).await;
}

#[tokio::test]
async fn a_run_moved_once_goes_on_on_the_version_it_moved_to_on_postgres() {
    if let Some(url) = crate::store::fresh_postgres().await {
        moved_once(&url).await;
    }
}

/// A run that moved (`FABRIC_RESUME_ON=current` on the replica its first reply reached) records
/// the version it moved to: the replica its second reply reaches, which loaded the first version
/// and resumes runs on their recorded one, goes on on the second, rebuilt from the store, and
/// no second move happens unsaid.
async fn moved_once(db: &str) {
    let stub = asking_stub();
    std::fs::write(
        stub.path().join("support-agent.yaml"),
        "stages:\n  decide:\n    - 'ASK Which order?'\n    - 'ASK Which account?'\n    - 'DONE Refunded.'\n",
    )
    .unwrap();
    let (one, two) = (Catalogue::new(), Catalogue::new());
    one.mark(Some("one"));
    two.mark(Some("two"));
    let a = server(db, &one, stub.path(), &[]);
    let b = server(db, &two, stub.path(), &[("FABRIC_RESUME_ON", "current")]);
    let (v1, v2) = (version(&a).await, version(&b).await);
    let (_, asked) = post(&a, "/v1/runs?wait=true", start("support-agent", json!({"question": "refund?"}))).await;
    assert_eq!((asked["status"].as_str(), asked["catalogue_version"].as_str()), (Some("awaiting_input"), Some(v1.as_str())), "{asked}");
    let id = asked["run_id"].as_str().unwrap().to_owned();
    let (_, again) = post(&b, &format!("/v1/runs/{id}/reply?wait=true"), json!({"message": "order 42"})).await;
    assert_eq!((again["status"].as_str(), again["catalogue_version"].as_str()), (Some("awaiting_input"), Some(v2.as_str())), "moved, and recorded: {again}");
    let (_, done) = post(&a, &format!("/v1/runs/{id}/reply?wait=true"), json!({"message": "account 7"})).await;
    assert_eq!((done["status"].as_str(), done["catalogue_version"].as_str()), (Some("completed"), Some(v2.as_str())), "{done}");
    let calls = prompts(&a, &id).await;
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(all_marked(&calls[..1], "one") && all_marked(&calls[1..], "two"), "{calls:?}");
    let events = crate::service::sse(&a, &id, None).await;
    let moves: Vec<&Value> = events.iter().filter(|(_, k, _)| k == "run.catalogue_moved").map(|(_, _, d)| d).collect();
    assert_eq!(moves.len(), 1, "{events:?}");
    assert_eq!((moves[0]["from"].as_str(), moves[0]["to"].as_str()), (Some(v1.as_str()), Some(v2.as_str())));
}

/// A kept version whose row no longer reads (changed by hand) is not a reason to claim the run
/// for ever: the replica that takes it over goes on on its own version and says why.
#[tokio::test]
async fn a_version_that_does_not_read_moves_the_run_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_db(&dir);
    let (cat, stub) = (Catalogue::new(), asking_stub());
    cat.mark(Some("old"));
    let (id, ..) = killed_mid_run(&db, &cat, stub.path(), "support-triage", json!({"ticket": "x"})).await;
    crate::store::sql(&db, "UPDATE catalogue_versions SET body = '{\"routes\": [], \"packs\": []}'").await;
    cat.mark(Some("new"));
    let second = server(&db, &cat, stub.path(), &TAKES_OVER);
    let view = settled(&second, &id).await;
    assert_eq!(view["status"], "completed", "{view}");
    assert_eq!(view["catalogue_version"].as_str(), Some(version(&second).await.as_str()), "{view}");
    let events = crate::service::sse(&second, &id, None).await;
    let moved: Vec<&Value> = events.iter().filter(|(_, k, _)| k == "run.catalogue_moved").map(|(_, _, d)| d).collect();
    assert_eq!(moved.len(), 1, "{events:?}");
    assert!(moved[0]["reason"].as_str().unwrap().contains("stored sources"), "{moved:?}");
}

/// A reload of the files in force is `unchanged` even when they hold a warning (a start takes
/// them); a reload that finds the stub's scripts gone is refused.
#[tokio::test]
async fn the_files_in_force_reload_unchanged_and_vanished_stub_scripts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_db(&dir);
    let (cat, stub) = (Catalogue::new(), asking_stub());
    let triage = cat.path("routes/support-triage.yaml");
    let text =
        std::fs::read_to_string(&triage).unwrap().replacen("        text: {type: string}", "        text: {type: object, properties: {a: {type: object}}}", 1);
    std::fs::write(&triage, text).unwrap();
    let s = server(&db, &cat, stub.path(), &[]);
    let (status, body) = reload(&s).await;
    assert_eq!((status, body["changed"].as_bool()), (200, Some(false)), "{body}");
    for entry in std::fs::read_dir(stub.path()).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    let (status, body) = reload(&s).await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"]["problems"].to_string().contains("stub's scripts are gone"), "{body}");
}

/// A run whose route a reload removed is still taken over when its replica dies: the replica that
/// takes it finds the version the run recorded, builds it, claims the run and finishes it there.
#[tokio::test]
async fn a_run_of_a_route_removed_since_is_taken_over_on_its_version() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_db(&dir);
    let (cat, stub) = (Catalogue::new(), asking_stub());
    let (id, old, _) = killed_mid_run(&db, &cat, stub.path(), "ticket-router", json!({"ticket": "charged twice"})).await;
    std::fs::remove_file(cat.path("routes/ticket-router.yaml")).unwrap();
    let second = server(&db, &cat, stub.path(), &TAKES_OVER);
    let routes: Value = get(&second, "/v1/routes").await;
    assert!(routes.as_array().unwrap().iter().all(|r| r["id"] != "ticket-router"), "{routes}");
    let mut view = Value::Null;
    for _ in 0..300 {
        view = get(&second, &format!("/v1/runs/{id}")).await;
        if view["status"] == "completed" || view["status"] == "failed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!((view["status"].as_str(), view["catalogue_version"].as_str()), (Some("completed"), Some(old.as_str())), "{view}");
}
