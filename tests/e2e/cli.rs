//! The `fabric` binary as a user runs it: exit codes, stdout/stderr, files.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use crate::support::{fixture_env, fixtures, packs_dir, portable, repo, routes_dir, stub_dir, two_streams};

/// Runs `fabric` in the repository on the fixture catalogue (`support::fixture_env`), with `env`.
fn fabric(args: &[&str], env: &[(&str, &str)]) -> Output {
    fabric_in(args, env, true)
}

/// Runs `fabric` in the repository; on the fixture catalogue, or on its defaults (the shipped
/// `routes/`, `prompt-packs/` and `stub/`) when `fixture` is false.
fn fabric_in(args: &[&str], env: &[(&str, &str)], fixture: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fabric"));
    cmd.current_dir(repo()).args(args);
    for var in [
        "FABRIC_LLM_STUB",
        "FABRIC_LLM_STUB_STRICT",
        "FABRIC_LLM_STUB_LATENCY_MS",
        "FABRIC_FLEET",
        "KB_SEARCH_URL",
        "FABRIC_CATALOGUE_DIR",
        "FABRIC_PROMPT_PACKS_DIR",
        "FABRIC_LLM_STUB_DIR",
    ] {
        cmd.env_remove(var);
    }
    if fixture {
        cmd.envs(fixture_env());
    }
    cmd.envs(env.iter().copied());
    cmd.output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

const STUB: (&str, &str) = ("FABRIC_LLM_STUB", "1");
const GOAL: &str = r#"{"ticket":"I was charged twice"}"#;

#[test]
fn readme_demo_runs_offline_and_writes_events() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let out = fabric(&["run", "support-triage", "--goal", GOAL, "--events-out", events.to_str().unwrap()], &[STUB, ("FABRIC_LLM_STUB_STRICT", "1")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let result: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(result["status"], "completed");
    assert_eq!(result["output"], "You were charged twice; the duplicate charge has been refunded.");
    assert!(result["run_id"].as_str().unwrap().len() == 36);
    assert_eq!(result.as_object().unwrap().keys().collect::<Vec<_>>(), ["run_id", "route_id", "status", "output", "slots", "notes"]);
    let lines: Vec<Value> = std::fs::read_to_string(&events).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.first().unwrap()["type"], "run.started");
    assert_eq!(lines.last().unwrap()["type"], "run.completed");
    assert!(stderr(&out).is_empty(), "no progress output when stderr is not a terminal: {}", stderr(&out));
}

/// The shipped examples as a user first runs them, from the repository with the defaults: each
/// route the fixture copies runs to completion on the shipped stub scripts, every scripted reply
/// used. Other routes a user keeps in `routes/` are not looked at.
#[test]
fn every_shipped_route_runs_with_the_stub() {
    let cat = crate::support::fixture_catalogue();
    let mut ran = 0;
    for entry in cat.routes() {
        let fabric::catalogue::RouteEntry::Ready(route) = entry else { panic!("{entry:?}") };
        let id = route.id();
        let goal = if id == "support-agent" { r#"{"question":"what is 2+3, then +7?"}"# } else { GOAL };
        let out = fabric_in(&["run", id, "--goal", goal], &[STUB, ("FABRIC_LLM_STUB_STRICT", "1")], false);
        assert_eq!(out.status.code(), Some(0), "{id}: {}", stderr(&out));
        let result: Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!((result["route_id"].as_str(), result["status"].as_str()), (Some(id), Some("completed")), "{result}");
        ran += 1;
    }
    assert!(ran >= 1);
}

#[test]
fn events_to_stderr_with_dash() {
    let out = fabric(&["run", "support-triage", "--goal", GOAL, "--events-out", "-"], &[STUB]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stderr(&out).lines().count(), 15, "14 events and the synthesis's one delta");
}

#[test]
fn exit_codes() {
    // 1: the run failed (a scripted schema violation).
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("support-triage.yaml"), "stages:\n  intake: ['{\"category\":\"sales\",\"urgency\":\"high\"}']\n").unwrap();
    let out = fabric(&["--stub-dir", dir.path().to_str().unwrap(), "run", "support-triage", "--goal", GOAL], &[STUB]);
    assert_eq!(out.status.code(), Some(1));
    let result: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(result["status"], "failed");
    assert_eq!(result["error"]["reason_class"], "schema_validation");
    // 2: bad usage, configuration, catalogue.
    for (args, env, needle) in [
        (vec!["run", "support-triage", "--goal", "[1,2]"], vec![STUB], "--goal: the goal must be a JSON object, got an array"),
        (vec!["run", "support-triage", "--goal", "{oops"], vec![STUB], "--goal: the goal is not valid JSON"),
        (vec!["run", "support-triage", "--goal", GOAL], vec![("FABRIC_LLM_STUB", "perhaps")], "FABRIC_LLM_STUB: `perhaps` is not a boolean"),
        (vec!["run", "support-triage", "--goal", GOAL], vec![STUB, ("FABRIC_LLM_STUB_LATENCY_MS", "-5")], "FABRIC_LLM_STUB_LATENCY_MS"),
        (vec!["run", "nope", "--goal", GOAL], vec![STUB], "unknown route `nope`"),
        (vec!["run", "refund-review", "--goal", GOAL], vec![STUB, ("FABRIC_FLEET", "agent-runtime-shared")], "served by fleet `agent-runtime-custom`"),
        (vec!["run", "support-triage"], vec![STUB], "--goal"),
    ] {
        let out = fabric(&args, &env);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn strict_stub_reports_unused_script_lines() {
    let dir = tempfile::tempdir().unwrap();
    let mut script = std::fs::read_to_string(stub_dir().join("support-triage.yaml")).unwrap();
    script = script.replace("  answer:\n", "  answer:\n    - '{\"text\":\"spare\"}'\n");
    std::fs::write(dir.path().join("support-triage.yaml"), script).unwrap();
    let out = fabric(&["--stub-dir", dir.path().to_str().unwrap(), "run", "support-triage", "--goal", GOAL], &[STUB, ("FABRIC_LLM_STUB_STRICT", "true")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("strict stub: route `support-triage` stage `answer`: 1 of 2 scripted replies unused"), "{}", stderr(&out));
}

#[test]
fn broken_stub_scripts_are_located() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("support-triage.yaml"), "stages:\n  intake: 42\n").unwrap();
    let out = fabric(&["--stub-dir", dir.path().to_str().unwrap(), "run", "support-triage", "--goal", GOAL], &[STUB]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("support-triage.yaml:2:11: replies of stage `intake` must be a list, found an integer"), "{}", stderr(&out));
}

#[test]
fn routes_list_and_check() {
    let out = fabric(&["routes", "list"], &[]);
    assert_eq!(out.status.code(), Some(0));
    insta::assert_snapshot!("routes_list", stdout(&out));
    let out = fabric(&["routes", "check"], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stderr(&out), "4 of 4 routes ready; 0 errors, 0 warnings\n");
    // The invalid fixtures as one catalogue: every error listed with its location, exit 2.
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixtures().join("invalid")).unwrap().chain(std::fs::read_dir(fixtures().join("invalid-base/routes")).unwrap()) {
        let p = e.unwrap().path();
        if !p.file_name().unwrap().to_str().unwrap().starts_with("pack-") {
            std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
        }
    }
    let out = fabric(
        &["--catalogue", dir.path().to_str().unwrap(), "--prompt-packs", fixtures().join("invalid-base/packs").to_str().unwrap(), "routes", "check"],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    let text = stdout(&out).replace(&format!("{}/", dir.path().display()), "");
    insta::assert_snapshot!("routes_check_invalid", text);
}

#[test]
fn hydrate_formats() {
    for format in ["text", "dot", "mermaid"] {
        let out = fabric(&["hydrate", "support-triage", "--format", format], &[]);
        assert_eq!(out.status.code(), Some(0));
        insta::assert_snapshot!(format!("hydrate_support_triage_{format}"), portable(&stdout(&out)));
    }
}

#[test]
fn hydrate_svg_is_the_library_picture() {
    let out = fabric(&["hydrate", "support-agent", "--format", "svg"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let cat = crate::support::fixture_catalogue();
    assert_eq!(stdout(&out), fabric::svg::render_svg(cat.route("support-agent").unwrap()));
    let out = fabric(&["hydrate", "nope", "--format", "svg"], &[]);
    assert_eq!((out.status.code(), stdout(&out).as_str()), (Some(2), ""));
}

#[test]
fn validate_reports_non_bindable_schemas() {
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("nested.json");
    std::fs::write(&schema, r#"{"type":"object","properties":{"customer":{"type":"object"}}}"#).unwrap();
    let reply = dir.path().join("reply.txt");
    std::fs::write(&reply, "free text").unwrap();
    let out = fabric(&["validate", "--schema", schema.to_str().unwrap(), reply.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stdout(&out), "free text\n");
    assert!(stderr(&out).contains("is not bindable (property `customer` is a nested object)"), "{}", stderr(&out));
}

#[test]
fn support_agent_runs_offline_and_ask_exits_3() {
    let out = fabric(&["run", "support-agent", "--goal", r#"{"question":"5+7?"}"#], &[STUB, ("FABRIC_LLM_STUB_STRICT", "1")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let result: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(result["output"], "12");
    assert_eq!(result["notes"], serde_json::json!([r#"add: {"sum":5}"#, r#"add: {"sum":12}"#]));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("support-agent.yaml"), "stages:\n  decide: ['ASK Which order?']\n").unwrap();
    let out = fabric(&["--stub-dir", dir.path().to_str().unwrap(), "run", "support-agent", "--goal", "{}"], &[STUB]);
    assert_eq!(out.status.code(), Some(3));
    let result: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!((result["status"].as_str(), result["question"].as_str()), (Some("awaiting_input"), Some("Which order?")));
}

#[test]
fn prefetch_packs_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("pack.json");
    std::fs::write(&pack, r#"{"chunks": ["Duplicate charges are refunded within 5 days."]}"#).unwrap();
    let events = dir.path().join("ev.jsonl");
    let out = fabric(&["run", "support-triage", "--goal", GOAL, "--prefetch", pack.to_str().unwrap(), "--events-out", events.to_str().unwrap()], &[STUB]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let first: Value = serde_json::from_str(std::fs::read_to_string(&events).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(first["prefetch_chunks"], 1);
    std::fs::write(&pack, r#"[1, 2]"#).unwrap();
    let out = fabric(&["run", "support-triage", "--goal", GOAL, "--prefetch", pack.to_str().unwrap()], &[STUB]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("chunk 0 is not a string"), "{}", stderr(&out));
}

/// `fabric bench ARGS...`: the forwarder, with `fabric-bench` beside it (a test checks
/// [`bench_built`] first).
fn bench(args: &[&str]) -> Output {
    fabric(&[&["bench"], args].concat(), &[])
}

/// Whether `fabric-bench` is built beside the `fabric` under test (`support::fabric_bench`):
/// without it a bench test skips, and fails under `CI=true`.
fn bench_built() -> bool {
    crate::support::fabric_bench().is_some()
}

/// `fabric bench` is `fabric-bench` with the same arguments, its help and its usage errors
/// included; without `fabric-bench` beside it or on PATH, it says where it looked.
#[test]
fn bench_hands_over_to_fabric_bench() {
    if !bench_built() {
        return;
    }
    let out = bench(&["--help"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for text in ["Usage: fabric bench [OPTIONS]", "--scenario <SCENARIO>", "--instructions", "--ceiling <SECS>"] {
        assert!(stdout(&out).contains(text), "`{text}` in {}", stdout(&out));
    }
    let out = bench(&["--scenario", "X"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("invalid value 'X' for '--scenario"), "{}", stderr(&out));
    // A `fabric` alone in its directory, nothing on PATH.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let lone = dir.path().join("fabric");
    std::fs::hard_link(env!("CARGO_BIN_EXE_fabric"), &lone).or_else(|_| std::fs::copy(env!("CARGO_BIN_EXE_fabric"), &lone).map(drop)).unwrap();
    let out = Command::new(&lone).args(["bench", "--help"]).env("PATH", dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let looked = format!("looked for {} or fabric-bench on PATH", dir.path().join("fabric-bench").display());
    assert!(stderr(&out).contains(&looked), "{}", stderr(&out));
}

#[test]
fn bench_prints_every_scenario() {
    if !bench_built() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let journal = format!("sqlite://{}", dir.path().join("bench.db").display());
    let out = bench(&[
        "--runs",
        "30",
        "--warmup",
        "3",
        "--concurrency",
        "20",
        "--latency-ms",
        "1",
        "--routes",
        "20",
        "--clients",
        "8",
        "--requests",
        "2",
        "--journal",
        &journal,
        "--replicas",
        "1,2",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines: Vec<Value> = stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let names: Vec<&str> = lines.iter().map(|l| l["scenario"].as_str().unwrap()).collect();
    assert_eq!(names, ["A", "A2", "B", "B-http", "C", "C2", "H", "R", "R", "S", "T"]);
    for l in &lines {
        match l["scenario"].as_str().unwrap() {
            "A" | "A2" | "B" | "B-http" => {
                assert_eq!(l["failed_runs"], 0, "{l}");
                for k in ["runs_per_s", "cpu_us_per_run"] {
                    assert!(l[k].as_f64().unwrap() > 0.0, "{k} in {l}");
                }
                // A CPU clock that went backwards (threads of the previous scenario ending) showed
                // as ~1e12 µs per run; no run of this test costs a CPU-second.
                assert!(l["cpu_us_per_run"].as_f64().unwrap() < 1e6, "{l}");
                assert!(l["run_us"]["p99"].as_f64().unwrap() >= l["run_us"]["p50"].as_f64().unwrap());
            }
            "C" => {
                assert_eq!((l["failed_runs"].as_u64(), l["ideal_ms"].as_f64()), (Some(0), Some(3.0)), "{l}");
                assert!(l["peak_rss_mib"].as_f64().unwrap() > 0.0);
            }
            "C2" => assert_eq!((l["failed_runs"].as_u64(), l["runs"].as_u64(), l["journal"].as_str()), (Some(0), Some(20), Some("sqlite")), "{l}"),
            "R" => {
                assert_eq!((l["runs"].as_u64(), l["completed"].as_u64()), (Some(30), Some(30)), "{l}");
                assert!(l["runs_per_s"].as_f64().unwrap() > 0.0, "{l}");
            }
            "H" => assert_eq!((l["routes_ready"].as_u64(), l["errors"].as_u64()), (Some(20), Some(0)), "{l}"),
            "S" => {
                assert_eq!((l["runs"].as_u64(), l["errors"].as_u64()), (Some(16), Some(0)), "{l}");
                assert!(l["latency_ms"]["p50"].as_f64().unwrap() >= 3.0, "three stub calls of 1 ms: {l}");
                // The store of --journal, and what the runs added to it (the warm-up's 5 too).
                assert_eq!((l["journal"].as_str(), l["stored_runs"].as_u64()), (Some("sqlite"), Some(21)), "{l}");
                assert!(l["stored_bytes_per_run"].as_f64().unwrap() > 0.0, "{l}");
                assert!(l["server_rss_kib_per_inflight_run"].as_f64().is_some(), "{l}");
            }
            "T" => assert_eq!((l["runs"].as_u64(), l["failed_runs"].as_u64()), (Some(30), Some(0)), "{l}"),
            _ => unreachable!(),
        }
    }
    assert!(stderr(&out).contains("debug build") || cfg!(not(debug_assertions)));
}

#[test]
fn a_route_with_an_unknown_role_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["profiles.yaml", "support-triage.yaml"] {
        std::fs::copy(routes_dir().join(f), dir.path().join(f)).unwrap();
    }
    std::fs::copy(fixtures().join("invalid/unknown-role.yaml"), dir.path().join("unknown-role.yaml")).unwrap();
    let cat = dir.path().to_str().unwrap();
    let out = fabric(&["--catalogue", cat, "run", "unknown-role", "--goal", GOAL], &[STUB]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stdout(&out).is_empty(), "nothing ran");
    assert!(stderr(&out).contains("unknown-role.yaml:5:19: unknown llm_role `summarize`"), "{}", stderr(&out));
    // The other routes of the same catalogue still run.
    let out = fabric(&["--catalogue", cat, "run", "support-triage", "--goal", GOAL], &[STUB]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// Live progress appears when stderr is a terminal (here a pseudo-terminal made by `script`).
#[test]
fn live_progress_on_a_terminal() {
    let present = Command::new("script").arg("--version").output().is_ok();
    if crate::support::skip_unless(present, "script", "`script` (util-linux) is not installed, so no pseudo-terminal can be made") {
        return;
    }
    let bin = env!("CARGO_BIN_EXE_fabric");
    let cmd = format!("{bin} run support-triage --goal '{GOAL}' > /dev/null");
    let out = Command::new("script").current_dir(repo()).envs(fixture_env()).env("FABRIC_LLM_STUB", "1").args(["-qec", &cmd, "/dev/null"]).output().unwrap();
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{screen}");
    for line in ["▶ support-triage (workflow path)", "• intake [classify] …", "model ", "✓ answer", "✔ completed in"] {
        assert!(screen.contains(line), "missing `{line}` in:\n{screen}");
    }
}

#[test]
fn a_cli_run_can_be_recorded_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("runs.db").display());
    let out = fabric(&["run", "support-triage", "--goal", GOAL, "--store", &store], &[STUB]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let result: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let id = result["run_id"].as_str().unwrap();
    let out = fabric(&["runs", "--store", &store, "list"], &[]);
    assert!(stdout(&out).starts_with(&format!("{id}\tsupport-triage\tcompleted\t")), "{}", stdout(&out));
    let out = fabric(&["runs", "--store", &store, "show", id, "--events"], &[]);
    let lines: Vec<Value> = stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!((lines[0]["status"].as_str(), lines[0]["output"].as_str()), (Some("completed"), result["output"].as_str()));
    // No one watched it (no `--events-out`, no terminal): its synthesis streamed nothing.
    assert_eq!(lines.len(), 1 + 14, "the run and its 14 events");
    let out = fabric(&["runs", "--store", &store, "show", "nope"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let out = fabric(&["run", "support-triage", "--goal", GOAL, "--store", "mysql://x"], &[STUB]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn replay_reproduces_every_example_route_and_reports_a_changed_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("runs.db").display());
    let mut ids = Vec::new();
    for (route, goal) in [("support-triage", GOAL), ("ticket-router", GOAL), ("refund-review", GOAL), ("support-agent", r#"{"question":"2+3, then +7?"}"#)] {
        let out = fabric(&["run", route, "--goal", goal, "--store", &store], &[STUB]);
        assert_eq!(out.status.code(), Some(0), "{route}: {}", stderr(&out));
        let result: Value = serde_json::from_str(&stdout(&out)).unwrap();
        ids.push((route, result["run_id"].as_str().unwrap().to_owned()));
    }
    for (route, id) in &ids {
        // No stub here: a model call would need a provider, and none is made.
        let out = fabric(&["replay", id, "--store", &store], &[]);
        assert_eq!(out.status.code(), Some(0), "{route}: {}{}", stdout(&out), stderr(&out));
        assert!(stdout(&out).contains("0 divergence(s); status completed"), "{route}: {}", stdout(&out));
    }
    // The same runs against a changed prompt pack.
    let packs = dir.path().join("packs");
    std::fs::create_dir_all(&packs).unwrap();
    for f in ["support.yaml", "refunds.yaml"] {
        let text = std::fs::read_to_string(packs_dir().join(f)).unwrap().replace("Be accurate and brief.", "Be thorough.");
        std::fs::write(packs.join(f), text).unwrap();
    }
    let out = fabric(&["--prompt-packs", packs.to_str().unwrap(), "replay", &ids[0].1, "--store", &store], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("divergence: stage `intake` turn 0: the prompt differs"), "{}", stdout(&out));
    let out = fabric(&["replay", "nope", "--store", &store], &[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_skipped_bench_scenario_says_why_in_the_table() {
    if !bench_built() {
        return;
    }
    let out = bench(&["--scenario", "R"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).lines().any(|l| l.starts_with("R ") && l.contains("needs --journal")), "{}", stderr(&out));
    assert!(!stderr(&out).contains("replicas 0"), "{}", stderr(&out));
}

/// Whether a bench test's outside tool is `present`: without it the test skips
/// (`support::skip_unless`), except under `CI=true`, where `.ci/run` installs it and its absence
/// fails the test.
fn installed(tool: &str, present: bool) -> bool {
    !crate::support::skip_unless(present, tool, &format!("{tool} is not installed (.ci/run installs it)"))
}

/// `--ceiling` measures the tool server alone with wrk before a level of C and reports the level
/// against the floor that capacity sets. Needs wrk (installed by `.ci/run`).
#[test]
fn bench_reports_c_against_the_tool_servers_capacity() {
    if !bench_built() {
        return;
    }
    // wrk answers `--version` with exit status 1: that it runs is enough.
    if !installed("wrk", std::process::Command::new("wrk").arg("--version").output().is_ok()) {
        return;
    }
    let out = bench(&["--scenario", "C", "--concurrency", "20", "--latency-ms", "1", "--ceiling", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let line: Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    let server = &line["tool_server"];
    assert_eq!(server["load_generator"], "wrk -t1 -c64 -d1s", "{line}");
    let rps = server["requests_per_s"].as_f64().unwrap();
    assert!(rps > 0.0, "{line}");
    // The floor: the ideal (3 × 1 ms) and 20 calls at the measured rate.
    let floor = server["floor_ms"].as_f64().unwrap();
    assert!((floor - (3.0 + 20.0 / rps * 1e3)).abs() < 0.01, "{line}");
    let over = line["wall_over_floor"].as_f64().unwrap();
    assert!((over - line["wall_ms"].as_f64().unwrap() / floor).abs() < 0.01, "{line}");
    assert!(stderr(&out).contains("tool server alone"), "{}", stderr(&out));
    // Without the tool there is no tool server to measure: no floor, no error.
    let out = bench(&["--scenario", "C", "--concurrency", "5", "--latency-ms", "1", "--ceiling", "1", "--no-tool"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let line: Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    assert!(line.get("tool_server").is_none(), "{line}");
}

/// `fabric bench --instructions`: the scenario under callgrind at half the runs and all of them,
/// and the marginal instructions per run. Needs valgrind (installed by `.ci/run`).
#[test]
fn bench_counts_instructions_with_callgrind() {
    if !bench_built() {
        return;
    }
    if !installed("valgrind", std::process::Command::new("valgrind").arg("--version").output().is_ok_and(|o| o.status.success())) {
        return;
    }
    let out = bench(&["--instructions", "--scenario", "A", "--runs", "40", "--warmup", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let line: Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    assert_eq!((line["scenario"].as_str(), line["measure"].as_str()), (Some("A"), Some("instructions")), "{line}");
    assert_eq!(line["runs"], serde_json::json!([20, 40]));
    let counts: Vec<u64> = line["instructions"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert!(counts[1] > counts[0], "more runs, more instructions: {line}");
    let per_run = line["instructions_per_run"].as_f64().unwrap();
    assert_eq!(per_run, ((counts[1] - counts[0]) as f64 / 20.0).round(), "{line}");
    // Only the sequential scenarios can be counted this way.
    let out = bench(&["--instructions", "--scenario", "C"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("A, A2, B and B-http"), "{}", stderr(&out));
}

#[test]
fn routes_list_counts_each_routes_problems() {
    let dir = tempfile::tempdir().unwrap();
    // `two` has two problems: an unknown pack, and its workflow's unknown capability (checked
    // although the pack is missing); `one` has one.
    std::fs::write(
        dir.path().join("r.yaml"),
        "profiles: {default: {}}\nworkflows:\n  w: {stages: [{id: a, llm_role: classify, capability: faq_topics}]}\n  ok: {stages: [{id: a, llm_role: classify}]}\n\
         routes:\n  two: {model_profile: default, prompt_pack: nopack, workflow: w}\n  one: {model_profile: default, prompt_pack: support, workflow: nope}\n",
    )
    .unwrap();
    let out = fabric(&["--catalogue", dir.path().to_str().unwrap(), "routes", "list"], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stdout(&out), "two\t-\t-\tbroken (2 problems)\none\t-\t-\tbroken (1 problem)\n");
}

#[test]
fn a_missing_catalogue_or_pack_directory_names_its_setting() {
    let catalogue = "fabric: catalogue directory `nowhere` does not exist (set by --catalogue or FABRIC_CATALOGUE_DIR; default `routes`)\n";
    let packs = "fabric: prompt pack directory `no-packs` does not exist (set by --prompt-packs or FABRIC_PROMPT_PACKS_DIR; default `prompt-packs`)\n";
    for args in [&["routes", "list"][..], &["routes", "check"], &["hydrate", "support-triage"], &["run", "support-triage", "--goal", GOAL]] {
        let out = fabric(&[&["--catalogue", "tests/fixtures/catalogue/routes:nowhere"][..], args].concat(), &[STUB]);
        assert_eq!((out.status.code(), stderr(&out).as_str(), stdout(&out).as_str()), (Some(2), catalogue, ""), "{args:?}");
        // Both at once, and through the variables too.
        let out = fabric(args, &[STUB, ("FABRIC_CATALOGUE_DIR", "nowhere"), ("FABRIC_PROMPT_PACKS_DIR", "no-packs")]);
        assert_eq!((out.status.code(), stderr(&out)), (Some(2), format!("{catalogue}{packs}")), "{args:?}");
    }
    // `doctor` marks the missing directory among the others.
    let out = fabric(&["--catalogue", "tests/fixtures/catalogue/routes:nowhere", "doctor"], &[STUB]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stdout(&out).contains(
            "catalogue directories:\n  tests/fixtures/catalogue/routes\n  nowhere: MISSING: catalogue directory `nowhere` does not exist (set by --catalogue"
        ),
        "{}",
        stdout(&out)
    );
}

/// The `run.llm.delta` texts of `stage` in an events file, in order.
fn delta_texts(events: &Path, stage: &str) -> Vec<String> {
    std::fs::read_to_string(events)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == "run.llm.delta" && e["stage_id"] == stage)
        .map(|e| e["text"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn stream_prints_each_streaming_stage_s_text_on_stdout_and_its_events_to_events_out() {
    let (catalogue, stub) = two_streams();
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let env = [("FABRIC_CATALOGUE_DIR", catalogue.as_str()), ("FABRIC_LLM_STUB_DIR", stub.to_str().unwrap()), STUB, ("FABRIC_LLM_STUB_LATENCY_MS", "400")];
    let out = fabric(&["run", "two-streams", "--goal", GOAL, "--stream", "--events-out", events.to_str().unwrap()], &env);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (draft, answer) = (delta_texts(&events, "draft"), delta_texts(&events, "answer"));
    assert!(draft.len() >= 2 && answer.len() >= 2, "each text came in pieces: {draft:?} {answer:?}");
    let (draft, answer): (String, String) = (draft.concat(), answer.concat());
    // stdout: each stage's text as streamed, a newline after each; no result JSON.
    assert_eq!(stdout(&out), format!("{draft}\n{answer}\n"));
    // The text streamed is each stage's output (a text stage's reply is its output).
    let lines: Vec<Value> = std::fs::read_to_string(&events).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let output_of = |stage: &str| lines.iter().find(|e| e["type"] == "run.stage.completed" && e["stage_id"] == stage).unwrap()["output"].clone();
    assert_eq!((output_of("draft"), output_of("answer")), (Value::from(draft.as_str()), Value::from(answer.as_str())));
    let end = lines.last().unwrap();
    assert_eq!(end["type"], "run.completed");
    // stderr: a header per stage, then the run's id and status.
    let err = stderr(&out);
    let run_id = end["run_id"].as_str().unwrap();
    assert_eq!(err, format!("── stage draft ──\n── stage answer ──\nfabric: run {run_id} completed\n"));
    // With `--events-out -`, stderr is the events alone.
    let out = fabric(&["run", "two-streams", "--goal", GOAL, "--stream", "--events-out", "-"], &env[..3]);
    assert_eq!((out.status.code(), stdout(&out)), (Some(0), format!("{draft}\n{answer}\n")));
    let err = stderr(&out);
    assert!(err.lines().all(|l| serde_json::from_str::<Value>(l).is_ok()), "{err}");
}

#[test]
fn stream_shows_the_text_before_the_run_ends_and_records_with_store() {
    let (catalogue, stub) = two_streams();
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("fabric.db").display());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fabric"));
    cmd.current_dir(repo())
        .args(["run", "two-streams", "--goal", GOAL, "--stream", "--store", &db])
        .envs(fixture_env())
        .envs([("FABRIC_CATALOGUE_DIR", catalogue.as_str()), ("FABRIC_LLM_STUB_DIR", stub.to_str().unwrap()), STUB, ("FABRIC_LLM_STUB_LATENCY_MS", "1500")])
        .env_remove("FABRIC_DATABASE_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    // The first stage's text, whole, while the second stage's call still runs.
    let mut first = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.as_mut().unwrap()), &mut first).unwrap();
    assert!(child.try_wait().unwrap().is_none(), "the run goes on after the first stage's text: {first:?}");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    let run_id = err.lines().last().unwrap().strip_prefix("fabric: run ").unwrap().strip_suffix(" completed").unwrap().to_owned();
    // Recorded as without --stream: its result has the text streamed as the stages' output.
    let shown = fabric(&["runs", "--store", &db, "show", &run_id], &[]);
    let result: Value = serde_json::from_str(&stdout(&shown)).unwrap();
    assert_eq!(result["slots"]["draft"].as_str().map(|d| format!("{d}\n")), Some(first));
    assert_eq!(result["slots"]["answer"].as_str().map(|a| format!("{a}\n")).as_deref(), Some(stdout(&out).as_str()));
}

#[test]
fn stream_says_the_question_of_a_run_that_asks_and_runs_reply_streams_too() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("runs.db").display());
    let stub = repo().join("examples/stub-asking");
    let stub = stub.to_str().unwrap();
    let o = fabric(&["--stub-dir", stub, "run", "support-agent", "--goal", r#"{"question":"refund?"}"#, "--stream", "--store", &db], &[STUB]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    // A decision streams the text a user reads in it: its question, then its answer.
    assert_eq!(stdout(&o), "Which order number?\n");
    let err = stderr(&o);
    let id = err
        .strip_prefix("── stage decide ──\nfabric: run ")
        .and_then(|e| e.strip_suffix(" awaiting_input: Which order number?\n"))
        .unwrap_or_else(|| panic!("{err}"));
    let o = fabric(&["--stub-dir", stub, "runs", "--store", &db, "reply", id, "--message", "order 42", "--stream"], &[STUB]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The tool call of turn 1 has no text to show; the answer of turn 2 does.
    let shown = (stdout(&o), stderr(&o));
    assert_eq!(shown, ("Order 42 is refunded.\n".to_owned(), format!("── stage decide, turn 2 ──\nfabric: run {id} completed\n")));
}

/// A terminal cannot take text back: a retry after an attempt that showed text ends the shown
/// text's line, says so on stderr, and prints the new attempt's text whole. A fake Anthropic
/// streams the first call's text and breaks off with a retryable error; the retry streams it all.
#[tokio::test]
async fn stream_marks_a_restart_on_stderr_and_prints_the_new_attempt_s_text() {
    const TEXT: &str = "The duplicate charge goes back to your card within five days.";
    let url = crate::provider_streams::restarting_anthropic(TEXT, TEXT, std::time::Duration::from_millis(10)).await;
    let (catalogue, _) = two_streams();
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let env = [
        ("FABRIC_CATALOGUE_DIR", catalogue),
        ("FABRIC_LLM_MODEL", "anthropic:m-1".to_owned()),
        ("ANTHROPIC_BASE_URL", url),
        ("ANTHROPIC_API_KEY", "test-key-123".to_owned()),
    ];
    let out = crate::support::fabric_cli(&["run", "two-streams", "--goal", GOAL, "--stream", "--events-out", events.to_str().unwrap()], &env).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines: Vec<Value> = std::fs::read_to_string(&events).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let of_attempt = |n: u64| -> String {
        lines.iter().filter(|e| e["type"] == "run.llm.delta" && e["stage_id"] == "draft" && e["attempt"] == n).map(|e| e["text"].as_str().unwrap()).collect()
    };
    let dropped = of_attempt(1);
    assert!(!dropped.is_empty() && TEXT.starts_with(&dropped) && dropped != TEXT, "the first attempt showed part of the text: {dropped:?}");
    assert_eq!(of_attempt(2), TEXT);
    assert!(lines.iter().any(|e| e["type"] == "run.llm.restarted" && e["stage_id"] == "draft" && e["attempt"] == 2));
    assert_eq!(stdout(&out), format!("{dropped}\n{TEXT}\n{TEXT}\n"));
    let run_id = lines.last().unwrap()["run_id"].as_str().unwrap();
    assert_eq!(
        stderr(&out),
        format!(
            "── stage draft ──\n── stage draft: restarted (attempt 2): drop the text above; it is written again below ──\n── stage answer ──\nfabric: run {run_id} completed\n"
        )
    );
}

/// Scenario T: the first delta's latency behind a streaming provider's first text (a fake
/// OpenAI-compatible provider in the bench's process), with the real backend.
#[test]
fn bench_measures_the_first_texts_latency_behind_a_streaming_provider() {
    if !bench_built() {
        return;
    }
    let out = bench(&["--scenario", "T", "--runs", "8"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let line = String::from_utf8_lossy(&out.stdout).lines().find(|l| l.contains("\"scenario\":\"T\"")).map(str::to_owned).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!((v["runs"].as_u64(), v["failed_runs"].as_u64()), (Some(8), Some(0)), "{v}");
    assert!(v["first_delta_after_first_text_us"]["p50"].as_f64().is_some_and(|us| us >= 0.0), "{v}");
    assert!(stderr(&out).lines().any(|l| l.starts_with("T ") && l.contains("first delta")), "{}", stderr(&out));
}
