//! The identifiers a client gives the store, parsed once at the front ends: a run's id
//! ([`RunId`]) and a start's idempotency key ([`IdempotencyKey`]).

/// A start's idempotency key as a client sends it (`Idempotency-Key`): 1 to 255 visible ASCII
/// characters (`!` to `~`), so it is safe as a header, in a log and in any database.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a text is no idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadKey {
    #[error("an idempotency key has 1 to 255 characters; this one has {0}")]
    Length(usize),
    /// The 1-based position of the first character that is not `!` to `~`.
    #[error("an idempotency key is visible ASCII (`!` to `~`); character {0} is not")]
    NotVisible(usize),
}

impl IdempotencyKey {
    pub fn parse(s: &str) -> Result<IdempotencyKey, BadKey> {
        if s.is_empty() || s.len() > 255 {
            return Err(BadKey::Length(s.chars().count()));
        }
        match s.char_indices().find(|(_, c)| !c.is_ascii_graphic()) {
            Some((at, _)) => Err(BadKey::NotVisible(s[..at].chars().count() + 1)),
            None => Ok(IdempotencyKey(s.to_owned())),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An identifier that can be a run id: a UUID in the canonical lowercase hyphenated form that
/// `exec::new_run_id` makes. The front ends (the service, the CLI) parse what a client gives them
/// into one, so an identifier that can name no run is answered "no run" before any query (text
/// such as a NUL never reaches a database). The store itself takes any text: its tests make runs
/// with ids like `a`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunId(String);

impl RunId {
    /// `None` unless `s` is exactly `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` in lowercase hex.
    pub fn parse(s: &str) -> Option<RunId> {
        let canonical = s.len() == uuid::fmt::Hyphenated::LENGTH
            && s.bytes().enumerate().all(|(i, b)| if matches!(i, 8 | 13 | 18 | 23) { b == b'-' } else { matches!(b, b'0'..=b'9' | b'a'..=b'f') });
        canonical.then(|| RunId(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::{BadKey, IdempotencyKey, RunId};

    #[test]
    fn idempotency_keys_are_1_to_255_visible_ascii_characters() {
        for good in ["a", "order-42/retry:1", "~!", &"k".repeat(255)] {
            assert_eq!(IdempotencyKey::parse(good).unwrap().as_str(), good);
        }
        for bad in ["", " ", "a b", "tab\t", "caf\u{e9}", "nul\0", &"k".repeat(256)] {
            assert!(IdempotencyKey::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(IdempotencyKey::parse("ab c"), Err(BadKey::NotVisible(3)));
        assert!(IdempotencyKey::parse("ab c").unwrap_err().to_string().contains("character 3"));
    }

    #[test]
    fn only_canonical_lowercase_uuids_are_run_ids() {
        let made = crate::exec::new_run_id();
        assert_eq!(RunId::parse(&made).map(|id| id.to_string()), Some(made.clone()));
        for not in
            ["", "nope", "a", "\0", &made.to_uppercase(), &made.replace('-', ""), &format!("{{{made}}}"), &format!("urn:uuid:{made}"), &format!("{made} ")]
        {
            assert_eq!(RunId::parse(not), None, "{not:?}");
        }
        // Multi-byte text of the right length in bytes is no run id either.
        assert_eq!(RunId::parse(&"é".repeat(18)), None);
    }
}
