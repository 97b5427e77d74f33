//! A small W3C WebDriver client for the browser tests: `chromedriver` as a child process, one
//! headless Chromium session on it, and the handful of commands the tests use (over HTTP with
//! reqwest and serde_json; no WebDriver crate).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The key of an element reference in W3C WebDriver answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long a wait lasts before the test fails: generous, for a busy 2-core machine.
pub(crate) const PATIENCE: Duration = Duration::from_secs(20);

/// What a WebDriver command answered when it failed: its error code and message.
#[derive(Debug, Clone)]
pub(crate) struct WdError {
    pub code: String,
    pub message: String,
}

impl std::fmt::Display for WdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

pub(crate) type WdResult<T> = Result<T, WdError>;

/// A program on `PATH`, when there is one.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// `chromedriver` and a headless Chromium session on it; both end when this is dropped.
#[derive(Debug)]
pub(crate) struct Browser {
    driver: Child,
    /// `http://127.0.0.1:<port>/session/<id>`.
    session: String,
    port: u16,
    session_id: String,
    http: reqwest::Client,
}

impl Browser {
    /// Starts chromedriver and a session. Without chromedriver or Chromium the test is skipped
    /// (`None`, through `support::skip_unless`), except under `CI=true`, where it fails.
    pub(crate) async fn launch() -> Option<Browser> {
        let driver = on_path("chromedriver");
        let chromium = ["chromium", "chromium-browser", "google-chrome"].into_iter().find_map(on_path);
        let (Some(driver), Some(chromium)) = (driver, chromium) else {
            let why = "chromedriver or chromium is not installed (Debian: apt-get install chromium chromium-driver; .ci/run does it)";
            crate::support::skip_unless(false, "a browser", why);
            return None;
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(&driver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{} does not start: {e}", driver.display()));
        let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).no_proxy().build().unwrap();
        let mut browser = Browser { driver: child, session: String::new(), port, session_id: String::new(), http };
        let base = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        loop {
            let ready = match browser.http.get(format!("{base}/status")).send().await {
                Ok(r) => r.json::<Value>().await.ok().and_then(|v| v["value"]["ready"].as_bool()).unwrap_or(false),
                Err(_) => false,
            };
            if ready {
                break;
            }
            if let Ok(Some(status)) = browser.driver.try_wait() {
                panic!("chromedriver exited at start: {status}");
            }
            assert!(started.elapsed() < PATIENCE, "chromedriver is not ready after {PATIENCE:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.to_str().unwrap(),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"],
            },
        }}});
        let answer = browser.command(reqwest::Method::POST, &format!("{base}/session"), Some(caps)).await.unwrap_or_else(|e| panic!("no browser session: {e}"));
        browser.session_id = answer["sessionId"].as_str().expect("a session id").to_owned();
        browser.session = format!("{base}/session/{}", browser.session_id);
        Some(browser)
    }

    async fn command(&self, method: reqwest::Method, url: &str, body: Option<Value>) -> WdResult<Value> {
        let mut req = self.http.request(method, url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let response = req.send().await.map_err(|e| WdError { code: "transport".into(), message: e.to_string() })?;
        let ok = response.status().is_success();
        let v: Value = response.json().await.map_err(|e| WdError { code: "transport".into(), message: e.to_string() })?;
        let value = v.get("value").cloned().unwrap_or(Value::Null);
        if ok {
            Ok(value)
        } else {
            Err(WdError {
                code: value["error"].as_str().unwrap_or("unknown error").to_owned(),
                message: value["message"].as_str().unwrap_or_default().lines().next().unwrap_or_default().to_owned(),
            })
        }
    }

    async fn get(&self, path: &str) -> WdResult<Value> {
        self.command(reqwest::Method::GET, &format!("{}{path}", self.session), None).await
    }

    async fn post(&self, path: &str, body: Value) -> WdResult<Value> {
        self.command(reqwest::Method::POST, &format!("{}{path}", self.session), Some(body)).await
    }

    /// Loads `url` (and waits for the document to load, as WebDriver does).
    pub(crate) async fn goto(&self, url: &str) {
        self.post("/url", json!({ "url": url })).await.unwrap_or_else(|e| panic!("navigate to {url}: {e}"));
    }

    pub(crate) async fn refresh(&self) {
        self.post("/refresh", json!({})).await.unwrap();
    }

    pub(crate) async fn current_url(&self) -> String {
        self.get("/url").await.unwrap().as_str().unwrap_or_default().to_owned()
    }

    /// The first element matching `css`, if any.
    pub(crate) async fn find(&self, css: &str) -> WdResult<Element<'_>> {
        let v = self.post("/element", json!({"using": "css selector", "value": css})).await?;
        Ok(Element { browser: self, id: v[ELEMENT].as_str().unwrap_or_default().to_owned() })
    }

    /// Every element matching `css` (none is an empty list).
    pub(crate) async fn find_all(&self, css: &str) -> WdResult<Vec<Element<'_>>> {
        let v = self.post("/elements", json!({"using": "css selector", "value": css})).await?;
        Ok(v.as_array().into_iter().flatten().map(|e| Element { browser: self, id: e[ELEMENT].as_str().unwrap_or_default().to_owned() }).collect())
    }

    /// How many elements match `css` (0 when the query fails).
    pub(crate) async fn count(&self, css: &str) -> usize {
        self.find_all(css).await.map(|v| v.len()).unwrap_or(0)
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page and returns its value.
    pub(crate) async fn script(&self, script: &str, args: Value) -> Value {
        self.post("/execute/sync", json!({"script": script, "args": args})).await.unwrap_or_else(|e| panic!("script {script:?}: {e}"))
    }

    /// Polls `check` every 100 ms until it gives a value; after `PATIENCE` a screenshot of the
    /// page is written (`failed-<what>.png`) and the test fails naming `what`.
    pub(crate) async fn wait_for<T>(&self, what: &str, check: impl AsyncFnMut() -> Option<T>) -> T {
        self.wait_for_within(what, PATIENCE, check).await
    }

    pub(crate) async fn wait_for_within<T>(&self, what: &str, patience: Duration, mut check: impl AsyncFnMut() -> Option<T>) -> T {
        let started = Instant::now();
        loop {
            if let Some(v) = check().await {
                return v;
            }
            if started.elapsed() > patience {
                let name: String = what.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).take(60).collect();
                let shot = self.screenshot(&format!("failed-{name}")).await;
                let url = self.current_url().await;
                let body = self.find("body").await.ok();
                let text = match body {
                    Some(b) => b.text().await.unwrap_or_default(),
                    None => String::new(),
                };
                panic!("waited {patience:?} for {what}; the page {url} ({}) reads:\n{text}", shot.display());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The first element matching `css`, once there is one.
    pub(crate) async fn wait_find(&self, css: &str) -> Element<'_> {
        self.wait_for(&format!("an element `{css}`"), async || self.find(css).await.ok()).await
    }

    /// The first element matching `css`, once there is one and it is displayed.
    pub(crate) async fn wait_displayed(&self, css: &str) -> Element<'_> {
        self.wait_for(&format!("a displayed element `{css}`"), async || {
            let e = self.find(css).await.ok()?;
            e.displayed().await.then_some(e)
        })
        .await
    }

    /// Clicks the element once it is displayed; found again when the page re-rendered it between
    /// the finding and the click (a live page redraws as a run's events come).
    pub(crate) async fn click_displayed(&self, css: &str) {
        self.wait_for(&format!("a click on `{css}`"), async || {
            let e = self.find(css).await.ok()?;
            if !e.displayed().await {
                return None;
            }
            e.click().await.ok()
        })
        .await
    }

    /// A PNG of the viewport at `target/ui-screenshots/<name>.png`; returns its path.
    pub(crate) async fn screenshot(&self, name: &str) -> PathBuf {
        self.save_screenshot("/screenshot", name).await
    }

    /// The PNG that `GET <session>/<endpoint>` answers, at `target/ui-screenshots/<name>.png`.
    async fn save_screenshot(&self, endpoint: &str, name: &str) -> PathBuf {
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        match self.get(endpoint).await {
            Ok(v) => std::fs::write(&path, base64_decode(v.as_str().unwrap_or_default())).unwrap(),
            Err(e) => eprintln!("no screenshot {name}: {e}"),
        }
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Closing the session ends Chromium; then chromedriver itself. Synchronously: a drop
        // cannot wait on the async client.
        if !self.session_id.is_empty() {
            let _ = delete_session(self.port, &self.session_id);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// `DELETE /session/<id>` over a plain blocking socket.
fn delete_session(port: u16, id: &str) -> std::io::Result<()> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(s, "DELETE /session/{id} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
    // chromedriver answers once the browser has quit; the head of that answer is all we wait
    // for (it may keep the connection open despite `Connection: close`).
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&chunk[..n]);
    }
    Ok(())
}

/// The screenshots' folder: `ui-screenshots` in the target directory.
pub(crate) fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap().join("ui-screenshots")
}

/// An element of the page (a reference that goes stale when the page re-renders it).
#[derive(Debug)]
pub(crate) struct Element<'a> {
    browser: &'a Browser,
    id: String,
}

impl Element<'_> {
    fn path(&self, rest: &str) -> String {
        format!("/element/{}{rest}", self.id)
    }

    pub(crate) async fn click(&self) -> WdResult<()> {
        self.browser.post(&self.path("/click"), json!({})).await.map(drop)
    }

    pub(crate) async fn clear(&self) -> WdResult<()> {
        self.browser.post(&self.path("/clear"), json!({})).await.map(drop)
    }

    pub(crate) async fn send_keys(&self, text: &str) -> WdResult<()> {
        self.browser.post(&self.path("/value"), json!({ "text": text })).await.map(drop)
    }

    /// Its rendered text (what a reader sees; hidden parts are left out).
    pub(crate) async fn text(&self) -> WdResult<String> {
        Ok(self.browser.get(&self.path("/text")).await?.as_str().unwrap_or_default().to_owned())
    }

    pub(crate) async fn attr(&self, name: &str) -> WdResult<Option<String>> {
        Ok(self.browser.get(&self.path(&format!("/attribute/{name}"))).await?.as_str().map(str::to_owned))
    }

    pub(crate) async fn prop(&self, name: &str) -> WdResult<Value> {
        self.browser.get(&self.path(&format!("/property/{name}"))).await
    }

    /// A PNG of just this element (scrolled into view) at `target/ui-screenshots/<name>.png`.
    pub(crate) async fn screenshot(&self, name: &str) -> PathBuf {
        self.browser.save_screenshot(&self.path("/screenshot"), name).await
    }

    pub(crate) async fn displayed(&self) -> bool {
        self.browser.get(&self.path("/displayed")).await.ok().and_then(|v| v.as_bool()).unwrap_or(false)
    }
}

/// Standard base64 (WebDriver's screenshots), padding and whitespace ignored.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for v in text.bytes().filter_map(value) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

#[test]
fn base64_decodes_what_webdriver_sends() {
    assert_eq!(base64_decode("iVBORw0KGgo="), b"\x89PNG\r\n\x1a\n");
    assert_eq!(base64_decode("aGVsbG8gd29ybGQ="), b"hello world");
    assert_eq!(base64_decode("YQ=="), b"a");
}
