//! `fabric routes diff OLD NEW`: two copies of the fixture catalogue, one edited as a route
//! author would (a prompt, a role, an edge, a schema, a tool URL, a route added and one
//! removed), each change reported at its route and stage; exit codes as diff(1)'s; catalogue
//! versions kept in the run store, named by a prefix of their digest; and `GET
//! /v1/catalogue/diff` on `fabric serve`, a run's version against the one in force.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{fabric_cli, packs_dir, routes_dir};

/// A project directory (`routes/`, `prompt-packs/`) holding a copy of the fixture catalogue.
fn project(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    for (from, to) in [(routes_dir(), "routes"), (packs_dir(), "prompt-packs")] {
        std::fs::create_dir_all(dir.join(to)).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.join(to).join(entry.file_name())).unwrap();
        }
    }
    dir
}

/// Replaces `from` (which must be there, once) by `to` in a file of `dir`.
fn edit(dir: &Path, file: &str, from: &str, to: &str) {
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.matches(from).count(), 1, "`{from}` in {file}");
    std::fs::write(path, text.replace(from, to)).unwrap();
}

/// The fixture catalogue in `OLD`, and in `NEW` the same with one change of each kind.
fn old_and_new() -> (tempfile::TempDir, String, String) {
    let tmp = tempfile::tempdir().unwrap();
    let (old, new) = (project(tmp.path(), "old"), project(tmp.path(), "new"));
    edit(&new, "prompt-packs/support.yaml", "Reply with the category and the urgency only.", "Reply with the category, the urgency and why.");
    edit(&new, "routes/ticket-router.yaml", "      - id: escalate\n        llm_role: synthesis", "      - id: escalate\n        llm_role: classify");
    edit(&new, "routes/ticket-router.yaml", "equals: billing", "equals: technical");
    edit(&new, "routes/refund-review.yaml", "        message: {type: string}\n", "        message: {type: string}\n        tone: {type: string}\n");
    edit(&new, "routes/support-triage.yaml", "url: ${KB_SEARCH_URL}/search", "url: ${KB_SEARCH_URL}/v2/search");
    std::fs::remove_file(new.join("routes/support-agent.yaml")).unwrap();
    std::fs::write(new.join("routes/faq.yaml"), "routes:\n  faq:\n    model_profile: default\n    prompt_pack: support\n    workflow: support-triage\n")
        .unwrap();
    let path = |p: PathBuf| p.to_str().unwrap().to_owned();
    (tmp, path(old), path(new))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn routes_diff_reports_each_change_at_its_route_and_stage() {
    let (_tmp, old, new) = old_and_new();
    let out = fabric_cli(&["routes", "diff", &old, &new], &[]).await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    for expected in [
        "route support-triage: stage intake: system prompt changed\n",
        "  - Classify the customer's ticket. Reply with the category and the urgency only.\n  + Classify the customer's ticket. Reply with the category, the urgency and why.\n",
        "route ticket-router: stage escalate: llm_role: synthesis -> classify\n",
        "route ticket-router: stage intake: edges changed\n  - -> billing_answer when intake.category == \"billing\"\n  + -> billing_answer when intake.category == \"technical\"\n",
        "route refund-review: stage memo: output schema changed\n",
        "  +     \"tone\": {\n",
        "route support-triage: stage lookup: tool call: GET ${KB_SEARCH_URL}/search (timeout 5000 ms) -> GET ${KB_SEARCH_URL}/v2/search (timeout 5000 ms)\n",
        "route faq: added\n",
        "route support-agent: removed\n",
    ] {
        assert!(stdout.contains(expected), "missing {expected:?} in:\n{stdout}");
    }
    assert!(!stdout.contains("broken"), "every edit keeps its route ready:\n{stdout}");
}

/// The changes of `stage` of `route` in the JSON view.
fn stage_fields<'a>(diff: &'a Value, route: &str, stage: &str) -> Vec<&'a str> {
    let route = diff["routes"].as_array().unwrap().iter().find(|r| r["route"] == route).unwrap_or_else(|| panic!("{route}: {diff}"));
    assert_eq!(route["change"], "changed", "{route}");
    let stage = route["stages"].as_array().unwrap().iter().find(|s| s["stage"] == stage).unwrap_or_else(|| panic!("{stage}: {route}"));
    stage["fields"].as_array().unwrap().iter().map(|f| f["field"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn routes_diff_as_json_is_the_typed_diff() {
    let (_tmp, old, new) = old_and_new();
    let out = fabric_cli(&["routes", "diff", &old, &new, "--format", "json"], &[]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let diff: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stage_fields(&diff, "support-triage", "intake"), ["system_prompt"]);
    assert!(stage_fields(&diff, "ticket-router", "escalate").contains(&"role"));
    assert!(stage_fields(&diff, "ticket-router", "intake").contains(&"edges"));
    assert_eq!(stage_fields(&diff, "refund-review", "memo"), ["output"]);
    assert_eq!(stage_fields(&diff, "support-triage", "lookup"), ["invoke"]);
    let changes: Vec<(&str, &str)> = diff["routes"].as_array().unwrap().iter().map(|r| (r["route"].as_str().unwrap(), r["change"].as_str().unwrap())).collect();
    assert!(changes.contains(&("faq", "added")) && changes.contains(&("support-agent", "removed")), "{changes:?}");
    let lookup = &diff["routes"].as_array().unwrap().iter().find(|r| r["route"] == "support-triage").unwrap()["stages"];
    let invoke = &lookup.as_array().unwrap().iter().find(|s| s["stage"] == "lookup").unwrap()["fields"][0];
    assert_eq!(invoke["new"], serde_json::json!({"method": "GET", "url": "${KB_SEARCH_URL}/v2/search", "timeout_ms": 5000}));
}

#[tokio::test]
async fn routes_diff_of_the_same_catalogue_is_empty_and_a_missing_side_is_trouble() {
    let (tmp, old, _) = old_and_new();
    let same = project(tmp.path(), "same");
    let same = same.to_str().unwrap();
    let out = fabric_cli(&["routes", "diff", &old, same], &[]).await;
    assert_eq!((out.status.code(), text(&out.stdout)), (Some(0), "no differences\n".into()), "{}", text(&out.stderr));
    let out = fabric_cli(&["routes", "diff", &old, same, "--format", "json"], &[]).await;
    assert_eq!((out.status.code(), text(&out.stdout)), (Some(0), "{\"routes\":[]}\n".into()));
    // Catalogue directories themselves, with the packs of --prompt-packs.
    let (old_routes, same_routes, packs) = (format!("{old}/routes"), format!("{same}/routes"), format!("{old}/prompt-packs"));
    let out = fabric_cli(&["--prompt-packs", &packs, "routes", "diff", &old_routes, &same_routes], &[]).await;
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let missing = tmp.path().join("nowhere");
    let out = fabric_cli(&["routes", "diff", &old, missing.to_str().unwrap()], &[]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains(&format!("`{}` is not a directory", missing.display())), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
}

/// `fabric run --store` of support-triage on the project `dir` with the stub: the run's
/// `catalogue_version`, as `fabric runs show` prints it.
async fn recorded_version(dir: &Path, store: &str) -> String {
    let env = [
        ("FABRIC_CATALOGUE_DIR", dir.join("routes").to_str().unwrap().to_owned()),
        ("FABRIC_PROMPT_PACKS_DIR", dir.join("prompt-packs").to_str().unwrap().to_owned()),
        ("FABRIC_LLM_STUB", "1".to_owned()),
    ];
    let out = fabric_cli(&["run", "support-triage", "--goal", r#"{"ticket":"I was charged twice"}"#, "--store", store], &env).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    let out = fabric_cli(&["runs", "show", run["run_id"].as_str().unwrap(), "--store", store], &[]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    shown["catalogue_version"].as_str().unwrap_or_else(|| panic!("no catalogue_version: {shown}")).to_owned()
}

/// Two runs recorded before and after a prompt's edit: their versions, compared from the store by
/// the whole digest or its first 12 digits, or one of them against a directory.
#[tokio::test]
async fn routes_diff_compares_catalogue_versions_kept_in_the_run_store() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = project(tmp.path(), "live");
    let store = format!("sqlite://{}", tmp.path().join("runs.db").display());
    let before = recorded_version(&dir, &store).await;
    edit(&dir, "prompt-packs/support.yaml", "Reply with the category and the urgency only.", "Reply with the category, the urgency and why.");
    let after = recorded_version(&dir, &store).await;
    assert_ne!(before, after, "a prompt's edit is a new version");
    let prompt_changed = "route support-triage: stage intake: system prompt changed\n";
    for (old, new) in [(before.as_str(), after.as_str()), (&before[..12], &after[..12])] {
        let out = fabric_cli(&["routes", "diff", old, new, "--store", &store], &[]).await;
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
        assert!(stdout.contains(prompt_changed), "{stdout}");
        assert!(stdout.contains("  + Classify the customer's ticket. Reply with the category, the urgency and why.\n"), "{stdout}");
    }
    // The store by FABRIC_DATABASE_URL, and a version against a directory.
    let out = fabric_cli(&["routes", "diff", &before, dir.to_str().unwrap()], &[("FABRIC_DATABASE_URL", store.clone())]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(prompt_changed), "{}", text(&out.stdout));
    let out = fabric_cli(&["routes", "diff", dir.to_str().unwrap(), &after[..8], "--store", &store, "--format", "json"], &[]).await;
    assert_eq!((out.status.code(), text(&out.stdout)), (Some(0), "{\"routes\":[]}\n".into()), "{}", text(&out.stderr));
    let out = fabric_cli(&["routes", "diff", &before, &before, "--store", &store], &[]).await;
    assert_eq!((out.status.code(), text(&out.stdout)), (Some(0), "no differences\n".into()), "{}", text(&out.stderr));
    // A version the store does not keep.
    let unknown = if before.starts_with("0000") { "ffffffffffff" } else { "000000000000" };
    let out = fabric_cli(&["routes", "diff", &before, unknown, "--store", &store], &[]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains(&format!("no catalogue version starting with `{unknown}` in the store")), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
    // A store that is not there is trouble too, said before anything is compared.
    let missing = format!("sqlite://{}", tmp.path().join("none.db").display());
    let out = fabric_cli(&["routes", "diff", &before, &after, "--store", &missing], &[]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("run store"), "{}", text(&out.stderr));
}

/// `GET /v1/catalogue/diff` on `fabric serve`: a run's version against the one in force after a
/// reload, then, on a replica started after the change, the same version read from the store.
#[tokio::test]
async fn the_service_diffs_a_runs_catalogue_version_against_the_one_in_force() {
    use crate::service::{Server, TOKEN, client, get, post};
    let tmp = tempfile::tempdir().unwrap();
    let dir = project(tmp.path(), "live");
    let store = format!("sqlite://{}", tmp.path().join("runs.db").display());
    let (routes, packs) = (dir.join("routes"), dir.join("prompt-packs"));
    let dirs = [("FABRIC_CATALOGUE_DIR", routes.to_str().unwrap()), ("FABRIC_PROMPT_PACKS_DIR", packs.to_str().unwrap())];
    let server = Server::start(&store, &crate::support::stub_dir(), &dirs);
    let (_, run) =
        post(&server, "/v1/runs?wait=true", serde_json::json!({"route_id": "support-triage", "goal": {"ticket": "charged twice"}, "model_profile": "default"}))
            .await;
    assert_eq!(run["status"], "completed", "{run}");
    let old = get(&server, &format!("/v1/runs/{}", run["run_id"].as_str().unwrap())).await["catalogue_version"].as_str().unwrap().to_owned();
    edit(&dir, "prompt-packs/support.yaml", "Reply with the category and the urgency only.", "Reply with the category, the urgency and why.");
    let (status, reloaded) = post(&server, "/v1/catalogue/reload", serde_json::json!({})).await;
    assert_eq!((status, reloaded["changed"].as_bool()), (200, Some(true)), "{reloaded}");
    let new = reloaded["version"].as_str().unwrap().to_owned();
    let ask = async |server: &Server, query: &str, token: bool| {
        let mut request = client().get(format!("{}/v1/catalogue/diff{query}", server.url));
        if token {
            request = request.bearer_auth(TOKEN);
        }
        let response = request.send().await.unwrap();
        (response.status().as_u16(), response.json::<Value>().await.unwrap())
    };
    let changed = |diff: &Value| {
        assert_eq!((diff["from"].as_str(), diff["to"].as_str()), (Some(old.as_str()), Some(new.as_str())), "{diff}");
        assert!(diff["text"].as_str().unwrap().contains("route support-triage: stage intake: system prompt changed\n"), "{diff}");
        assert_eq!(stage_fields(&diff["differences"], "support-triage", "intake"), ["system_prompt"]);
    };
    // `to` is the version in force by default.
    let (status, diff) = ask(&server, &format!("?from={old}"), true).await;
    assert_eq!(status, 200, "{diff}");
    changed(&diff);
    let (status, same) = ask(&server, &format!("?from={new}&to={new}"), true).await;
    assert_eq!((status, same["differences"].clone(), same["text"].as_str()), (200, serde_json::json!({"routes": []}), Some("")), "{same}");
    // A version only the store keeps now: this replica started on the new one.
    drop(server);
    let server = Server::start(&store, &crate::support::stub_dir(), &dirs);
    let (status, diff) = ask(&server, &format!("?from={old}&to={new}"), true).await;
    assert_eq!(status, 200, "{diff}");
    changed(&diff);
    let unknown = "0".repeat(64);
    let (status, body) = ask(&server, &format!("?from={unknown}"), true).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains(&unknown), "{body}");
    for bad in [format!("?from={}", &old[..12]), format!("?from={old}&to=NEW"), String::new()] {
        let (status, body) = ask(&server, &bad, true).await;
        assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_request")), "{bad}: {body}");
    }
    let (status, body) = ask(&server, &format!("?from={old}"), false).await;
    assert_eq!((status, body["error"]["code"].as_str()), (401, Some("unauthorized")), "{body}");
}
