//! The completion webhooks' settings (`FABRIC_WEBHOOK_*`): where runs' ends are posted, which
//! origins a start contract's `webhook_url` may name, the signing secret, and the retries.
//!
//! Webhooks are always signed: a URL or an allowed origin without `FABRIC_WEBHOOK_SECRET` is a
//! configuration error, not unsigned deliveries.

use std::fmt;
use std::time::Duration;

use url::Url;

use crate::vocab::{ConfigError, err};

/// The signing key: the bytes of `whsec_<base64>`. Its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret(Vec<u8>);

impl WebhookSecret {
    /// The key as Standard Webhooks reads it (`whsec_` and the base64 of 24 to 64 bytes).
    pub fn parse(var: &str, text: &str) -> Result<WebhookSecret, ConfigError> {
        use base64::Engine as _;
        let text = text.trim();
        let Some(b64) = text.strip_prefix("whsec_") else {
            return Err(err(var, "must be `whsec_` followed by the base64 of the key (as Standard Webhooks secrets are written)"));
        };
        // Never echoed: the text is the secret.
        let key = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| err(var, "the part after `whsec_` is not base64"))?;
        if !(24..=64).contains(&key.len()) {
            return Err(err(var, format!("the key is {} bytes; Standard Webhooks keys are 24 to 64 bytes", key.len())));
        }
        Ok(WebhookSecret(key))
    }

    /// The key in the form Standard Webhooks' libraries take.
    pub fn as_whsec(&self) -> String {
        use base64::Engine as _;
        format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(<redacted>)")
    }
}

/// `FABRIC_WEBHOOK_*`.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookSettings {
    /// `FABRIC_WEBHOOK_URL`: where every run's ends go, unless its start contract names another.
    pub url: Option<Url>,
    /// `FABRIC_WEBHOOK_ALLOWED_ORIGINS`: the origins a contract's `webhook_url` may name.
    pub allowed_origins: Vec<url::Origin>,
    /// `FABRIC_WEBHOOK_SECRET`: set whenever a URL or an origin is.
    pub secret: Option<WebhookSecret>,
    /// `FABRIC_WEBHOOK_MAX_ATTEMPTS` (default 8): attempts per delivery, the first included.
    pub max_attempts: u32,
    /// `FABRIC_WEBHOOK_BACKOFF_BASE_S` (default 1): the wait before the first retry; doubling.
    pub backoff_base: Duration,
    /// `FABRIC_WEBHOOK_BACKOFF_MAX_S` (default 600): the longest wait between attempts.
    pub backoff_max: Duration,
}

/// Why a start contract's `webhook_url` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookRefused {
    #[error("`webhook_url` is not an http or https URL with a host of at most {MAX_WEBHOOK_URL} bytes")]
    Invalid,
    #[error("`webhook_url` names the origin {origin}, which is not in FABRIC_WEBHOOK_ALLOWED_ORIGINS{}", if *.none_allowed { " (none are: this fleet takes no webhook_url)" } else { "" })]
    NotAllowed { origin: String, none_allowed: bool },
}

/// The longest `webhook_url` a start contract may give.
pub const MAX_WEBHOOK_URL: usize = 2048;

/// An http(s) URL with a host (also how a start contract's `webhook_url` is compared with a
/// retry's: as the service reads it).
pub fn web_url(text: &str) -> Option<Url> {
    Url::parse(text.trim()).ok().filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
}

impl WebhookSettings {
    /// Reads the variables through `get`.
    pub(super) fn load(get: &dyn Fn(&str) -> Option<String>) -> Result<WebhookSettings, ConfigError> {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let url = match get("FABRIC_WEBHOOK_URL") {
            None => None,
            // The value is not echoed: its query or credentials may be secret.
            Some(u) => Some(web_url(&u).ok_or_else(|| err("FABRIC_WEBHOOK_URL", "is not an http or https URL with a host"))?),
        };
        let mut allowed_origins = Vec::new();
        for entry in get("FABRIC_WEBHOOK_ALLOWED_ORIGINS").unwrap_or_default().split(',').map(str::trim).filter(|e| !e.is_empty()) {
            // Shown without credentials or query values (an entry may hold them by mistake).
            let shown = crate::redact::redact_url(entry);
            let bad = |why: &str| err("FABRIC_WEBHOOK_ALLOWED_ORIGINS", format!("`{shown}` {why}"));
            // The URL parser takes `*` as a host's letter: the entry would be listed, and never match.
            if entry.contains('*') {
                return Err(bad("holds a `*`: wildcards are not supported; list each origin (scheme, host and port) on its own"));
            }
            let u = web_url(entry).ok_or_else(|| bad("is not an origin such as https://hooks.example.com or http://127.0.0.1:9000"))?;
            if !u.username().is_empty() || u.password().is_some() || u.query().is_some() || u.fragment().is_some() || u.path() != "/" {
                return Err(bad("must be an origin alone: a scheme, a host and a port, no path, query or credentials"));
            }
            allowed_origins.push(u.origin());
        }
        let secret = get("FABRIC_WEBHOOK_SECRET").map(|s| WebhookSecret::parse("FABRIC_WEBHOOK_SECRET", &s)).transpose()?;
        if secret.is_none() && (url.is_some() || !allowed_origins.is_empty()) {
            return Err(err(
                "FABRIC_WEBHOOK_SECRET",
                "must be set with FABRIC_WEBHOOK_URL or FABRIC_WEBHOOK_ALLOWED_ORIGINS: every webhook is signed (`whsec_` and base64)",
            ));
        }
        let whole = |var: &str, default: u64, max: u64| -> Result<u64, ConfigError> {
            match get(var).map(|v| v.trim().to_owned()) {
                None => Ok(default),
                Some(v) => {
                    v.parse::<u64>().ok().filter(|n| (1..=max).contains(n)).ok_or_else(|| err(var, format!("`{v}` must be a whole number from 1 to {max}")))
                }
            }
        };
        let backoff_base = Duration::from_secs(whole("FABRIC_WEBHOOK_BACKOFF_BASE_S", 1, 3600)?);
        let backoff_max = Duration::from_secs(whole("FABRIC_WEBHOOK_BACKOFF_MAX_S", 600, 86_400)?);
        if backoff_max < backoff_base {
            return Err(err("FABRIC_WEBHOOK_BACKOFF_MAX_S", "must not be shorter than FABRIC_WEBHOOK_BACKOFF_BASE_S"));
        }
        Ok(WebhookSettings { url, allowed_origins, secret, max_attempts: whole("FABRIC_WEBHOOK_MAX_ATTEMPTS", 8, 100)? as u32, backoff_base, backoff_max })
    }

    /// Where a run accepted with the contract's `webhook_url` posts its ends: that URL if its
    /// origin is allowed, else the fleet's `FABRIC_WEBHOOK_URL`, else nowhere.
    pub fn target(&self, contract: Option<&str>) -> Result<Option<String>, WebhookRefused> {
        let Some(text) = contract else { return Ok(self.url.as_ref().map(Url::to_string)) };
        let u = web_url(text).filter(|_| text.len() <= MAX_WEBHOOK_URL).ok_or(WebhookRefused::Invalid)?;
        if !self.allowed_origins.contains(&u.origin()) {
            return Err(WebhookRefused::NotAllowed { origin: u.origin().ascii_serialization(), none_allowed: self.allowed_origins.is_empty() });
        }
        Ok(Some(u.to_string()))
    }

    /// The wait before attempt `made + 1`, after `made` failed ones: the base doubled per
    /// failure, capped, then shortened by up to 20 % (`jitter` in [0, 1)) so that the deliveries
    /// of runs that failed together are not retried together (spread below the cap, so that
    /// waits at the cap are spread too).
    pub fn backoff(&self, made: u32, jitter: f64) -> Duration {
        let doubled = self.backoff_base.saturating_mul(1u32 << made.saturating_sub(1).min(20));
        doubled.min(self.backoff_max).mul_f64(1.0 - 0.2 * jitter.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(vars: &[(&str, &str)]) -> Result<WebhookSettings, ConfigError> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        WebhookSettings::load(&move |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    #[test]
    fn a_url_or_an_origin_needs_a_secret_and_secrets_never_show() {
        assert_eq!(load(&[("FABRIC_WEBHOOK_URL", "https://h.example/x")]).unwrap_err().var, "FABRIC_WEBHOOK_SECRET");
        assert_eq!(load(&[("FABRIC_WEBHOOK_ALLOWED_ORIGINS", "https://h.example")]).unwrap_err().var, "FABRIC_WEBHOOK_SECRET");
        for bad in ["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_!!!", "whsec_c2hvcnQ="] {
            let e = load(&[("FABRIC_WEBHOOK_SECRET", bad)]).unwrap_err();
            assert_eq!(e.var, "FABRIC_WEBHOOK_SECRET");
            assert!(!e.to_string().contains(bad) && !e.to_string().contains("MfKQ"), "{e}");
        }
        let s = load(&[("FABRIC_WEBHOOK_SECRET", SECRET), ("FABRIC_WEBHOOK_URL", "https://u:pw@h.example/x?token=t0k")]).unwrap();
        assert_eq!(s.secret.as_ref().unwrap().as_whsec(), SECRET);
        assert!(!format!("{s:?}").contains("MfKQ"), "{s:?}");
        let e = load(&[("FABRIC_WEBHOOK_SECRET", SECRET), ("FABRIC_WEBHOOK_URL", "ftp://pw@h/x?token=t0k")]).unwrap_err();
        assert!(!e.to_string().contains("t0k"), "{e}");
    }

    #[test]
    fn a_contract_url_must_be_of_an_allowed_origin() {
        let s = load(&[("FABRIC_WEBHOOK_SECRET", SECRET), ("FABRIC_WEBHOOK_ALLOWED_ORIGINS", "https://hooks.example.com, http://127.0.0.1:9000")]).unwrap();
        assert_eq!(s.target(None), Ok(None));
        assert_eq!(s.target(Some("http://127.0.0.1:9000/h?x=1")), Ok(Some("http://127.0.0.1:9000/h?x=1".into())));
        assert_eq!(s.target(Some("https://hooks.example.com:443/a")), Ok(Some("https://hooks.example.com/a".into())));
        for refused in ["http://127.0.0.1:9001/h", "http://hooks.example.com/a", "https://evil.example/a", "https://hooks.example.com.evil.example/"] {
            assert!(matches!(s.target(Some(refused)), Err(WebhookRefused::NotAllowed { .. })), "{refused}");
        }
        assert_eq!(s.target(Some("not a url")), Err(WebhookRefused::Invalid));
        let long = format!("http://127.0.0.1:9000/{}", "a".repeat(MAX_WEBHOOK_URL));
        assert_eq!(s.target(Some(&long)), Err(WebhookRefused::Invalid));
        for bad in ["https://h.example/path", "https://u:SEKRIT@h.example", "h.example", "https://h.example?q=SEKRIT"] {
            let e = load(&[("FABRIC_WEBHOOK_SECRET", SECRET), ("FABRIC_WEBHOOK_ALLOWED_ORIGINS", bad)]).unwrap_err();
            assert_eq!(e.var, "FABRIC_WEBHOOK_ALLOWED_ORIGINS", "{bad}");
            assert!(!e.to_string().contains("SEKRIT"), "{e}");
        }
        // A wildcard would be listed and match nothing (issue 46): refused, saying so.
        for wild in ["http://*.example.com", "https://hooks.example.com, https://*"] {
            let e = load(&[("FABRIC_WEBHOOK_SECRET", SECRET), ("FABRIC_WEBHOOK_ALLOWED_ORIGINS", wild)]).unwrap_err();
            assert!(e.var == "FABRIC_WEBHOOK_ALLOWED_ORIGINS" && e.message.contains("wildcards are not supported"), "{wild}: {e}");
        }
        let fleet = load(&[("FABRIC_WEBHOOK_SECRET", SECRET), ("FABRIC_WEBHOOK_URL", "https://fleet.example/h")]).unwrap();
        assert_eq!(fleet.target(None), Ok(Some("https://fleet.example/h".into())));
        assert!(matches!(fleet.target(Some("https://fleet.example/h")), Err(WebhookRefused::NotAllowed { none_allowed: true, .. })));
    }

    #[test]
    fn the_backoff_doubles_from_the_base_spread_and_capped() {
        let s = load(&[("FABRIC_WEBHOOK_BACKOFF_MAX_S", "10")]).unwrap();
        assert_eq!((s.max_attempts, s.backoff_base), (8, Duration::from_secs(1)));
        assert_eq!(s.backoff(1, 0.0), Duration::from_secs(1));
        assert_eq!(s.backoff(2, 0.0), Duration::from_secs(2));
        assert_eq!(s.backoff(3, 0.5), Duration::from_millis(3600));
        assert_eq!(s.backoff(4, 0.0), Duration::from_secs(8));
        assert_eq!(s.backoff(5, 0.0), Duration::from_secs(10));
        assert_eq!(s.backoff(60, 0.5), Duration::from_secs(9));
        assert_eq!(s.backoff(1, 1.0), Duration::from_millis(800));
        assert_eq!(load(&[("FABRIC_WEBHOOK_BACKOFF_BASE_S", "20"), ("FABRIC_WEBHOOK_BACKOFF_MAX_S", "10")]).unwrap_err().var, "FABRIC_WEBHOOK_BACKOFF_MAX_S");
        assert_eq!(load(&[("FABRIC_WEBHOOK_MAX_ATTEMPTS", "0")]).unwrap_err().var, "FABRIC_WEBHOOK_MAX_ATTEMPTS");
    }
}
