//! The run inspector (`/ui/` of `fabric serve`) in a real browser: headless Chromium through
//! chromedriver, against a real `fabric serve` with the seeded stub. Token, routes and their
//! graphs, starting runs, following them live, answering a question, hostile replies as text,
//! the live runs list and its filters. A screenshot of each page lands in
//! `target/ui-screenshots/` for review.
//!
//! Without chromium and chromedriver the tests skip (`support::skip_unless`: said, and listed by
//! `.ci/test`), except under `CI=true`, where they fail.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::service::{Server, TOKEN, asking_stub, get, post, settled};
use crate::support::{routes_dir, two_streams};
use crate::webdriver::{Browser, Element};

/// One browser at a time: several Chromiums beside the other tests would starve a small machine.
static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A stub script whose refund-review fails its first stage (`schema_validation`).
const REFUND_REVIEW_FAILS: &str = "stages:\n  facts:\n    - '{\"amount\":\"lots\",\"duplicate\":\"maybe\"}'\n";

/// A stub LLM latency that keeps a run visibly running for a few seconds.
const SLOW: (&str, &str) = ("FABRIC_LLM_STUB_LATENCY_MS", "700");

struct Setup {
    browser: Browser,
    server: Server,
    _db: tempfile::TempDir,
    _guard: tokio::sync::MutexGuard<'static, ()>,
}

/// A fresh SQLite store, `fabric serve` on `stub`, and a browser; `None` when skipped.
async fn setup(stub: &Path, env: &[(&str, &str)]) -> Option<Setup> {
    let guard = ONE_BROWSER.lock().await;
    let browser = Browser::launch().await?;
    let db = tempfile::tempdir().unwrap();
    let server = Server::start(&format!("sqlite://{}", db.path().join("fabric.db").display()), stub, env);
    Some(Setup { browser, server, _db: db, _guard: guard })
}

impl Setup {
    fn ui(&self, hash: &str) -> String {
        format!("{}/ui/{hash}", self.server.url)
    }

    /// Opens the page and enters the token; the runs page is up afterwards.
    async fn sign_in(&self) {
        let b = &self.browser;
        b.goto(&self.ui("")).await;
        b.wait_displayed("form#token-form").await;
        let input = b.wait_displayed("input#token").await;
        input.send_keys(TOKEN).await.unwrap();
        b.find("button#token-save").await.unwrap().click().await.unwrap();
        b.wait_find("table#runs").await;
    }

    /// Routes → the route's page (through the list, as a reader would).
    async fn open_route(&self, route: &str) {
        let b = &self.browser;
        b.click_displayed("a#nav-routes").await;
        let open = format!("table#routes tr.route[data-route-id=\"{route}\"] a.open");
        b.wait_for(&format!("the link to {route}"), async || {
            let link = b.find(&open).await.ok()?;
            link.click().await.ok()
        })
        .await;
        b.wait_find(&format!("section#route[data-route-id=\"{route}\"]")).await;
    }

    /// Types `goal` into the route page's form and presses start.
    async fn submit_goal(&self, goal: &str) {
        let b = &self.browser;
        let area = b.wait_displayed("textarea#goal").await;
        area.clear().await.unwrap();
        area.send_keys(goal).await.unwrap();
        b.find("button#start").await.unwrap().click().await.unwrap();
    }

    /// Starts `route` from its page with `goal`; returns the new run's id once its page is up.
    async fn start_from_route_page(&self, route: &str, goal: &str) -> String {
        self.open_route(route).await;
        self.submit_goal(goal).await;
        let b = &self.browser;
        let id = b
            .wait_for(&format!("the page of the new {route} run"), async || {
                let url = b.current_url().await;
                let id = url.split_once("#/runs/")?.1.to_owned();
                let section = b.find("section#run").await.ok()?;
                (section.attr("data-run-id").await.ok()?? == id).then_some(id)
            })
            .await;
        assert!(!id.is_empty());
        id
    }

    /// Waits until the run page shows `status` (live: the page is not reloaded for it).
    async fn run_reaches(&self, id: &str, status: &str) {
        let css = format!("section#run[data-run-id=\"{id}\"][data-status=\"{status}\"]");
        self.browser.wait_for_within(&format!("run {id} to show {status}"), Duration::from_secs(40), async || self.browser.find(&css).await.ok()).await;
    }

    /// Signs in, starts a `two-streams` run (tests/fixtures/streaming) through the API and opens
    /// its page; its id.
    async fn open_two_streams_run(&self) -> String {
        self.sign_in().await;
        let (status, run) =
            post(&self.server, "/v1/runs", json!({"route_id": "two-streams", "goal": {"ticket": "charged twice"}, "model_profile": "default"})).await;
        assert_eq!(status, 201, "{run}");
        let id = run["run_id"].as_str().unwrap().to_owned();
        self.browser.goto(&self.ui(&format!("#/runs/{id}"))).await;
        id
    }

    /// Marks the document, so a later check tells whether it was reloaded meanwhile.
    async fn mark_document(&self) {
        self.browser.script("window.__sameDocument = 'yes';", json!([])).await;
    }

    async fn assert_same_document(&self, what: &str) {
        let v = self.browser.script("return window.__sameDocument || null;", json!([])).await;
        assert_eq!(v, "yes", "{what} without reloading the page");
    }

    /// The token is in sessionStorage, in no address the page shows or requested.
    async fn assert_token_kept_private(&self) {
        let b = &self.browser;
        let stored = b.script("return window.sessionStorage.getItem('fabric-token');", json!([])).await;
        assert_eq!(stored, TOKEN, "the token is kept in sessionStorage");
        let url = b.current_url().await;
        assert!(!url.contains(TOKEN), "the token is in the address: {url}");
        let urls = b.script("return performance.getEntriesByType('resource').map(e => e.name).concat([location.href]);", json!([])).await;
        for u in urls.as_array().unwrap() {
            assert!(!u.as_str().unwrap().contains(TOKEN), "the token is in a requested address: {u}");
        }
        let local = b.script("return JSON.stringify(window.localStorage);", json!([])).await;
        assert!(!local.as_str().unwrap_or_default().contains(TOKEN), "the token is not kept in localStorage: {local}");
    }
}

/// The text an element holds, hidden parts included (`textContent`).
async fn content(e: &Element<'_>) -> String {
    e.prop("textContent").await.ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

/// Whether nothing matching `css` is displayed (absent or hidden).
async fn gone(b: &Browser, css: &str) -> bool {
    match b.find(css).await {
        Ok(e) => !e.displayed().await,
        Err(_) => true,
    }
}

/// Each stage the run page shows: its id and the text (`textContent`) of its role, prompt, reply
/// and result, read in one script (the page redraws the stages as the run's record comes in, so
/// element references would go stale between reads).
async fn stage_parts(b: &Browser) -> Vec<(String, [String; 4])> {
    let v = b
        .script(
            "return Array.from(document.querySelectorAll('div#stages > div.stage[data-stage-id]')).map(s => \
             [s.getAttribute('data-stage-id')].concat(['.role', '.prompt', '.reply', '.result'].map(c => \
             { const e = s.querySelector(c); return e ? e.textContent : ''; })));",
            json!([]),
        )
        .await;
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| {
            let s = s.as_array()?;
            Some((text(&s[0]), [text(&s[1]), text(&s[2]), text(&s[3]), text(&s[4])]))
        })
        .collect()
}

/// The text of the cell `cell` in the runs page's row of run `id`, once the row is there.
async fn run_cell(b: &Browser, id: &str, cell: &str) -> String {
    let css = format!("table#runs tr.run[data-run-id=\"{id}\"] {cell}");
    b.wait_for(&format!("the cell {cell} of run {id}"), async || b.find(&css).await.ok()?.text().await.ok()).await
}

#[tokio::test]
async fn the_token_is_asked_for_kept_in_session_storage_and_never_put_in_an_address() {
    let stub = asking_stub();
    let Some(s) = setup(stub.path(), &[]).await else { return };
    let b = &s.browser;
    b.goto(&s.ui("")).await;
    b.wait_displayed("form#token-form").await;
    b.screenshot("token").await;
    let stored = b.script("return window.sessionStorage.getItem('fabric-token');", json!([])).await;
    assert_eq!(stored, Value::Null);
    b.find("input#token").await.unwrap().send_keys(TOKEN).await.unwrap();
    b.find("button#token-save").await.unwrap().click().await.unwrap();
    // The runs page is the default, and it loads (the API answered with the token).
    b.wait_find("table#runs").await;
    b.wait_for("the token form to go away", async || gone(b, "form#token-form").await.then_some(())).await;
    b.wait_find("select#filter-route option[value=\"support-triage\"]").await;
    b.screenshot("runs-empty").await;
    s.assert_token_kept_private().await;
    // A reload keeps it (sessionStorage lives as long as the tab).
    b.refresh().await;
    b.wait_find("table#runs").await;
    b.wait_find("select#filter-route option[value=\"support-triage\"]").await;
    assert!(gone(b, "form#token-form").await, "no token form once the token is known");
    s.assert_token_kept_private().await;
    // The other pages too.
    s.open_route("support-triage").await;
    s.assert_token_kept_private().await;
    // Forgetting it asks again.
    b.click_displayed("button#token-clear").await;
    b.wait_displayed("form#token-form").await;
    let stored = b.script("return window.sessionStorage.getItem('fabric-token');", json!([])).await;
    assert_eq!(stored, Value::Null, "the token is forgotten");
}

#[tokio::test]
async fn support_triage_started_from_its_route_page_completes_live_with_its_timeline() {
    let stub = asking_stub();
    let Some(s) = setup(stub.path(), &[SLOW]).await else { return };
    let b = &s.browser;
    s.sign_in().await;
    s.open_route("support-triage").await;
    b.screenshot("route-support-triage").await;
    // Goals that are not a JSON object are refused on the page; nothing is sent.
    for bad in ["[1, 2]", "{not json", "\"a string\""] {
        s.submit_goal(bad).await;
        b.wait_displayed("#goal-error").await;
        assert!(b.current_url().await.contains("#/routes/support-triage"), "still on the route page after {bad}");
    }
    b.screenshot("route-goal-error").await;
    let runs = get(&s.server, "/v1/runs").await;
    assert_eq!(runs["runs"].as_array().map(Vec::len), Some(0), "an invalid goal starts nothing: {runs}");
    // A valid one starts a run and shows it, live: the document is the same one throughout.
    s.mark_document().await;
    s.submit_goal(r#"{"ticket": "charged twice"}"#).await;
    let id = b
        .wait_for("the page of the new run", async || {
            let url = b.current_url().await;
            let id = url.split_once("#/runs/")?.1.to_owned();
            (b.find("section#run").await.ok()?.attr("data-run-id").await.ok()?? == id).then_some(id)
        })
        .await;
    b.screenshot("run-running").await;
    s.run_reaches(&id, "completed").await;
    s.assert_same_document("the run completed on the page").await;
    assert_eq!(settled(&s.server, &id).await["status"], "completed");
    b.wait_for("#run-status to read completed", async || {
        b.find("#run-status").await.ok()?.text().await.ok().filter(|t| t.to_lowercase().contains("completed"))
    })
    .await;
    // The timeline: a span per stage and per model call.
    b.wait_for("stage and llm spans in the timeline", async || {
        (b.count("ol#timeline > li.span[data-kind=\"stage\"]").await >= 3 && b.count("ol#timeline > li.span[data-kind=\"llm\"]").await >= 3).then_some(())
    })
    .await;
    // Each stage with its role, prompt, reply and result. The page redraws the stages when the
    // run's record arrives, so they are read in one script, until the record is in.
    let stages = b
        .wait_for("the three stages with role, prompt, reply and result", async || {
            let stages = stage_parts(b).await;
            let complete = stages.iter().all(|(_, parts)| parts.iter().all(|p| !p.trim().is_empty() && !p.starts_with("not recorded")));
            let ids: Vec<&str> = stages.iter().map(|(id, _)| id.as_str()).collect();
            (complete && ["intake", "lookup", "answer"].iter().all(|w| ids.contains(w))).then_some(stages)
        })
        .await;
    let answer = &stages.iter().find(|(id, _)| id == "answer").unwrap().1;
    assert!(answer[2].contains("You were charged twice; the duplicate charge has been refunded."), "{answer:?}");
    // Its catalogue version, the one in force: 12 digits shown, the whole in the title; the
    // header shows the version in force; no diff of a version against itself.
    let version = settled(&s.server, &id).await["catalogue_version"].as_str().unwrap().to_owned();
    assert_eq!(get(&s.server, "/v1/catalogue").await["version"], version.as_str());
    for css in ["#run-catalogue code", "#catalogue-version-code"] {
        let shown = b
            .wait_for(&format!("the catalogue version in {css}"), async || {
                let code = b.find(css).await.ok()?;
                Some((code.text().await.ok()?, code.attr("title").await.ok()??))
            })
            .await;
        assert_eq!(shown, (version[..12].to_owned(), version.clone()), "{css}");
    }
    assert!(gone(b, "#catalogue-diff-open").await, "no diff against the version in force itself");
    b.screenshot("run-completed").await;
    // Back on the runs page it is listed as completed.
    b.find("a#nav-runs").await.unwrap().click().await.unwrap();
    b.wait_find(&format!("table#runs tr.run[data-run-id=\"{id}\"][data-status=\"completed\"]")).await;
    assert_eq!(run_cell(b, &id, "td.route").await.trim(), "support-triage");
    b.screenshot("runs").await;
    s.assert_token_kept_private().await;
}

#[tokio::test]
async fn the_cancel_button_cancels_a_running_run() {
    let stub = asking_stub();
    let Some(s) = setup(stub.path(), &[("FABRIC_LLM_STUB_LATENCY_MS", "30000")]).await else { return };
    let b = &s.browser;
    s.sign_in().await;
    let id = s.start_from_route_page("support-triage", r#"{"ticket": "charged twice"}"#).await;
    s.run_reaches(&id, "running").await;
    b.wait_displayed("button#run-cancel").await;
    b.find("button#run-cancel").await.unwrap().click().await.unwrap();
    s.run_reaches(&id, "cancelled").await;
    b.wait_for("the reason on the page", async || {
        b.find("#failure")
            .await
            .ok()?
            .text()
            .await
            .ok()
            .filter(|t| t.contains("Cancelled") && t.contains("cancelled in the run inspector") && !t.contains("null"))
    })
    .await;
    b.wait_for("the Cancel button to go away", async || gone(b, "button#run-cancel").await.then_some(())).await;
    let done = settled(&s.server, &id).await;
    assert_eq!((done["status"].as_str(), done["error"]["reason_class"].as_str()), (Some("cancelled"), Some("cancelled")), "{done}");
    b.screenshot("run-cancelled").await;
}

#[tokio::test]
async fn the_run_page_shows_its_webhook_deliveries() {
    // A receiver that is not there: the delivery stays pending, its error on the page.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}/hooks?token=sekrit-query");
    let env = [("FABRIC_WEBHOOK_URL", url.as_str()), ("FABRIC_WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), ("FABRIC_WEBHOOK_MAX_ATTEMPTS", "3")];
    let stub = asking_stub();
    let Some(s) = setup(stub.path(), &env).await else { return };
    let b = &s.browser;
    s.sign_in().await;
    let id = s.start_from_route_page("support-triage", r#"{"ticket": "charged twice"}"#).await;
    s.run_reaches(&id, "completed").await;
    let text = b
        .wait_for("the delivery and its error", async || {
            let t = b.find("#webhooks li.webhook").await.ok()?.text().await.ok()?;
            (t.contains("run.completed") && t.contains("could not connect") && t.contains(&format!("127.0.0.1:{port}/hooks"))).then_some(t)
        })
        .await;
    assert!(!text.contains("sekrit"), "the URL's query is not shown: {text}");
    b.screenshot("run-webhooks").await;
}

#[tokio::test]
async fn support_agent_asks_the_reader_and_completes_live_after_the_reply() {
    let stub = asking_stub();
    let Some(s) = setup(stub.path(), &[SLOW]).await else { return };
    let b = &s.browser;
    s.sign_in().await;
    s.mark_document().await;
    let id = s.start_from_route_page("support-agent", r#"{"question": "refund?"}"#).await;
    s.run_reaches(&id, "awaiting_input").await;
    b.wait_for("the question", async || b.find("#question").await.ok()?.text().await.ok().filter(|t| t.contains("Which order number?"))).await;
    b.wait_displayed("form#reply-form").await;
    b.screenshot("run-awaiting-input").await;
    let text = b.find("textarea#reply-text").await.unwrap();
    text.send_keys("order 42").await.unwrap();
    b.find("button#reply-send").await.unwrap().click().await.unwrap();
    s.run_reaches(&id, "completed").await;
    s.assert_same_document("the run was started, asked and completed on the page").await;
    let done = settled(&s.server, &id).await;
    assert_eq!((done["status"].as_str(), done["output"].as_str()), (Some("completed"), Some("Order 42 is refunded.")), "{done}");
    assert_eq!(done["notes"][0], "user: order 42", "the reply typed on the page reached the run");
    b.wait_for("the answer on the page", async || {
        let run = b.find("section#run").await.ok()?;
        content(&run).await.contains("Order 42 is refunded.").then_some(())
    })
    .await;
    b.wait_for("the reply form to go away", async || gone(b, "form#reply-form").await.then_some(())).await;
    // The decision loop's turns and its tool call are on the timeline.
    b.wait_for("turn and tool spans", async || {
        (b.count("ol#timeline > li.span[data-kind=\"turn\"]").await >= 1 && b.count("ol#timeline > li.span[data-kind=\"tool\"]").await >= 1).then_some(())
    })
    .await;
    b.screenshot("run-answered").await;
}

/// Hostile text in model replies, a question and a reader's reply is shown as text.
#[tokio::test]
async fn markup_in_replies_and_questions_is_shown_as_text_and_never_runs() {
    const IMG: &str = r#"<img src=x onerror="window.__pwned=1">"#;
    const SCRIPT: &str = "<script>window.__pwned=2</script>";
    let stub = asking_stub();
    let triage = serde_json::to_string(&json!({ "text": format!("{IMG} {SCRIPT}") })).unwrap();
    std::fs::write(
        stub.path().join("support-triage.yaml"),
        format!(
            "stages:\n  intake:\n    - {}\n  lookup:\n    - {}\n  answer:\n    - {}\n",
            yaml_str(r#"{"category":"billing","urgency":"high"}"#),
            yaml_str(r#"{"query":"<img src=x onerror=\"window.__pwned=3\">"}"#),
            yaml_str(&triage)
        ),
    )
    .unwrap();
    std::fs::write(
        stub.path().join("support-agent.yaml"),
        format!(
            "stages:\n  decide:\n    - {}\n    - {}\n",
            yaml_str(r#"ASK Which order? <img src=x onerror="window.__pwned=4">"#),
            yaml_str(r#"DONE <b>Refunded</b> <img src=x onerror="window.__pwned=5"> <script>window.__pwned=6</script>"#)
        ),
    )
    .unwrap();
    let Some(s) = setup(stub.path(), &[]).await else { return };
    let b = &s.browser;
    s.sign_in().await;
    let (status, run) = post(&s.server, "/v1/runs?wait=true", json!({"route_id": "support-triage", "goal": {"ticket": IMG}, "model_profile": "default"})).await;
    assert_eq!((status, run["status"].as_str()), (200, Some("completed")), "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    b.goto(&s.ui(&format!("#/runs/{id}"))).await;
    s.run_reaches(&id, "completed").await;
    // Reply and result both hold the markup, as text (read once the record is in).
    b.wait_for("the answer stage's reply and result, markup as text", async || {
        let stages = stage_parts(b).await;
        let answer = &stages.iter().find(|(id, _)| id == "answer")?.1;
        answer[2..].iter().all(|t| t.contains("<img src=x onerror=") && t.contains(SCRIPT)).then_some(())
    })
    .await;
    // Visible, not only in the DOM.
    let shown = b.find("div#stages").await.unwrap().text().await.unwrap();
    assert!(shown.contains("<img src=x onerror=") && shown.contains(SCRIPT), "the markup is visible as text: {shown}");
    b.screenshot("run-hostile").await;
    b.find("div#stages > div.stage[data-stage-id=\"answer\"]").await.unwrap().screenshot("run-hostile-answer-stage").await;
    assert_not_pwned(b).await;
    // The runs list shows the same run without running anything either.
    b.find("a#nav-runs").await.unwrap().click().await.unwrap();
    b.wait_find(&format!("tr.run[data-run-id=\"{id}\"]")).await;
    assert_not_pwned(b).await;
    // A question and the reader's reply with markup in them.
    let (_, run) = post(&s.server, "/v1/runs?wait=true", json!({"route_id": "support-agent", "goal": {"q": SCRIPT}, "model_profile": "default"})).await;
    assert_eq!(run["status"], "awaiting_input", "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    b.goto(&s.ui(&format!("#/runs/{id}"))).await;
    s.run_reaches(&id, "awaiting_input").await;
    b.wait_for("the question shown as text", async || {
        b.find("#question").await.ok()?.text().await.ok().filter(|t| t.contains(r#"<img src=x onerror="window.__pwned=4">"#))
    })
    .await;
    assert_not_pwned(b).await;
    let reply = r#"order <img src=x onerror="window.__pwned=7"> <script>window.__pwned=8</script>"#;
    b.find("textarea#reply-text").await.unwrap().send_keys(reply).await.unwrap();
    b.find("button#reply-send").await.unwrap().click().await.unwrap();
    s.run_reaches(&id, "completed").await;
    let done = settled(&s.server, &id).await;
    assert_eq!(done["notes"][0], format!("user: {reply}"), "{done}");
    b.wait_for("the answer shown as text", async || {
        let run = b.find("section#run").await.ok()?;
        let text = run.text().await.ok()?;
        (text.contains("<b>Refunded</b>") && text.contains("<script>window.__pwned=6</script>")).then_some(())
    })
    .await;
    assert_eq!(b.count("section#run b").await, 0, "no <b> from a reply");
    b.screenshot("run-hostile-answered").await;
    assert_not_pwned(b).await;
}

/// A YAML double-quoted scalar holding `s`.
fn yaml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

async fn assert_not_pwned(b: &Browser) {
    // Give an injected onerror handler its chance to fire before looking.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pwned = b.script("return typeof window.__pwned;", json!([])).await;
    assert_eq!(pwned, "undefined", "markup from a run ran in the page");
    assert_eq!(b.count("img[src=\"x\"]").await, 0, "an <img> from a run's text is in the page");
    assert_eq!(b.count("#stages script, #run script, #runs script, #question script").await, 0, "a <script> from a run's text is in the page");
}

/// A run started before a reload: its page shows its version and, since it is no longer the one
/// in force, a button that shows what changed since (`GET /v1/catalogue/diff`), as text.
#[tokio::test]
async fn a_run_on_an_older_catalogue_version_links_to_its_diff_against_the_current_one() {
    let stub = asking_stub();
    let (routes, packs) = (crate::support::temp_copy(&routes_dir()), crate::support::temp_copy(&crate::support::packs_dir()));
    let dirs = [("FABRIC_CATALOGUE_DIR", routes.path().to_str().unwrap()), ("FABRIC_PROMPT_PACKS_DIR", packs.path().to_str().unwrap())];
    let Some(s) = setup(stub.path(), &dirs).await else { return };
    let b = &s.browser;
    let (_, run) =
        post(&s.server, "/v1/runs?wait=true", json!({"route_id": "support-triage", "goal": {"ticket": "charged twice"}, "model_profile": "default"})).await;
    assert_eq!(run["status"], "completed", "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    let old = get(&s.server, &format!("/v1/runs/{id}")).await["catalogue_version"].as_str().unwrap().to_owned();
    // A prompt edited (with markup in it, which the page must show as text), and reloaded.
    let pack = packs.path().join("support.yaml");
    let text = std::fs::read_to_string(&pack).unwrap();
    std::fs::write(&pack, text.replace("and the urgency only.", r#"and the urgency, and <b>why</b> <img src=x onerror="window.__pwned=9">."#)).unwrap();
    let (status, reloaded) = post(&s.server, "/v1/catalogue/reload", json!({})).await;
    assert_eq!((status, reloaded["changed"].as_bool()), (200, Some(true)), "{reloaded}");
    let new = reloaded["version"].as_str().unwrap().to_owned();
    s.sign_in().await;
    b.goto(&s.ui(&format!("#/runs/{id}"))).await;
    s.run_reaches(&id, "completed").await;
    let shown = b.wait_for("the run's version", async || b.find("#run-catalogue code").await.ok()?.attr("title").await.ok()?).await;
    assert_eq!(shown, old);
    let header = b.wait_for("the version in force in the header", async || b.find("#catalogue-version-code").await.ok()?.text().await.ok()).await;
    assert_eq!(header, new[..12]);
    b.click_displayed("#catalogue-diff-open").await;
    let diff = b
        .wait_for("the diff against the version in force", async || {
            b.find("#catalogue-diff-text").await.ok()?.text().await.ok().filter(|t| t.contains("route support-triage: stage intake: system prompt changed"))
        })
        .await;
    assert!(diff.contains(r#"and <b>why</b> <img src=x onerror="window.__pwned=9">."#), "the prompt as text: {diff}");
    assert_eq!(b.count("#catalogue-diff b").await, 0, "no <b> from a prompt");
    b.screenshot("run-catalogue-diff").await;
    assert_not_pwned(b).await;
}

#[tokio::test]
async fn every_route_page_shows_its_graph() {
    let stub = asking_stub();
    let Some(s) = setup(stub.path(), &[]).await else { return };
    let b = &s.browser;
    s.sign_in().await;
    b.find("a#nav-routes").await.unwrap().click().await.unwrap();
    b.wait_for("the four routes", async || (b.count("table#routes tr.route").await == 4).then_some(())).await;
    b.screenshot("routes").await;
    for route in ["support-triage", "support-agent", "ticket-router", "refund-review"] {
        s.open_route(route).await;
        b.wait_for(&format!("the graph of {route} to load"), async || {
            let img = b.find("section#route img#graph").await.ok()?;
            let complete = img.prop("complete").await.ok()?.as_bool()?;
            let width = img.prop("naturalWidth").await.ok()?.as_u64()?;
            (complete && width > 0).then_some(())
        })
        .await;
        b.screenshot(&format!("route-graph-{route}")).await;
    }
    s.assert_token_kept_private().await;
}

#[tokio::test]
async fn the_runs_page_shows_new_runs_live_and_filters_them() {
    let stub = asking_stub();
    let Some(s) = setup(stub.path(), &[]).await else { return };
    let b = &s.browser;
    s.sign_in().await;
    s.mark_document().await;
    // Runs started through the API while the page is open appear on it.
    let start = |route: &str| json!({"route_id": route, "goal": {"ticket": "charged twice"}, "model_profile": "default"});
    let (_, triage) = post(&s.server, "/v1/runs?wait=true", start("support-triage")).await;
    let (_, agent) = post(&s.server, "/v1/runs?wait=true", start("support-agent")).await;
    let (triage, agent) = (triage["run_id"].as_str().unwrap().to_owned(), agent["run_id"].as_str().unwrap().to_owned());
    let row = |id: &str, status: &str| format!("table#runs tr.run[data-run-id=\"{id}\"][data-status=\"{status}\"]");
    b.wait_find(&row(&triage, "completed")).await;
    b.wait_find(&row(&agent, "awaiting_input")).await;
    s.assert_same_document("new runs appeared").await;
    assert_eq!(run_cell(b, &triage, "td.route").await.trim(), "support-triage");
    assert_eq!(run_cell(b, &triage, "td.status").await.trim(), "completed");
    assert_eq!(run_cell(b, &triage, "a.open").await.trim(), triage);
    for cell in ["td.started", "td.duration", "td.reason"] {
        run_cell(b, &triage, cell).await;
    }
    b.screenshot("runs-live").await;
    // A status change shows live too.
    let (status, _) = post(&s.server, &format!("/v1/runs/{agent}/reply"), json!({"message": "order 42"})).await;
    assert_eq!(status, 202);
    b.wait_find(&row(&agent, "completed")).await;
    // One more waiting run, for the status filter.
    let (_, waiting) = post(&s.server, "/v1/runs?wait=true", start("support-agent")).await;
    let waiting = waiting["run_id"].as_str().unwrap().to_owned();
    b.wait_find(&row(&waiting, "awaiting_input")).await;
    s.assert_same_document("runs changed status").await;
    // Filters: by status, then by route.
    choose(b, "select#filter-status", "awaiting_input").await;
    b.wait_for("only the waiting run", async || (visible_runs(b).await == vec![waiting.clone()]).then_some(())).await;
    b.screenshot("runs-filter-status").await;
    choose_first(b, "select#filter-status").await;
    choose(b, "select#filter-route", "support-agent").await;
    b.wait_for("only support-agent's runs", async || {
        let mut shown = visible_runs(b).await;
        shown.sort();
        let mut want = vec![agent.clone(), waiting.clone()];
        want.sort();
        (shown == want).then_some(())
    })
    .await;
    b.screenshot("runs-filter-route").await;
    choose(b, "select#filter-status", "completed").await;
    b.wait_for("only support-agent's completed run", async || (visible_runs(b).await == vec![agent.clone()]).then_some(())).await;
    // Both off: all three.
    choose_first(b, "select#filter-status").await;
    choose_first(b, "select#filter-route").await;
    b.wait_for("all three runs", async || (visible_runs(b).await.len() == 3).then_some(())).await;
    // A row opens its run.
    b.find(&format!("tr.run[data-run-id=\"{triage}\"] a.open")).await.unwrap().click().await.unwrap();
    s.run_reaches(&triage, "completed").await;
    s.assert_token_kept_private().await;
}

/// Picks the option with `value` in the select `css`.
async fn choose(b: &Browser, css: &str, value: &str) {
    let option = format!("{css} option[value=\"{value}\"]");
    b.wait_for(&format!("to choose {value} in {css}"), async || b.find(&option).await.ok()?.click().await.ok()).await;
}

/// Picks the first option (no filter) of the select `css`.
async fn choose_first(b: &Browser, css: &str) {
    let option = format!("{css} option");
    b.wait_for(&format!("to reset {css}"), async || b.find(&option).await.ok()?.click().await.ok()).await;
}

/// The ids of the run rows a reader sees.
async fn visible_runs(b: &Browser) -> Vec<String> {
    // One script: a row-by-row walk is hundreds of round trips, and rows change meanwhile.
    let v = b
        .script(
            "return Array.from(document.querySelectorAll('table#runs tr.run')).filter(r => r.offsetParent !== null \
             && getComputedStyle(r).visibility !== 'hidden').map(r => r.getAttribute('data-run-id'));",
            json!([]),
        )
        .await;
    v.as_array().into_iter().flatten().filter_map(|id| id.as_str().map(str::to_owned)).collect()
}

/// Whether the page is wider than the window (something long and unbroken pushed it out).
async fn page_overflows(b: &Browser) -> Value {
    b.script("const d = document.documentElement; return d.scrollWidth > d.clientWidth + 1 ? [d.scrollWidth, d.clientWidth] : null;", json!([])).await
}

/// The text of the first element matching `css`, once it holds `part`.
async fn text_with(b: &Browser, css: &str, part: &str) -> String {
    b.wait_for(&format!("{css} to say {part:?}"), async || b.find(css).await.ok()?.text().await.ok().filter(|t| t.contains(part))).await
}

/// A pasted token with a character no HTTP header can carry (here a typographic dash) is
/// refused where it is typed, instead of every call failing with a browser error.
#[tokio::test]
async fn a_token_no_header_can_carry_is_refused_where_it_is_typed() {
    let stub = asking_stub();
    let Some(s) = setup(stub.path(), &[]).await else { return };
    let b = &s.browser;
    b.goto(&s.ui("")).await;
    let input = b.wait_displayed("input#token").await;
    input.send_keys(&format!("{TOKEN}\u{2011}x")).await.unwrap();
    b.find("button#token-save").await.unwrap().click().await.unwrap();
    text_with(b, "#token-error", "visible ASCII").await;
    assert!(!gone(b, "form#token-form").await, "the token form is still there");
    let stored = b.script("return window.sessionStorage.getItem('fabric-token');", json!([])).await;
    assert_eq!(stored, Value::Null, "the unusable token is not kept");
    b.screenshot("token-refused").await;
    // A stored one from before is asked again too.
    b.script("window.sessionStorage.setItem('fabric-token', 'caf\u{e9}');", json!([])).await;
    b.refresh().await;
    text_with(b, "#token-error", "visible ASCII").await;
    let input = b.wait_displayed("input#token").await;
    input.send_keys(TOKEN).await.unwrap();
    b.find("button#token-save").await.unwrap().click().await.unwrap();
    b.wait_find("select#filter-route option[value=\"support-triage\"]").await;
    s.assert_token_kept_private().await;
}

/// While the service cannot be reached each page says so in plain words and tries again; once it
/// answers the page fills in and the message goes, without a reload. (The page's `fetch` is made
/// to fail the way it does when nothing listens, then given back.)
#[tokio::test]
async fn the_pages_say_when_the_service_cannot_be_reached_and_recover_when_it_answers() {
    const CUT: &str = "window.__fetch = window.__fetch || window.fetch; window.fetch = () => Promise.reject(new TypeError('Failed to fetch'));";
    const MEND: &str = "if (window.__fetch) window.fetch = window.__fetch;";
    const SAID: &str = "cannot be reached";
    let stub = asking_stub();
    let Some(s) = setup(stub.path(), &[]).await else { return };
    let b = &s.browser;
    s.sign_in().await;
    let (_, run) =
        post(&s.server, "/v1/runs?wait=true", json!({"route_id": "support-triage", "goal": {"ticket": "charged twice"}, "model_profile": "default"})).await;
    let id = run["run_id"].as_str().unwrap().to_owned();
    s.mark_document().await;
    let go = |hash: String| async move {
        b.script("location.hash = arguments[0];", json!([hash])).await;
    };
    // Routes.
    b.script(CUT, json!([])).await;
    go("#/routes".into()).await;
    text_with(b, "section#routes-page .error", SAID).await;
    b.screenshot("routes-unreachable").await;
    b.script(MEND, json!([])).await;
    b.wait_for("the routes once the service answers", async || (b.count("table#routes tr.route").await == 4).then_some(())).await;
    assert!(gone(b, "section#routes-page .error").await, "the message goes once the service answers");
    // A run.
    b.script(CUT, json!([])).await;
    go(format!("#/runs/{id}")).await;
    text_with(b, "#run-problem", SAID).await;
    b.script(MEND, json!([])).await;
    s.run_reaches(&id, "completed").await;
    b.wait_for("the run's message to go", async || b.find("#run-problem").await.ok()?.text().await.ok().filter(|t| t.trim().is_empty())).await;
    b.wait_find("ol#timeline > li.span[data-kind=\"stage\"]").await;
    // The runs list: its message, then its runs and its route filter's choices, the route filter
    // chosen before kept.
    go("#/runs".into()).await;
    choose(b, "select#filter-route", "support-triage").await;
    b.script(CUT, json!([])).await;
    go("#/routes".into()).await;
    go("#/runs".into()).await;
    text_with(b, "#runs-empty", SAID).await;
    b.screenshot("runs-unreachable").await;
    b.script(MEND, json!([])).await;
    b.wait_find(&format!("table#runs tr.run[data-run-id=\"{id}\"]")).await;
    b.wait_find("select#filter-route option[value=\"support-triage\"]").await;
    b.wait_for("the list's message to go", async || b.find("#runs-empty").await.ok()?.text().await.ok().filter(|t| !t.contains(SAID))).await;
    let kept = b.script("return document.querySelector('select#filter-route').value;", json!([])).await;
    assert_eq!(kept, "support-triage", "the route filter chosen before the service went away");
    s.assert_same_document("the pages recovered").await;
}

/// A run id that names no run says so, with no empty timeline, stages or output under it.
#[tokio::test]
async fn a_run_id_that_names_no_run_is_said_so() {
    let stub = asking_stub();
    let Some(s) = setup(stub.path(), &[]).await else { return };
    let b = &s.browser;
    s.sign_in().await;
    b.goto(&s.ui("#/runs/no-such-run")).await;
    text_with(b, "#run-problem", "no run").await;
    text_with(b, "#run-status", "not found").await;
    assert!(gone(b, "ol#timeline").await && gone(b, "div#stages").await && gone(b, "pre#run-output").await, "nothing empty under the message");
    b.screenshot("run-not-found").await;
}

/// A long unbroken question, reply and reader's reply wrap (or are cut) instead of making the
/// page wider than the window.
#[tokio::test]
async fn long_unbroken_questions_and_replies_do_not_widen_the_page() {
    let stub = asking_stub();
    let question = format!("ASK {} which order?", "Q".repeat(3000));
    std::fs::write(stub.path().join("support-agent.yaml"), format!("stages:\n  decide:\n    - {}\n    - 'DONE ok'\n", yaml_str(&question))).unwrap();
    let Some(s) = setup(stub.path(), &[]).await else { return };
    let b = &s.browser;
    s.sign_in().await;
    let (_, run) =
        post(&s.server, "/v1/runs?wait=true", json!({"route_id": "support-agent", "goal": {"q": "W".repeat(3000)}, "model_profile": "default"})).await;
    assert_eq!(run["status"], "awaiting_input", "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    b.goto(&s.ui(&format!("#/runs/{id}"))).await;
    s.run_reaches(&id, "awaiting_input").await;
    text_with(b, "#question", "which order?").await;
    assert_eq!(page_overflows(b).await, Value::Null, "a long question widens the page");
    b.find("textarea#reply-text").await.unwrap().send_keys(&"R".repeat(2000)).await.unwrap();
    b.find("button#reply-send").await.unwrap().click().await.unwrap();
    s.run_reaches(&id, "completed").await;
    b.wait_find("ol#timeline > li.marker[data-kind=\"resumed\"]").await;
    b.wait_for("the second turn's record", async || (b.count("div#stages div.call").await >= 2).then_some(())).await;
    assert_eq!(page_overflows(b).await, Value::Null, "a long reply widens the page");
    b.screenshot("run-long-texts").await;
    b.find("a#nav-runs").await.unwrap().click().await.unwrap();
    b.wait_find(&format!("table#runs tr.run[data-run-id=\"{id}\"]")).await;
    assert_eq!(page_overflows(b).await, Value::Null, "the runs list is wider than the window");
}

/// A failed run shows its reason class on its page, on its timeline and in the runs list; a
/// child run shows as its parent's `child_run` stage.
#[tokio::test]
async fn a_failed_run_shows_its_reason_class_and_a_child_run_its_stage() {
    let stub = asking_stub();
    std::fs::write(stub.path().join("refund-review.yaml"), REFUND_REVIEW_FAILS).unwrap();
    let catalogue = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(routes_dir()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, catalogue.path().join(f.file_name().unwrap())).unwrap();
    }
    std::fs::write(
        catalogue.path().join("parent-flow.yaml"),
        "workflows:\n  parent-flow:\n    stages:\n      - {id: delegate, llm_role: none, kind: child_run, route: ticket-router}\n      \
         - {id: wrap, llm_role: synthesis, capability: answer_text}\nroutes:\n  parent-flow:\n    description: Hand the ticket to ticket-router.\n    \
         model_profile: default\n    prompt_pack: support\n    workflow: parent-flow\n    activation_target: agent-runtime-shared\n",
    )
    .unwrap();
    let dir = catalogue.path().to_str().unwrap();
    let Some(s) = setup(stub.path(), &[("FABRIC_CATALOGUE_DIR", dir)]).await else { return };
    let b = &s.browser;
    s.sign_in().await;
    let start = |route: &str| json!({"route_id": route, "goal": {"ticket": "charged twice"}, "model_profile": "default"});
    let (_, failed) = post(&s.server, "/v1/runs?wait=true", start("refund-review")).await;
    assert_eq!((failed["status"].as_str(), failed["error"]["reason_class"].as_str()), (Some("failed"), Some("schema_validation")), "{failed}");
    let failed = failed["run_id"].as_str().unwrap().to_owned();
    let (_, parent) = post(&s.server, "/v1/runs?wait=true", start("parent-flow")).await;
    assert_eq!(parent["status"], "completed", "{parent}");
    let parent = parent["run_id"].as_str().unwrap().to_owned();
    // The runs list.
    b.wait_find(&format!("table#runs tr.run[data-run-id=\"{failed}\"][data-status=\"failed\"]")).await;
    assert_eq!(run_cell(b, &failed, "td.reason").await.trim(), "schema_validation");
    // The run page: the failure, its stage, and the failed spans.
    b.find(&format!("tr.run[data-run-id=\"{failed}\"] a.open")).await.unwrap().click().await.unwrap();
    s.run_reaches(&failed, "failed").await;
    assert_eq!(text_with(b, "#failure .reason-class", "schema_validation").await.trim(), "schema_validation");
    assert_eq!(text_with(b, "#failure .stage-id", "facts").await.trim(), "facts");
    b.wait_find("ol#timeline > li.span.failed[data-kind=\"stage\"][data-reason-class=\"schema_validation\"]").await;
    b.wait_find("ol#timeline > li.span.failed[data-kind=\"llm\"][data-reason-class=\"schema_validation\"]").await;
    // With the reply the model sent, as received (from `run.llm.failed`: the journal keeps only
    // replies a stage used).
    b.wait_for("the failed stage with its reason and the reply that failed", async || {
        let stages = stage_parts(b).await;
        let facts = &stages.iter().find(|(id, _)| id == "facts")?.1;
        let reply = &facts[2];
        (facts[3].contains("schema_validation") && reply.contains(r#""amount": "lots""#) && reply.contains(r#""duplicate": "maybe""#)).then_some(())
    })
    .await;
    b.screenshot("run-failed").await;
    // The child run's stage.
    b.goto(&s.ui(&format!("#/runs/{parent}"))).await;
    s.run_reaches(&parent, "completed").await;
    let child = b.wait_find("ol#timeline > li.span[data-kind=\"child\"]").await;
    let label = child.text().await.unwrap();
    assert!(label.contains("delegate") && label.contains("child run"), "{label}");
    b.screenshot("run-child").await;
}

/// The service watches the newest 200 runs of a filter: a failed run with 200 newer ones after it
/// is still found by the status filter (a second stream, filtered by status, brings it).
#[tokio::test]
async fn the_status_filter_finds_runs_older_than_the_newest_200() {
    let stub = asking_stub();
    std::fs::write(stub.path().join("refund-review.yaml"), REFUND_REVIEW_FAILS).unwrap();
    let Some(s) = setup(stub.path(), &[]).await else { return };
    let b = &s.browser;
    let start = |route: &str| json!({"route_id": route, "goal": {"ticket": "charged twice"}, "model_profile": "default"});
    let (_, failed) = post(&s.server, "/v1/runs?wait=true", start("refund-review")).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    let failed = failed["run_id"].as_str().unwrap().to_owned();
    for _ in 0..200 {
        let (status, run) = post(&s.server, "/v1/runs?wait=true", start("support-triage")).await;
        assert_eq!((status, run["status"].as_str()), (200, Some("completed")), "{run}");
    }
    s.sign_in().await;
    b.wait_for("the newest 200 runs", async || (visible_runs(b).await.len() == 200).then_some(())).await;
    assert!(!visible_runs(b).await.contains(&failed), "the failed run is older than the newest 200");
    choose(b, "select#filter-status", "failed").await;
    b.wait_for("the old failed run", async || (visible_runs(b).await == vec![failed.clone()]).then_some(())).await;
    assert_eq!(run_cell(b, &failed, "td.reason").await.trim(), "schema_validation");
    b.screenshot("runs-filter-old-failed").await;
}

/// The reply a stage shows and whether it is still streaming, read in one script.
async fn shown_reply(b: &Browser, stage: &str) -> (String, bool) {
    let v = b
        .script(
            "const r = document.querySelector('div#stages > div.stage[data-stage-id=\"' + arguments[0] + '\"] pre.reply'); \
             return r ? [r.textContent, r.classList.contains('streaming')] : ['', false];",
            json!([stage]),
        )
        .await;
    (v[0].as_str().unwrap_or_default().to_owned(), v[1].as_bool().unwrap_or_default())
}

#[tokio::test]
async fn the_run_page_shows_a_stage_s_text_growing_as_it_is_written() {
    let (catalogue, stub) = two_streams();
    let Some(s) = setup(&stub, &[("FABRIC_CATALOGUE_DIR", &catalogue), ("FABRIC_LLM_STUB_LATENCY_MS", "2500")]).await else { return };
    let b = &s.browser;
    let id = s.open_two_streams_run().await;
    s.run_reaches(&id, "running").await;
    // The answer's text, read while it is written: it grows, piece by piece.
    let mut seen: Vec<String> = Vec::new();
    let ended = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < ended {
        let (text, streaming) = shown_reply(b, "answer").await;
        if streaming && !text.is_empty() && seen.last() != Some(&text) {
            seen.push(text);
            if seen.len() == 2 {
                b.script("document.querySelector('div.stage[data-stage-id=\"answer\"]').scrollIntoView();", json!([])).await;
                b.screenshot("run-streaming").await;
            }
        }
        if b.find(&format!("section#run[data-run-id=\"{id}\"][data-status=\"completed\"]")).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    b.screenshot("run-streamed").await;
    assert!(seen.len() >= 2, "the text was read at least twice as it grew: {seen:?}");
    assert!(seen.windows(2).all(|w| w[1].len() > w[0].len() && w[1].starts_with(&w[0])), "it grew: {seen:?}");
    // It ends as the stage's output, the run's.
    let output = settled(&s.server, &id).await["output"].as_str().unwrap().to_owned();
    assert!(seen.iter().all(|t| output.starts_with(t.as_str())), "each reading a start of {output:?}: {seen:?}");
    let last = b
        .wait_for("the answer's whole text", async || {
            let (text, streaming) = shown_reply(b, "answer").await;
            (!streaming && text == output).then_some(text)
        })
        .await;
    assert_eq!(last, output);
}

#[tokio::test]
async fn the_run_page_drops_a_restarted_call_s_text_and_says_it_restarted() {
    // The first attempt shows text (then breaks off, retried); the second writes another text,
    // slowly enough to be read as it grows.
    const TEXT: &str = "The duplicate charge goes back to your card within five days.";
    let url = crate::provider_streams::restarting_anthropic("WRONG WRONG WRONG WRONG WRONG", TEXT, Duration::from_millis(120)).await;
    let (catalogue, stub) = two_streams();
    let env = [
        ("FABRIC_CATALOGUE_DIR", catalogue.as_str()),
        ("FABRIC_LLM_STUB", "0"),
        ("FABRIC_LLM_MODEL", "anthropic:m-1"),
        ("ANTHROPIC_BASE_URL", url.as_str()),
        ("ANTHROPIC_API_KEY", "test-key-123"),
    ];
    let Some(s) = setup(&stub, &env).await else { return };
    let b = &s.browser;
    let id = s.open_two_streams_run().await;
    // While the second attempt writes: the note says it restarted, and none of the first
    // attempt's text is left.
    let (text, note) = b
        .wait_for("the draft's second attempt, streaming", async || {
            let v = b
                .script(
                    "const s = document.querySelector('div#stages > div.stage[data-stage-id=\"draft\"]'); \
                     const r = s && s.querySelector('pre.reply.streaming'); const n = s && s.querySelector('p.restarted'); \
                     return r && n && r.textContent ? [r.textContent, n.textContent] : null;",
                    json!([]),
                )
                .await;
            Some((v[0].as_str()?.to_owned(), v[1].as_str()?.to_owned()))
        })
        .await;
    b.screenshot("run-restarted").await;
    assert!(TEXT.starts_with(&text) && !text.contains("WRONG"), "{text:?}");
    assert!(note.contains("restarted: attempt 2"), "{note}");
    s.run_reaches(&id, "completed").await;
    let last = b
        .wait_for("the draft's whole text", async || {
            let (text, streaming) = shown_reply(b, "draft").await;
            (!streaming && !text.is_empty()).then_some(text)
        })
        .await;
    assert_eq!(last, TEXT);
}

/// The schedules page lists each schedule with its next fires and its recent fires, each linked
/// to its run (issue 50).
#[tokio::test]
async fn the_schedules_page_lists_schedules_with_next_fires_and_recent_fires_linked_to_runs() {
    let stub = asking_stub();
    let Some(s) = setup(stub.path(), &[]).await else { return };
    let b = &s.browser;
    let body = json!({"route_id": "support-triage", "goal": {"ticket": "t"}, "cron": "* * * * * *", "overlap": "allow_all"});
    let (_, made) = post(&s.server, "/v1/schedules", body).await;
    let id = made["id"].as_str().unwrap().to_owned();
    s.sign_in().await;
    b.click_displayed("a#nav-schedules").await;
    let row = format!("table#schedules tr.schedule[data-schedule-id=\"{id}\"]");
    b.wait_find(&row).await;
    let link = format!("{row} li.fire[data-outcome=\"started\"] a.open");
    b.wait_for("a started fire linked to its run", async || b.find(&link).await.ok()).await;
    assert!(b.find(&format!("{row} td.cron")).await.unwrap().text().await.unwrap().contains("* * * * * *"));
    b.screenshot("schedules").await;
    b.click_displayed(&link).await;
    b.wait_find("section#run").await;
}

#[tokio::test]
async fn the_inspector_lists_experiments_and_shows_a_report_failing_cases_first() {
    let stub = asking_stub();
    let Some(s) = setup(stub.path(), &[]).await else { return };
    let b = &s.browser;
    // An experiment of `fabric eval` in the service's store: one case right, one wrong.
    let store = format!("sqlite://{}", s._db.path().join("fabric.db").display());
    let dataset = s._db.path().join("triage.yaml");
    let case = |id: &str, category: &str| {
        format!("  - id: {id}\n    route_id: support-triage\n    goal: {{ticket: hi}}\n    expected: {{stages: {{intake: {{category: {category}}}}}}}\n")
    };
    let text = format!(
        "name: triage\nevaluators:\n  - stage_equals: {{stage: intake, path: category}}\ncases:\n{}{}",
        case("right", "billing"),
        case("wrong", "technical")
    );
    std::fs::write(&dataset, text).unwrap();
    let out =
        crate::support::fabric_cli(&["eval", "run", dataset.to_str().unwrap(), "--store", &store, "--format", "json"], &[("FABRIC_LLM_STUB", "1".into())])
            .await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let experiment = serde_json::from_slice::<Value>(&out.stdout).unwrap()["experiment_id"].as_str().unwrap().to_owned();
    s.sign_in().await;
    b.click_displayed("a#nav-experiments").await;
    let open = format!("table#experiments tr.experiment[data-experiment-id=\"{experiment}\"] a.open");
    b.wait_for("the experiment's link", async || b.find(&open).await.ok()?.click().await.ok()).await;
    let rows = b
        .wait_for("the report's cases", async || {
            let rows = b.find_all("table#experiment tr.case").await.ok()?;
            let mut ids = Vec::new();
            for r in &rows {
                ids.push(r.attr("data-case-id").await.ok()??);
            }
            (ids.len() == 2).then_some(ids)
        })
        .await;
    assert_eq!(rows, ["wrong", "right"], "failing cases first");
    let heading = b.find("#experiment-page h2").await.unwrap().text().await.unwrap();
    assert_eq!(heading, "triage: 1/2 cases passed (50.0%)");
    let failing = b.find("table#experiment tr.case.fail").await.unwrap().text().await.unwrap();
    assert!(failing.contains("FAIL 0%") && failing.contains("expected \"technical\""), "{failing}");
    b.screenshot("experiment-report").await;
    // Each run links to its page.
    b.find("table#experiment tr.case.fail a.open").await.unwrap().click().await.unwrap();
    b.wait_find("section#run").await;
    assert!(b.current_url().await.contains("#/runs/"));
}
