//! Showing URLs without their secrets.
//!
//! A URL from configuration or the catalogue may carry credentials (`user:password@`) or keys in
//! its query (`?api_key=...`). Two views exist, and nothing else ever shows a URL:
//! [`origin_and_path`] for events, failure messages and notes (what a run record may hold), and
//! [`redact_url`] for `fabric doctor` (the whole structure, every secret part replaced).
//!
//! A PostgreSQL connection string may also come in libpq's key=value form (`host=h port=5432
//! password=...`); [`redact_url`] recognises it and keeps only the values of the keys that name
//! where the database is, so that form leaks nothing either, wherever a store URL is shown.

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
        None if !url.contains("://") && url.contains('=') => redact_conninfo(url),
        None => redact_text(url),
    }
}

/// The keys of a libpq key=value string whose values are shown: where the database is and how it
/// is reached, nothing that identifies or authenticates a client. Every other value (`password`,
/// `user`, `sslpassword`, `sslkey`, `options`, a key this list does not know) is [`REDACTED`]:
/// an allowlist, so a secret under a key nobody thought of is not shown either.
const CONNINFO_SHOWN: &[&str] = &["host", "hostaddr", "port", "dbname", "sslmode", "connect_timeout", "target_session_attrs", "application_name"];

/// A libpq key=value string with every value not in [`CONNINFO_SHOWN`] replaced. Text that does
/// not parse as one (an unterminated quote, a key that is not a word, a URL without its scheme
/// such as `user:pw@host/v1?key=k`) is cut as other text is, and then after its first `=`:
/// whatever follows may be a secret.
fn redact_conninfo(text: &str) -> String {
    let Some(pairs) = parse_conninfo(text) else {
        let cut = redact_text(text);
        return match cut.find('=') {
            Some(i) => format!("{}{REDACTED}", &cut[..=i]),
            None => cut,
        };
    };
    let shown: Vec<String> = pairs
        .iter()
        .map(|(k, v)| {
            let value = if CONNINFO_SHOWN.contains(&k.to_ascii_lowercase().as_str()) { quote_conninfo(v) } else { REDACTED.to_owned() };
            format!("{k}={value}")
        })
        .collect();
    shown.join(" ")
}

/// libpq's key=value syntax: `key = value` pairs separated by whitespace; a value is a run of
/// non-blank characters or single-quoted (`\'` and `\\` escaped). `None` unless it is exactly that.
fn parse_conninfo(text: &str) -> Option<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| c.is_ascii_alphanumeric() || *c == '_') {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if key.is_empty() || chars.next() != Some('=') {
            return None;
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next()? {
                    '\'' => break,
                    '\\' => value.push(chars.next()?),
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                // A backslash escapes the next character, as libpq reads it.
                value.push(if c == '\\' { chars.next()? } else { c });
            }
        }
        pairs.push((key, value));
    }
    (!pairs.is_empty()).then_some(pairs)
}

/// A shown value, quoted back when it needs to be (blank, or with a quote or a backslash).
fn quote_conninfo(value: &str) -> String {
    if !value.is_empty() && !value.chars().any(|c| c.is_whitespace() || c == '\'' || c == '\\') {
        return value.to_owned();
    }
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// The text-only fallback of [`redact_url`]: cuts userinfo and the query.
fn redact_text(text: &str) -> String {
    // Up to the last `@` (a password may hold `/`, `?` or `#`: cutting at those first would
    // leave the part of it before them): cutting a path by mistake is the safe side.
    let after_scheme = text.find("://").map_or(0, |i| i + 3);
    let (head, rest) = text.split_at(after_scheme);
    let rest = match rest.rfind('@') {
        // A `?` or `#` before that `@`: the `@` may be in the query (`?user=a@b&password=…`),
        // and whatever follows it too: nothing more is shown.
        Some(at) if rest[..at].contains(['?', '#']) => return format!("{head}{REDACTED}"),
        Some(at) => format!("{REDACTED}{}", &rest[at..]),
        None => rest.to_owned(),
    };
    match rest.find(['?', '#']) {
        Some(q) => format!("{head}{}?{REDACTED}", &rest[..q]),
        None => format!("{head}{rest}"),
    }
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

    #[test]
    fn libpq_key_value_strings_keep_only_where_the_database_is() {
        assert_eq!(redact_url("host=127.0.0.1 port=1 password=PW8 user=u dbname=runs"), "host=127.0.0.1 port=1 password=REDACTED user=REDACTED dbname=runs");
        assert_eq!(
            redact_url("  host = db.example  password = 'a b\\' c' sslpassword=K sslkey=/k.pem sslmode=require "),
            "host=db.example password=REDACTED sslpassword=REDACTED sslkey=REDACTED sslmode=require"
        );
        // Keys are case-insensitive to libpq; an unknown key's value is not shown.
        assert_eq!(redact_url("PASSWORD=X host=h mystery=Y"), "PASSWORD=REDACTED host=h mystery=REDACTED");
        assert_eq!(redact_url("host='a b' port=5432"), "host='a b' port=5432");
        // Not quite the syntax (an unterminated quote, a key that is not a word): cut after the first `=`.
        assert_eq!(redact_url("host=h password='PW8"), "host=REDACTED");
        assert_eq!(redact_url("ho-st=h password=PW8"), "ho-st=REDACTED");
        // A URL without its scheme is still cut at its `@` and its `?`.
        assert_eq!(redact_url("user:PASSWORD@host/v1?key=K"), "REDACTED@host/v1?REDACTED");
        assert_eq!(redact_url("user:PASSWORD@host/v1;x=K"), "REDACTED@host/v1;x=REDACTED");
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

        /// A password in a libpq key=value string, quoted or not, among any other keys, is never shown.
        #[test]
        fn conninfo_passwords_never_survive(before in "( ?(host|port|dbname|user|sslmode)=[a-z0-9.]{1,8}){0,4}", key in "(password|PASSWORD|sslpassword|sslkey|user)",
                                            secret in "SECRET[A-Za-z0-9' \\\\]{0,10}", after in "( ?(host|port|dbname)=[a-z0-9.]{1,8}){0,3}") {
            let quoted = format!("'{}'", secret.replace('\\', "\\\\").replace('\'', "\\'"));
            for value in [quoted, secret.replace([' ', '\'', '\\'], "")] {
                let text = format!("{before} {key}={value}{after}");
                prop_assert!(!redact_url(&text).contains("SECRET"), "{text} -> {}", redact_url(&text));
            }
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
