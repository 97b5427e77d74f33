//! The A2A TCK (github.com/a2aproject/a2a-tck, its own `run_tck.py`, in a venv of its own) against
//! `fabric serve` on SQLite and on PostgreSQL: its mandatory category, every test passing but
//! the ones listed in `KNOWN` with why (each checked still to fail: a fix takes it out); its
//! capabilities, quality and features categories on SQLite, likewise with `KNOWN_OPTIONAL`, and
//! the capabilities (push notification configs among them) on PostgreSQL too.
//!
//! The TCK is found at `FABRIC_A2A_TCK_DIR`, else `../shared/a2a-tck` beside the repository
//! (`.ci/run` clones the pinned commit there when it is missing); it is copied into the target
//! directory, where its reports go. The agent under test is the fleet's first route,
//! `support-agent` (asking first), over the stub with calls 6 s long and a blocking send that
//! answers after 1 s, so that tasks stay `working` while the TCK looks at them, as its reference
//! agent's do.

use std::path::PathBuf;

use crate::service::{Server, TOKEN, asking_stub};
use crate::support::{repo, routes_dir, skip_unless};

/// The mandatory tests that fail, and why.
const KNOWN: &[(&str, &str)] = &[];

fn tck_source() -> Option<PathBuf> {
    let dir = std::env::var_os("FABRIC_A2A_TCK_DIR").map_or_else(|| repo().join("../shared/a2a-tck"), PathBuf::from);
    let found = dir.join("run_tck.py").is_file();
    (!skip_unless(found, "the A2A TCK (FABRIC_A2A_TCK_DIR, or ../shared/a2a-tck)", "the TCK runs against fabric serve")).then_some(dir)
}

/// The TCK copied into the target directory (its reports are written beside it), and the
/// Python of a venv with it installed.
fn tck() -> Option<(PathBuf, PathBuf)> {
    let source = tck_source()?;
    let copy = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("a2a-tck");
    if !copy.join("run_tck.py").is_file() {
        let ok = std::process::Command::new("cp").arg("-r").arg(&source).arg(&copy).status().is_ok_and(|s| s.success());
        assert!(ok, "copying the TCK from {}", source.display());
    }
    let ready = "import tck, pytest_jsonreport";
    let python = crate::support::python_venv("a2a-tck-venv", copy.to_str()?, ready, "the TCK runs against fabric serve")?;
    Some((copy, python))
}

/// The optional tests of the capabilities and quality categories that fail, and why.
const KNOWN_OPTIONAL: &[(&str, &str)] = &[(
    "test_rapid_sequential_requests",
    "it sends ten different messages under one `messageId`: a messageId is the start's idempotency key, so the second is refused (-32602, the key was used with another goal) instead of starting a run the client may not have meant",
)];

#[tokio::test]
async fn the_tck_mandatory_level_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    tck_category(&format!("sqlite://{}", dir.path().join("fabric.db").display()), "mandatory", KNOWN, 80).await;
}

#[tokio::test]
async fn the_tck_mandatory_level_on_postgres() {
    if let Some(url) = crate::store::fresh_postgres().await {
        tck_category(&url, "mandatory", KNOWN, 80).await;
    }
}

/// The capability level (the optional tests of what the cards declare: streaming, push
/// notifications, state history), the quality level and the features category, on SQLite.
#[tokio::test]
async fn the_tck_capability_quality_and_feature_levels_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("fabric.db").display());
    tck_push(&store).await;
    tck_category(&store, "quality", KNOWN_OPTIONAL, 13).await;
    tck_category(&store, "features", KNOWN_OPTIONAL, 14).await;
}

/// The capabilities category on PostgreSQL: its push notification config tests too.
#[tokio::test]
async fn the_tck_capability_level_on_postgres() {
    if let Some(url) = crate::store::fresh_postgres().await {
        tck_push(&url).await;
    }
}

/// The TCK's receiver's port is fixed (8888): one capabilities run at a time.
static RECEIVER_PORT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The capabilities category, every push notification config test passing (the cards say
/// `pushNotifications: true`, so none is skipped). Its configs name `https://example.com` and
/// its own receiver at `http://localhost:8888`, so both are allowed origins; one attempt each.
async fn tck_push(store: &str) {
    let _port = RECEIVER_PORT.lock().await;
    let push = [
        ("FABRIC_WEBHOOK_ALLOWED_ORIGINS", "https://example.com,http://localhost:8888"),
        ("FABRIC_WEBHOOK_SECRET", crate::webhooks::SECRET),
        ("FABRIC_WEBHOOK_MAX_ATTEMPTS", "1"),
    ];
    let Some(text) = tck_category_with(store, "capabilities", KNOWN_OPTIONAL, 25, &push).await else { return };
    let tests: Vec<&str> = text.lines().filter(|l| l.contains("test_push_notification_config_methods.py::")).collect();
    // The push tests' outcome, for `--nocapture` (docs/a2a.md reports it).
    eprintln!("{store}:\n{}", tests.join("\n"));
    assert!(tests.iter().filter(|l| l.contains("PASSED")).count() >= 10, "{store}: the push tests ran and passed: {tests:#?}\n{text}");
}

async fn tck_category(store: &str, category: &str, known: &[(&str, &str)], at_least: usize) {
    tck_category_with(store, category, known, at_least, &[]).await;
}

/// One category against a fresh `fabric serve` on `store` with `extra` settings: every test
/// passes but the `known` failures; pytest's output (verbose: a line per test).
async fn tck_category_with(store: &str, category: &str, known: &[(&str, &str)], at_least: usize, extra: &[(&str, &str)]) -> Option<String> {
    let (tck, python) = tck()?;
    let routes = tempfile::tempdir().unwrap();
    for f in ["profiles.yaml", "support-agent.yaml", "support-triage.yaml"] {
        std::fs::copy(routes_dir().join(f), routes.path().join(f)).unwrap();
    }
    let stub = asking_stub();
    let catalogue = routes.path().to_str().unwrap().to_owned();
    let mut env = vec![("FABRIC_CATALOGUE_DIR", catalogue.as_str()), ("FABRIC_WAIT_MAX_S", "1"), ("FABRIC_LLM_STUB_LATENCY_MS", "6000")];
    env.extend_from_slice(extra);
    let server = Server::start(store, stub.path(), &env);
    // `localhost`: the TCK takes a card that names 127.0.0.1 for one that leaks an internal address.
    let sut = format!("{}/a2a/support-agent", server.url.replace("127.0.0.1", "localhost"));
    let asked = category.to_owned();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&python)
            .current_dir(&tck)
            .args(["run_tck.py", "--sut-url", &sut, "--category", &asked, "--verbose"])
            .env("A2A_AUTH_TYPE", "bearer")
            .env("A2A_AUTH_TOKEN", TOKEN)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    // pytest's summary: a `FAILED path::test` line per failure (`ERROR path::test` where its set
    // up failed), then `N failed, M passed, ...`.
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let failed: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("FAILED ").or_else(|| l.strip_prefix("ERROR tests/")))
        .map(|l| l.split_whitespace().next().unwrap_or_default())
        .collect();
    let summary = text.lines().rev().find(|l| l.contains(" passed")).unwrap_or_else(|| panic!("{store}: no TCK summary: {text}"));
    let passed: usize = summary.split(" passed").next().and_then(|h| h.rsplit([' ', ',']).next()).and_then(|n| n.parse().ok()).unwrap_or(0);
    let unexpected: Vec<&&str> = failed.iter().filter(|f| !known.iter().any(|(k, _)| f.ends_with(k))).collect();
    assert!(unexpected.is_empty(), "{store}: {category} TCK tests failed: {unexpected:#?}\n{text}");
    for (k, why) in known.iter().filter(|(k, _)| text.contains(k)) {
        assert!(failed.iter().any(|f| f.ends_with(k)), "{k} passes now ({why} no longer holds): take it out of the known failures");
    }
    assert!(passed >= at_least, "{store}: {passed} {category} tests passed\n{text}");
    Some(text)
}
