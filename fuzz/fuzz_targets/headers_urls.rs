//! What a peer or a configuration file sends as a header or a URL never panics, and the views
//! of a URL never show what they must hide: `Retry-After` parsing, origin-and-path, redaction.
#![no_main]

use fabric::llm::providers::{MAX_RETRY_AFTER, retry_after};
use fabric::redact::{origin_and_path, redact_url};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = reqwest::header::HeaderValue::from_bytes(data) {
        for name in ["retry-after", "retry-after-ms"] {
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(name, value.clone());
            if let Some(d) = retry_after(&headers) {
                assert!(d <= MAX_RETRY_AFTER);
            }
        }
    }
    let Ok(text) = std::str::from_utf8(data) else { return };
    let shown = origin_and_path(text);
    let redacted = redact_url(text);
    if let Ok(url) = reqwest::Url::parse(text.trim()) {
        if url.password().is_some_and(|p| p.len() > 3) {
            let p = url.password().unwrap_or_default();
            assert!(!shown.contains(p) || url.host_str().is_some_and(|h| h.contains(p)) || url.path().contains(p));
        }
        if let Some(q) = url.query().filter(|q| q.len() > 3 && !q.contains('=')) {
            assert!(!redacted.contains(&format!("?{q}")));
        }
    }
});
