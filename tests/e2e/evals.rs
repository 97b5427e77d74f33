//! Evaluations over datasets (issue 51) through the `fabric` binary: experiments on the stub and
//! on a counting fake provider, the CI gate's exit codes and JUnit XML, regrading for zero
//! model calls, bad datasets refused before any model call.

use std::path::Path;

use serde_json::Value;

use crate::support::{Canned, FakeProvider, fabric_cli, fixtures, reply_json, routes_dir};

const STUB: (&str, &str) = ("FABRIC_LLM_STUB", "1");

fn env(pairs: &[(&str, &str)]) -> Vec<(&'static str, String)> {
    pairs.iter().map(|(k, v)| (Box::leak(k.to_string().into_boxed_str()) as &str, v.to_string())).collect()
}

/// A dataset of `n` support-triage cases, the first `right` expecting what the stub's script
/// answers (`billing`), the others `technical`.
fn triage_dataset(n: usize, right: usize, extra_evaluators: &str) -> String {
    let mut text = format!(
        "name: triage\nevaluators:\n  - stage_equals: {{stage: intake, path: category}}\n  - tokens_max: {{tokens: 100000}}\n{extra_evaluators}cases:\n"
    );
    for i in 0..n {
        let category = if i < right { "billing" } else { "technical" };
        text.push_str(&format!(
            "  - id: case-{i:02}\n    route_id: support-triage\n    goal: {{ticket: \"ticket {i}\"}}\n    expected:\n      stages: {{intake: {{category: {category}}}}}\n"
        ));
    }
    text
}

async fn eval(args: &[&str], env: &[(&'static str, String)]) -> (Option<i32>, String, String) {
    let out = fabric_cli(args, env).await;
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

#[tokio::test]
async fn fifty_cases_on_the_stub_pass_exactly_as_built_and_the_gate_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("e.db").display());
    let dataset = write(dir.path(), "triage.yaml", &triage_dataset(50, 37, ""));
    let (junit, html) = (dir.path().join("eval.xml"), dir.path().join("eval.html"));
    let args = [
        "eval",
        "run",
        &dataset,
        "--store",
        &db,
        "--format",
        "json",
        "--junit",
        junit.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
        "--concurrency",
        "8",
    ];
    let (code, out, err) = eval(&args, &env(&[STUB])).await;
    assert_eq!(code, Some(0), "no gate asked: {err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((report["cases_passed"].as_u64(), report["cases_total"].as_u64()), (Some(37), Some(50)), "{report:#}");
    assert_eq!(report["pass_rate"].as_f64(), Some(0.74));
    assert_eq!(report["runs"], 50);
    assert_eq!(report["llm_calls"], 150, "three model stages a run");
    let failing: Vec<&str> = report["cases"].as_array().unwrap().iter().take(13).map(|c| c["case_id"].as_str().unwrap()).collect();
    assert_eq!(failing, (37..50).map(|i| format!("case-{i}")).collect::<Vec<_>>(), "failing cases first");
    assert!(report["cases"][0]["runs"][0]["verdicts"][0]["reason"].as_str().unwrap().contains("expected \"technical\""), "{report:#}");
    // Every run is an ordinary recorded run.
    let run_id = report["cases"][0]["runs"][0]["run_id"].as_str().unwrap();
    let (code, shown, _) = eval(&["runs", "show", run_id, "--store", &db], &[]).await;
    assert_eq!(code, Some(0));
    assert!(shown.contains("\"status\":\"completed\""), "{shown}");
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("tests=\"50\" failures=\"13\""), "{xml}");
    assert_eq!(xml.matches("<failure ").count(), 13);
    junit_reads(&junit, 50, 13);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<b>37/50</b> cases passed (74.0%)"), "{page}");
    let first_row = page.split("<tr><td>").nth(report["evaluators"].as_array().unwrap().len() + 1).unwrap();
    assert!(first_row.starts_with("case-37</td>") && first_row.contains("FAIL"), "failing cases first: {first_row}");
    assert!(page.contains(&format!("href=\"http://127.0.0.1:8080/ui/#/runs/{run_id}\"")), "each run links to the inspector");

    // The gate: under --min-pass, exit 1 naming the failing cases.
    let experiment = report["experiment_id"].as_str().unwrap().to_owned();
    let (code, _, err) = eval(&["eval", "regrade", &experiment, "--store", &db, "--min-pass", "0.9"], &[]).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("fabric: gate: 74.0% of the cases passed, under --min-pass 90.0%"), "{err}");
    assert!(err.contains("fabric: gate: failed: case-49"), "{err}");
    let (code, _, err) = eval(&["eval", "regrade", &experiment, "--store", &db, "--min-pass", "0.74"], &[]).await;
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err) = eval(&["eval", "regrade", &experiment, "--store", &db, "--min-pass", "90"], &[]).await;
    assert_eq!(code, Some(2), "a share, not a percentage");
    assert!(err.contains("`90` is not a share from 0 to 1 (0.9 is 90%)"), "{err}");

    // Against a baseline: a dataset where 40 pass is the baseline; the 37 of now regress 3.
    let better = write(dir.path(), "better.yaml", &triage_dataset(50, 40, ""));
    let (code, out, err) = eval(&["eval", "run", &better, "--store", &db, "--format", "json"], &env(&[STUB])).await;
    assert_eq!(code, Some(0), "{err}");
    let baseline = serde_json::from_str::<Value>(&out).unwrap()["experiment_id"].as_str().unwrap().to_owned();
    let (code, _, err) = eval(&["eval", "regrade", &experiment, "--store", &db, "--baseline", &baseline], &[]).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(&format!("fabric: gate: 3 case(s) passed in {baseline} and fail now: case-37, case-38, case-39")), "{err}");
    let (code, _, err) = eval(&["eval", "regrade", &experiment, "--store", &db, "--baseline", &baseline, "--max-regressions", "3"], &[]).await;
    assert_eq!(code, Some(0), "{err}");
    let (code, listed, _) = eval(&["eval", "list", "--store", &db], &[]).await;
    assert_eq!(code, Some(0));
    assert_eq!(listed.lines().count(), 2, "{listed}");
    assert!(listed.lines().next().unwrap().starts_with(&baseline), "newest first: {listed}");
}

/// A provider that answers support-triage's stages and counts what it is asked.
async fn counting_provider() -> (FakeProvider, Vec<(&'static str, String)>) {
    let fake = FakeProvider::new(|body| Canned::json(200, reply_json(fabric::config::ProviderKind::OpenAi, body)));
    let url = fake.start().await;
    (fake, crate::support::openai_env(url))
}

#[tokio::test]
async fn regrading_makes_no_model_call_and_gives_the_same_verdicts_every_time() {
    let (fake, env) = counting_provider().await;
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("e.db").display());
    let dataset = write(dir.path(), "triage.yaml", &triage_dataset(6, 4, ""));
    let (code, out, err) = eval(&["eval", "run", &dataset, "--store", &db, "--format", "json"], &env).await;
    assert_eq!(code, Some(0), "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(fake.requests().len(), 18, "three calls a case");
    assert_eq!(report["tokens"], 18 * 40, "the provider's usage, summed");
    let experiment = report["experiment_id"].as_str().unwrap();
    // A new evaluator: the answer must speak of a refund (the fake's answer is `Refunded.`).
    let new = write(dir.path(), "new.yaml", &triage_dataset(6, 4, "  - contains: {text: Refunded}\n  - regex: {pattern: '^Sorry'}\n"));
    let mut seen = Vec::new();
    for _ in 0..10 {
        let (code, out, err) = eval(&["eval", "regrade", experiment, "--dataset", &new, "--store", &db, "--format", "json"], &env).await;
        assert_eq!(code, Some(0), "{err}");
        let mut again: Value = serde_json::from_str(&out).unwrap();
        again.as_object_mut().unwrap().remove("dataset");
        seen.push(again);
    }
    assert_eq!(fake.requests().len(), 18, "regrading asked the provider nothing");
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "the same verdicts every time");
    let evaluators: Vec<(&str, u64)> =
        seen[0]["evaluators"].as_array().unwrap().iter().map(|e| (e["name"].as_str().unwrap(), e["passed"].as_u64().unwrap())).collect();
    assert_eq!(evaluators, [("stage_equals:intake.category", 4), ("tokens_max", 6), ("contains", 6), ("regex", 0)]);
    // The stored report is the last grading's.
    let (code, shown, _) = eval(&["eval", "show", experiment, "--store", &db, "--format", "json"], &[]).await;
    assert_eq!(code, Some(0));
    assert_eq!(serde_json::from_str::<Value>(&shown).unwrap()["evaluators"].as_array().unwrap().len(), 4);
}

#[tokio::test]
async fn a_bad_dataset_is_refused_located_before_any_model_call() {
    let (fake, mut env) = counting_provider().await;
    let layered = format!("{}:{}", routes_dir().display(), fixtures().join("mcp/routes").display());
    env.push(("FABRIC_CATALOGUE_DIR", layered));
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("e.db").display());
    let text = "evaluators:\n  - llm_judge: {rubric: polite, profile: nobody}\ncases:\n\
                - {id: fine, route_id: support-triage, goal: {ticket: x}}\n\
                - {id: unknown, route_id: no-such-route, goal: {ticket: x}}\n\
                - {id: refused, route_id: order-status, goal: {order_id: seven}}\n\
                - id: wrong-type\n    route_id: support-triage\n    goal: {ticket: x}\n    expected:\n      stages: {intake: {category: 7}}\n";
    let text = text.replace("\n- ", "\n  - ");
    let dataset = write(dir.path(), "bad.yaml", &text);
    let (code, out, err) = eval(&["eval", "run", &dataset, "--store", &db], &env).await;
    assert_eq!(code, Some(2), "{out}{err}");
    let shown = err.replace(&format!("{dataset}:"), "bad.yaml:");
    for line in [
        "fabric: bad.yaml:2:5: evaluator `llm_judge`: judge profile `nobody` is not defined in the catalogue",
        "fabric: bad.yaml:5:29: case `unknown`: unknown route `no-such-route`",
        "fabric: bad.yaml:6:49: case `refused`: the goal does not match the `goal_schema` of route `order-status`: /order_id: \"seven\" is not of type \"integer\"",
        "fabric: bad.yaml:11:16: case `wrong-type`: expected stage `intake`: the value does not match the stage's output schema: /category: 7 is not of type \"string\"",
    ] {
        assert!(shown.contains(line), "{line}\nnot in:\n{shown}");
    }
    assert!(shown.ends_with("problem(s); nothing was run\n"), "{shown}");
    assert_eq!(fake.requests().len(), 0, "no model call");
    // A dataset that does not read is located the same way.
    let broken = write(dir.path(), "broken.jsonl", "{\"id\": \"a\", \"route_id\": \"support-triage\", \"goal\": {}}\n{\"id\": \"b\"\n");
    let (code, _, err) = eval(&["eval", "run", &broken, "--store", &db], &env).await;
    assert_eq!(code, Some(2));
    assert!(err.contains(&format!("fabric: {broken}:2:")), "{err}");
    let (code, _, err) = eval(&["eval", "regrade", "no-such-experiment", "--store", &db], &[]).await;
    assert_eq!((code, err.as_str()), (Some(2), "fabric: no experiment `no-such-experiment`\n"));
}

/// The fixture catalogue copied, with a prompt of the third stage of support-triage (`answer`,
/// the synthesis role) written into its pack.
fn changed_catalogue(dir: &Path) -> (String, String) {
    let copy = dir.join("new");
    for sub in ["routes", "prompt-packs"] {
        crate::support::copy_dir(&fixtures().join("catalogue").join(sub), &copy.join(sub));
    }
    let pack = copy.join("prompt-packs/support.yaml");
    let text = std::fs::read_to_string(&pack).unwrap();
    let changed = text.replace("  query_formulation: |", "  synthesis: |\n    Answer the customer kindly, in one sentence.\n  query_formulation: |");
    assert_ne!(text, changed);
    std::fs::write(&pack, changed).unwrap();
    (copy.join("routes").to_str().unwrap().to_owned(), copy.join("prompt-packs").to_str().unwrap().to_owned())
}

#[tokio::test]
async fn a_prompt_changed_in_the_third_stage_reruns_only_that_stage_and_compare_names_it() {
    let (fake, env) = counting_provider().await;
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("e.db").display());
    let dataset = write(dir.path(), "triage.yaml", &triage_dataset(5, 5, ""));
    let (code, out, err) = eval(&["eval", "run", &dataset, "--store", &db, "--format", "json"], &env).await;
    assert_eq!(code, Some(0), "{err}");
    let base = serde_json::from_str::<Value>(&out).unwrap()["experiment_id"].as_str().unwrap().to_owned();
    assert_eq!(fake.requests().len(), 15);

    let (routes, packs) = changed_catalogue(dir.path());
    let args = ["eval", "run", &dataset, "--store", &db, "--from", &base, "--catalogue", &routes, "--prompt-packs", &packs, "--format", "json"];
    let (code, out, err) = eval(&args, &env).await;
    assert_eq!(code, Some(0), "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let asked = fake.requests();
    assert_eq!(asked.len(), 15 + 5, "one request a case: the third stage's");
    assert!(asked[15..].iter().all(|r| r.body.to_string().contains("Answer the customer kindly")), "the changed prompt was asked");
    assert_eq!(report["llm_calls"], 5);
    for case in report["cases"].as_array().unwrap() {
        assert_eq!(case["runs"][0]["started_from"], "answer", "{case:#}");
        assert!(case["passed"].as_bool().unwrap(), "{case:#}");
    }
    // A partial run is a whole run in the store: it replays without a divergence.
    let run_id = report["cases"][0]["runs"][0]["run_id"].as_str().unwrap();
    let (code, out, err) = eval(&["replay", run_id, "--store", &db], &[]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("0 divergence(s); status completed"), "{out}");

    let experiment = report["experiment_id"].as_str().unwrap();
    let (code, out, err) = eval(&["eval", "compare", &base, experiment, "--store", &db], &[]).await;
    assert_eq!(code, Some(0), "no case regressed: {err}");
    assert!(out.contains("still_passing case-00 (first divergence: stage `answer`)\n  stage `answer`: the prompt differs\n"), "{out}");
    assert_eq!(fake.requests().len(), 20, "compare reads the store only");
}

/// A provider that answers support-triage's stages, and a judge's call (its schema has `pass`)
/// with a scripted verdict: a pass when the output it is shown says `Refunded`.
async fn judging_provider() -> (FakeProvider, Vec<(&'static str, String)>) {
    let fake = FakeProvider::new(|body| {
        let schema = body.pointer("/response_format/json_schema/schema/properties").cloned().unwrap_or_default();
        if schema.get("pass").is_none() {
            return Canned::json(200, reply_json(fabric::config::ProviderKind::OpenAi, body));
        }
        let user = body.pointer("/messages/1/content").and_then(Value::as_str).unwrap_or_default();
        let shown = user.split("Output to grade:").nth(1).unwrap_or_default();
        let verdict = if shown.contains("Refunded") {
            serde_json::json!({"pass": true, "score": 0.9, "reason": "it says the charge was refunded"})
        } else {
            serde_json::json!({"pass": false, "score": 0.1, "reason": "no refund is mentioned"})
        };
        let reply = serde_json::json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": verdict.to_string()}, "finish_reason": "stop"}],
                                       "usage": {"prompt_tokens": 50, "completion_tokens": 12}});
        Canned::json(200, reply)
    });
    let url = fake.start().await;
    (fake, crate::support::openai_env(url))
}

const JUDGE: &str = "  - llm_judge: {rubric: \"The answer tells the customer the charge was refunded.\", profile: default, name: refunded}\n";

#[tokio::test]
async fn a_judge_grades_through_the_provider_once_and_its_verdicts_regrade_for_nothing() {
    let (fake, env) = judging_provider().await;
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("e.db").display());
    let dataset = write(dir.path(), "triage.yaml", &triage_dataset(4, 4, JUDGE));
    let (code, out, err) = eval(&["eval", "run", &dataset, "--store", &db, "--format", "json"], &env).await;
    assert_eq!(code, Some(0), "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(fake.requests().len(), 4 * 3 + 4, "three stages and one judge a case");
    assert_eq!((report["judge_calls"].as_u64(), report["judge_tokens"].as_u64()), (Some(4), Some(4 * 62)));
    let judged = &report["cases"][0]["runs"][0]["verdicts"][2];
    assert_eq!(judged, &serde_json::json!({"evaluator": "refunded", "pass": true, "score": 0.9, "reason": "it says the charge was refunded"}));
    let judge_asked = fake.requests().into_iter().find(|r| r.body.to_string().contains("Output to grade")).unwrap();
    assert!(judge_asked.body.to_string().contains("The answer tells the customer the charge was refunded."), "the rubric is asked");
    // Regraded, and run again from the journal of that experiment: the kept verdicts answer.
    let experiment = report["experiment_id"].as_str().unwrap();
    for _ in 0..3 {
        let (code, out, err) = eval(&["eval", "regrade", experiment, "--store", &db, "--format", "json"], &env).await;
        assert_eq!(code, Some(0), "{err}");
        let again: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(again["cases"], report["cases"]);
        assert_eq!(again["judge_calls"], 0);
    }
    assert_eq!(fake.requests().len(), 16, "no model call to regrade, the judge's included");
    // A changed rubric is another judge: regrading cannot ask it, and says so.
    let changed = write(dir.path(), "changed.yaml", &triage_dataset(4, 4, &JUDGE.replace("refunded.\"", "refunded, politely.\"")));
    let (code, out, _) = eval(&["eval", "regrade", experiment, "--dataset", &changed, "--store", &db, "--format", "json"], &env).await;
    assert_eq!(code, Some(0));
    let reason = serde_json::from_str::<Value>(&out).unwrap()["cases"][0]["runs"][0]["verdicts"][2]["reason"].as_str().unwrap().to_owned();
    assert!(reason.starts_with("not judged"), "{reason}");
    assert_eq!(fake.requests().len(), 16);
}

#[tokio::test]
async fn a_judge_on_llama_cpp_gives_a_verdict_of_the_schema_that_regrades_without_it() {
    let Some(server) = crate::llama::start("plain") else { return };
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("e.db").display());
    // Real inference for the stages and the judge: the tiny model's words mean nothing, but its
    // verdict is decoded under the verdict's schema, as any provider's is.
    let url = format!("http://127.0.0.1:{}/v1", server.port);
    let env = env(&[("FABRIC_LLM_STUB", "0"), ("FABRIC_LLM_MODEL", "openai:tiny"), ("OPENAI_BASE_URL", &url), ("FABRIC_LLM_RETRY_BASE_S", "0.05")]);
    let dataset = write(dir.path(), "triage.yaml", &triage_dataset(2, 2, JUDGE));
    let (code, out, err) = eval(&["eval", "run", &dataset, "--store", &db, "--format", "json", "--concurrency", "1"], &env).await;
    assert_eq!(code, Some(0), "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["judge_calls"], 2, "{report:#}");
    assert!(report["judge_tokens"].as_u64().unwrap() > 0, "the server's usage");
    for case in report["cases"].as_array().unwrap() {
        let run = &case["runs"][0];
        assert_eq!(run["status"], "completed", "{case:#}");
        let verdict = run["verdicts"].as_array().unwrap().iter().find(|v| v["evaluator"] == "refunded").unwrap();
        assert!(verdict["pass"].is_boolean() && (0.0..=1.0).contains(&verdict["score"].as_f64().unwrap()), "{verdict}");
        assert!(!verdict["reason"].as_str().unwrap().starts_with("the judge failed"), "{verdict}");
    }
    // The server gone, the experiment regrades the same: its verdicts are kept.
    drop(server);
    let experiment = report["experiment_id"].as_str().unwrap();
    let (code, out, err) = eval(&["eval", "regrade", experiment, "--store", &db, "--format", "json"], &env).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["cases"], report["cases"]);
}

/// The JUnit file read by `junitparser` (PyPI, in a venv), the reader CI tools built on Python
/// use: its suites, tests and failures as counted.
fn junit_reads(path: &Path, tests: usize, failures: usize) {
    let why = "evals::fifty_cases_on_the_stub_pass_exactly_as_built_and_the_gate_says_so reads its JUnit file with junitparser";
    let Some(python) = crate::support::python_venv("eval-junit", "junitparser==5.0.3", "import junitparser", why) else { return };
    let script = path.with_extension("py");
    std::fs::write(
        &script,
        "import sys, junitparser\nxml = junitparser.JUnitXml.fromfile(sys.stdin.read().strip())\n\
         cases = [c for s in xml for c in s]\n\
         failed = [c for c in cases if any(isinstance(r, junitparser.Failure) for r in c.result)]\n\
         print(len(cases), len(failed), all(c.classname == 'support-triage' and c.name for c in cases))\n",
    )
    .unwrap();
    let out = crate::support::run_python(&python, &script, path.to_str().unwrap());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("{tests} {failures} True"));
    junit_validates(path);
}

/// The JUnit file valid under the JUnit XML schema CI tools read (Jenkins' xUnit schema, as
/// pytest ships it for its own JUnit tests: `testing/example_scripts/junit-10.xsd` of its source
/// distribution, from PyPI), checked by `xmlschema`.
fn junit_validates(path: &Path) {
    let why = "evals::fifty_cases_on_the_stub_pass_exactly_as_built_and_the_gate_says_so validates its JUnit file against the JUnit schema";
    let Some(python) = crate::support::python_venv("eval-junit-xsd", "xmlschema==4.3.2", "import xmlschema", why) else { return };
    let venv = python.parent().unwrap().parent().unwrap().to_path_buf();
    let script = path.with_extension("xsd.py");
    std::fs::write(
        &script,
        "import os, subprocess, sys, tarfile, xmlschema\n\
         venv, xml = sys.stdin.read().split('\\n')[:2]\n\
         xsd = os.path.join(venv, 'junit-10.xsd')\n\
         if not os.path.exists(xsd):\n\
         \x20   subprocess.run([os.path.join(venv, 'bin', 'pip'), 'download', '-q', '--disable-pip-version-check', '--no-binary', ':all:', '--no-deps', 'pytest==8.3.4', '-d', venv], check=True)\n\
         \x20   with tarfile.open(os.path.join(venv, 'pytest-8.3.4.tar.gz')) as t:\n\
         \x20       data = t.extractfile('pytest-8.3.4/testing/example_scripts/junit-10.xsd').read()\n\
         \x20   open(xsd, 'wb').write(data)\n\
         xmlschema.XMLSchema(xsd).validate(xml)\n\
         print('valid')\n",
    )
    .unwrap();
    let out = crate::support::run_python(&python, &script, &format!("{}\n{}", venv.display(), path.display()));
    assert!(out.status.success(), "the JUnit file is not valid under junit-10.xsd: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "valid");
}

#[tokio::test]
async fn the_service_lists_experiments_and_shows_their_reports() {
    use crate::service::{app_on, authed, call};
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("e.db").display());
    let dataset = write(dir.path(), "triage.yaml", &triage_dataset(3, 2, ""));
    let (code, out, err) = eval(&["eval", "run", &dataset, "--store", &db, "--format", "json"], &env(&[STUB])).await;
    assert_eq!(code, Some(0), "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let experiment = report["experiment_id"].as_str().unwrap();
    let (app, _stub) = app_on(fabric::store::open(&db).await.unwrap(), None, authed(fabric::api::ApiConfig::default()));
    let (status, _, listed) = call(&app, "GET", "/v1/experiments", None, true).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["experiments"][0]["experiment_id"], experiment);
    assert_eq!(listed["experiments"][0]["name"], "triage");
    let (status, _, shown) = call(&app, "GET", &format!("/v1/experiments/{experiment}"), None, true).await;
    assert_eq!(status, 200);
    assert_eq!(shown, report, "the report as kept");
    let (status, _, missing) = call(&app, "GET", "/v1/experiments/nope", None, true).await;
    assert_eq!((status.as_u16(), missing["error"]["code"].as_str()), (404, Some("not_found")), "{missing}");
    let (status, _, _) = call(&app, "GET", "/v1/experiments", None, false).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn repeats_give_each_case_its_spread_and_a_route_its_own_evaluators() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("e.db").display());
    let routed = "routes:\n  support-triage:\n    evaluators: [{contains: {text: refunded}}]\n";
    let dataset = write(dir.path(), "triage.yaml", &triage_dataset(2, 1, routed));
    let (code, out, err) = eval(&["eval", "run", &dataset, "--store", &db, "--format", "json", "--repeat", "3"], &env(&[STUB])).await;
    assert_eq!(code, Some(0), "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["runs"], 6);
    let wrong = &report["cases"][0];
    assert_eq!((wrong["case_id"].as_str(), wrong["runs"].as_array().unwrap().len()), (Some("case-01"), 3));
    let spread = &wrong["spread"];
    assert!(spread["min_tokens"].as_u64().unwrap() > 0 && spread["min_tokens"] == spread["max_tokens"], "the stub's runs cost the same: {spread}");
    let scores: Vec<(&str, u64, u64)> = spread["evaluators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["evaluator"].as_str().unwrap(), e["passed"].as_u64().unwrap(), e["runs"].as_u64().unwrap()))
        .collect();
    assert_eq!(scores, [("stage_equals:intake.category", 0, 3), ("tokens_max", 3, 3), ("contains", 3, 3)], "the route's evaluator after the dataset's");
    assert!(wrong["flaky"].is_null(), "the same verdicts on every repeat");
}

/// The README's and docs/evals.md's example dataset runs offline on the stub as it says: two of
/// its three cases pass, the third fails the way a regression would.
#[tokio::test]
async fn the_shipped_example_dataset_runs_on_the_stub_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("evals.db").display());
    let (code, out, err) = eval(&["eval", "run", "examples/evals/triage.yaml", "--store", &store], &env(&[STUB])).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("2/3 cases passed") && out.contains("FAIL login-broken"), "{out}{err}");
    let (code, out, err) = eval(&["eval", "run", "examples/evals/triage.yaml", "--store", &store, "--min-pass", "0.9"], &env(&[STUB])).await;
    assert_eq!(code, Some(1), "the gate refuses 2/3: {out}{err}");
}
