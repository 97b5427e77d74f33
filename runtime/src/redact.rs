//! Showing URLs without their secrets.
//!
//! A URL from configuration or the catalogue may carry credentials (`user:password@`) or keys in
//! its query (`?api_key=...`). Two views exist, and nothing else ever shows a URL:
//! [`origin_and_path`] for events, failure messages and notes (what a run record may hold), and
//! [`redact_url`] for `fabric doctor` (the whole structure, every secret part replaced).

/// What stands in for a removed secret (URL-safe, so it is not percent-encoded).
pub const REDACTED: &str = "REDACTED";

/// Scheme, host, port and path; never credentials, query or fragment. Text that does not parse
/// as a URL is not echoed at all (it may be a secret that merely looks broken).
pub fn origin_and_path(url: &str) -> String {
    match web_url(url) {
        Some(mut u) => {
            u.set_query(None);
            u.set_fragment(None);
            let _ = u.set_password(None);
            let _ = u.set_username("");
            u.to_string()
        }
        None => "(not a valid URL)".into(),
    }
}

/// An http(s) URL with a host. Anything else (`user:password@host` parses as scheme `user`!) is
/// treated as text.
fn web_url(text: &str) -> Option<reqwest::Url> {
    reqwest::Url::parse(text.trim()).ok().filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
}

/// The URL with the user name, the password and every query value replaced by [`REDACTED`]
/// (query keys stay, so an operator sees which parameters are set). Text that is not an http(s)
/// URL is cut the same way: everything between `://` (or the start) and the last `@`, and
/// everything after `?`.
pub fn redact_url(url: &str) -> String {
    let url = url.trim();
    match web_url(url) {
        Some(mut u) => {
            if !u.username().is_empty() {
                let _ = u.set_username(REDACTED);
            }
            if u.password().is_some() {
                let _ = u.set_password(Some(REDACTED));
            }
            if u.query().is_some() {
                let keys: Vec<String> = u.query_pairs().map(|(k, _)| k.into_owned()).collect();
                let mut pairs = u.query_pairs_mut();
                pairs.clear();
                for k in keys {
                    pairs.append_pair(&k, REDACTED);
                }
            }
            u.set_fragment(None);
            u.to_string()
        }
        None => redact_text(url),
    }
}

/// The text-only fallback of [`redact_url`]: cuts userinfo and the query.
fn redact_text(text: &str) -> String {
    let mut out = text.to_owned();
    if let Some(q) = out.find(['?', '#']) {
        out.truncate(q);
        out.push('?');
        out.push_str(REDACTED);
    }
    // Up to the last `@` (a password may hold `/`): cutting a path by mistake is the safe side.
    let after_scheme = out.find("://").map_or(0, |i| i + 3);
    if let Some(at) = out[after_scheme..].rfind('@') {
        out.replace_range(after_scheme..after_scheme + at, REDACTED);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_and_path_drops_every_secret_part() {
        assert_eq!(origin_and_path("http://user:pw@kb.example:8080/search?api_key=k#frag"), "http://kb.example:8080/search");
        assert_eq!(origin_and_path("not a url with secret"), "(not a valid URL)");
    }

    #[test]
    fn redact_url_keeps_the_structure() {
        assert_eq!(redact_url("http://user:PASSWORD@host/v1?token=abc&x=1"), "http://REDACTED:REDACTED@host/v1?token=REDACTED&x=REDACTED");
        assert_eq!(redact_url("https://api.openai.com/v1"), "https://api.openai.com/v1");
        // Unparsable text is cut at the same places.
        assert_eq!(redact_url("ht!tp://user:pw@ho st/p?k=v"), "ht!tp://REDACTED@ho st/p?REDACTED");
        // Without a scheme, `user:PASSWORD@host` would parse as a URL of scheme `user`.
        assert_eq!(redact_url("user:PASSWORD@host:11434/v1"), "REDACTED@host:11434/v1");
        assert_eq!(redact_url("ftp://u:PASSWORD@x"), "ftp://REDACTED@x");
        assert_eq!(origin_and_path("user:PASSWORD@host"), "(not a valid URL)");
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Credentials and query values never survive either view, whatever they are.
        #[test]
        fn secrets_never_survive(user in "[a-z]{1,8}", password in "SECRET[A-Za-z0-9]{4,12}", key in "[a-z_]{1,8}", value in "SECRET[A-Za-z0-9%]{4,12}",
                                 path in "(/[a-z0-9]{0,6}){0,3}") {
            let url = format!("http://{user}:{password}@kb.example:8080{path}?{key}={value}&x=1#frag-{value}");
            for shown in [origin_and_path(&url), redact_url(&url)] {
                prop_assert!(!shown.contains("SECRET"), "{shown}");
            }
            let want = format!("{key}={REDACTED}");
            prop_assert!(redact_url(&url).contains(&want));
        }

        /// Credentials without an http(s) scheme in front are cut all the same.
        #[test]
        fn schemeless_credentials(scheme in "(|[a-z]{1,6}:|[a-z]{1,6}://)", user in "[a-z]{1,8}", password in "SECRET[A-Za-z0-9]{4,12}", host in "[a-z]{1,8}(:[0-9]{1,5})?") {
            let text = format!("{scheme}{user}:{password}@{host}/v1");
            prop_assert!(!redact_url(&text).contains("SECRET"), "{}", redact_url(&text));
            prop_assert!(!origin_and_path(&text).contains("SECRET"));
        }

        /// Any text at all: no panic, and nothing after a `?` or before an `@` is echoed.
        #[test]
        fn any_text_is_safe(text in "\\PC{0,80}", secret in "SECRET[a-z]{4}") {
            let _ = origin_and_path(&text);
            let _ = redact_url(&text);
            let with_query = format!("{text}?token={secret}");
            prop_assert!(!redact_url(&with_query).contains(&secret) || text.contains(&secret));
            prop_assert!(!origin_and_path(&with_query).contains(&secret) || text.contains(&secret));
        }
    }
}
