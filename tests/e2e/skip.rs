//! The one rule for a test that needs a server or a tool this machine may lack: say so and
//! record it (`.ci/test` lists the skips), or fail under `CI=true`. Shared by the e2e suite and
//! the simulation (`tests/e2e/sim`).

use std::path::{Path, PathBuf};

/// The one place a test decides to skip: returns `true` (the test should return at once) when
/// `present` is false, i.e. what the test needs (`what`) is missing, for the reason `why`.
///
/// Cargo shows the output of failing tests only, so a skip that merely printed would pass
/// unseen: each skip is also appended, as `<test>: <what>: <why>`, to the skip file that
/// `.ci/test` (the README's test command) clears before and lists after `cargo test`. Under
/// `CI=true` nothing may skip (`.ci/run` provides every server and tool): the test fails with the
/// reason instead.
pub fn skip_unless(present: bool, what: &str, why: &str) -> bool {
    let ci = std::env::var("CI").as_deref() == Ok("true");
    decide_skip(present, ci, &skip_file(), what, why)
}

/// Where skips are recorded: `FABRIC_TEST_SKIPS` (set by `.ci/test`), else
/// `test-skips.txt` in cargo's scratch directory for integration tests (`target/tmp/`).
pub fn skip_file() -> PathBuf {
    std::env::var_os("FABRIC_TEST_SKIPS").filter(|p| !p.is_empty()).map_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("test-skips.txt"), PathBuf::from)
}

/// `skip_unless` with its environment given (whether under CI, the skip file), for its own test.
fn decide_skip(present: bool, ci: bool, file: &Path, what: &str, why: &str) -> bool {
    if present {
        return false;
    }
    // libtest names each test's thread after the test (under `--test-threads=1` it is `main`).
    let test = std::thread::current().name().filter(|n| *n != "main").map(str::to_owned);
    let line = match &test {
        Some(t) => format!("{t}: {what}: {why}"),
        None => format!("{what}: {why}"),
    };
    assert!(!ci, "CI=true, where no test may skip: {line}");
    eprintln!("skipped: {line}");
    use std::io::Write;
    // One write per line, in append mode: lines of tests running at once do not interleave.
    let recorded = std::fs::OpenOptions::new().create(true).append(true).open(file).and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = recorded {
        panic!("cannot record the skip in {}: {e} ({line})", file.display());
    }
    true
}

#[test]
fn a_skip_is_recorded_with_the_test_and_the_reason_and_fails_under_ci() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("skips.txt");
    assert!(!decide_skip(true, false, &file, "a server", "it is there"), "present: the test goes on");
    assert!(!decide_skip(true, true, &file, "a server", "it is there"), "present under CI: the test goes on");
    assert!(!file.exists(), "nothing recorded when nothing skipped");
    assert!(decide_skip(false, false, &file, "PostgreSQL", "FABRIC_TEST_POSTGRES_URL is unset"));
    assert!(decide_skip(false, false, &file, "chromedriver", "not installed"));
    let me = std::thread::current().name().unwrap_or("main").to_owned();
    let prefix = if me == "main" { String::new() } else { format!("{me}: ") };
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        format!("{prefix}PostgreSQL: FABRIC_TEST_POSTGRES_URL is unset\n{prefix}chromedriver: not installed\n")
    );
    let under_ci = std::panic::catch_unwind(|| decide_skip(false, true, &file, "wrk", "not installed"));
    let message = under_ci.unwrap_err().downcast::<String>().unwrap();
    assert!(message.contains("CI=true") && message.contains("wrk: not installed"), "{message}");
    assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 2, "a skip refused under CI is not recorded");
}
