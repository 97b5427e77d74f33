//! How long a provider's 429 says to wait: `Retry-After`, or else the provider's own
//! rate-limit headers or body. The flow gate pauses every call of the model that long.

use std::time::{Duration, SystemTime};

use super::{MAX_RETRY_AFTER, Wait, retry_after};

/// The wait a 429 names: `retry-after-ms`/`retry-after`; else OpenAI's
/// `x-ratelimit-reset-requests`/`-tokens` (Go durations: `6m0s`, `1.5s`, `20ms`); else
/// Anthropic's `anthropic-ratelimit-*-reset` (RFC 3339 instants); else Gemini's
/// `error.details[].retryDelay` in the body (`"2s"`). Of several resets the longest, since the
/// 429 does not say which limit it hit. Anything unreadable is no hint (the gate backs off).
/// Each is read up to [`MAX_RETRY_AFTER`]; the gate bounds the pause it takes by the
/// operator's `FABRIC_LLM_MAX_PAUSE_S`.
pub fn rate_limit_hint(headers: &reqwest::header::HeaderMap, body: Option<&[u8]>, now: SystemTime) -> Option<Wait> {
    if let Some(w) = retry_after(headers) {
        return Some(w);
    }
    let text = |k: &str| headers.get(k).and_then(|v| v.to_str().ok()).map(str::trim);
    let longest = |ws: &mut dyn Iterator<Item = Wait>| ws.max_by_key(|w| w.after).map(|w| Wait { after: w.after.min(MAX_RETRY_AFTER), from: w.from });
    const OPENAI: [&str; 2] = ["x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"];
    if let Some(w) = longest(&mut OPENAI.iter().filter_map(|k| Some(Wait { after: go_duration(text(k)?)?, from: k }))) {
        return Some(w);
    }
    const ANTHROPIC: [&str; 4] = [
        "anthropic-ratelimit-requests-reset",
        "anthropic-ratelimit-tokens-reset",
        "anthropic-ratelimit-input-tokens-reset",
        "anthropic-ratelimit-output-tokens-reset",
    ];
    let until = |t: &str| humantime::parse_rfc3339_weak(t).ok().map(|at| at.duration_since(now).unwrap_or(Duration::ZERO));
    if let Some(w) = longest(&mut ANTHROPIC.iter().filter_map(|k| Some(Wait { after: until(text(k)?)?, from: k }))) {
        return Some(w);
    }
    body.and_then(gemini_retry_delay).map(|d| Wait { after: d.min(MAX_RETRY_AFTER), from: "error.details[].retryDelay" })
}

/// A Go duration as OpenAI writes its resets: numbers (maybe fractional) each with a unit of
/// `h`, `m`, `s`, `ms`, `us`/`µs` or `ns`. Hand-written: humantime refuses fractions.
fn go_duration(text: &str) -> Option<Duration> {
    let mut rest = text;
    let mut total = 0.0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let n = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).filter(|n| *n > 0)?;
        let value: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let unit = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[unit..];
    }
    Duration::try_from_secs_f64(total).ok()
}

/// Gemini's `RetryInfo`: `{"error": {"details": [{"@type": "...RetryInfo", "retryDelay": "2s"}]}}`.
fn gemini_retry_delay(body: &[u8]) -> Option<Duration> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let details = v.get("error")?.get("details")?.as_array()?;
    let delay = details.iter().find_map(|d| d.get("retryDelay").and_then(|s| s.as_str()))?;
    let seconds: f64 = delay.trim().strip_suffix('s')?.parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::try_from_secs_f64(seconds).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn each_providers_hint_is_read() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let hint = |h: &[(&str, &str)], body: Option<&str>| rate_limit_hint(&headers(h), body.map(str::as_bytes), now).map(|w| w.after);
        assert_eq!(hint(&[("retry-after", "2"), ("x-ratelimit-reset-requests", "9s")], None), Some(Duration::from_secs(2)));
        assert_eq!(hint(&[("x-ratelimit-reset-requests", "20ms"), ("x-ratelimit-reset-tokens", "6m0s")], None), Some(Duration::from_secs(360)));
        assert_eq!(hint(&[("x-ratelimit-reset-tokens", "1.5s")], None), Some(Duration::from_millis(1500)));
        assert_eq!(hint(&[("x-ratelimit-reset-requests", "1h2m3s")], None), Some(MAX_RETRY_AFTER.min(Duration::from_secs(3723))));
        assert_eq!(hint(&[("x-ratelimit-reset-tokens", "99999999h")], None), Some(MAX_RETRY_AFTER), "an hours-long reset is read up to a day");
        let from = rate_limit_hint(&headers(&[("x-ratelimit-reset-requests", "1s"), ("x-ratelimit-reset-tokens", "6s")]), None, now).map(|w| w.from);
        assert_eq!(from, Some("x-ratelimit-reset-tokens"), "the header of the longest is named");
        let at = humantime::format_rfc3339(now + Duration::from_secs(7)).to_string();
        assert_eq!(hint(&[("anthropic-ratelimit-tokens-reset", &at)], None), Some(Duration::from_secs(7)));
        let past = humantime::format_rfc3339(now - Duration::from_secs(7)).to_string();
        assert_eq!(hint(&[("anthropic-ratelimit-requests-reset", &past)], None), Some(Duration::ZERO));
        let gemini = r#"{"error":{"code":429,"details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure"},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"2.5s"}]}}"#;
        assert_eq!(hint(&[], Some(gemini)), Some(Duration::from_millis(2500)));
        for (h, body) in [
            (vec![("x-ratelimit-reset-requests", "soon")], None),
            (vec![("x-ratelimit-reset-requests", "5")], None),
            (vec![("anthropic-ratelimit-requests-reset", "tomorrow")], None),
            (vec![], Some(r#"{"error":{"details":[{"retryDelay":"-3s"}]}}"#)),
            (vec![], Some("not json")),
        ] {
            assert_eq!(hint(&h, body), None, "{h:?} {body:?}");
        }
    }
}
