//! System prompts stored once, by digest. Every run of a stage is asked with the same system
//! prompt (the route's role and the stage's instructions), so a model reply's journal entry
//! keeps only the prompt's SHA-256 (`run_journal.prompt`), and the prompt itself is a row of
//! `run_prompts`, written by the first run that used it. Reading a journal joins it back: the
//! entries the executor, replay and `GET /v1/runs/{id}/record` see hold the whole prompt.
//!
//! A prompt row is content-addressed and never changes, so writers insert it with `ON CONFLICT
//! DO NOTHING` and may skip one they know is committed ([`Known`]). Whatever removes runs
//! (retention) must keep every prompt a remaining journal row names, and forget [`Known`].

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::StoreError;
use crate::exec::JournalEntry;

/// A journal entry as its row holds it: the JSON, and the digest of the prompt it left out.
pub(crate) struct StoredEntry {
    pub json: String,
    pub prompt: Option<Arc<Prompt>>,
}

/// A prompt's row: its digest (hex SHA-256 of the text) and its body, the text as a JSON string
/// (PostgreSQL's text cannot hold NUL; a JSON string escapes it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Prompt {
    pub digest: String,
    pub body: String,
}

/// A model reply's row: every field but the system prompt.
#[derive(Serialize)]
#[serde(tag = "entry", rename = "model_reply")]
struct ReplyRow<'a> {
    stage_id: &'a str,
    turn: u32,
    user: &'a str,
    raw: &'a str,
    value: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<&'a str>,
}

/// [`ReplyRow`] read back (the `entry` tag is ignored: the row says it is a reply by naming a prompt).
#[derive(Deserialize)]
struct ReplyRead {
    stage_id: String,
    turn: u32,
    user: String,
    raw: String,
    value: String,
    #[serde(default)]
    model: Option<String>,
}

/// The hex SHA-256 of `text`.
fn digest(text: &str) -> String {
    use std::fmt::Write;
    Sha256::digest(text.as_bytes()).iter().fold(String::with_capacity(64), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    })
}

/// The prompts made so far, by their text: a run's model replies repeat a few prompts, and a
/// SHA-256 of each per reply was a third of what preparing a run's rows cost (callgrind, A2:
/// +39,000 instructions per run before this cache, docs/performance.md).
static PROMPTS: LazyLock<Mutex<HashMap<String, Arc<Prompt>>>> = LazyLock::new(Default::default);

/// `system` as its row.
fn prompt_of(system: &str) -> Arc<Prompt> {
    let mut prompts = PROMPTS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = prompts.get(system) {
        return p.clone();
    }
    if prompts.len() >= KNOWN_MAX {
        prompts.clear();
    }
    let prompt = Arc::new(Prompt { digest: digest(system), body: serde_json::to_string(system).unwrap_or_default() });
    prompts.insert(system.to_owned(), prompt.clone());
    prompt
}

/// `entry` as its row: a model reply without its system prompt, which becomes a [`Prompt`].
pub(crate) fn split(entry: &JournalEntry) -> StoredEntry {
    match entry {
        JournalEntry::ModelReply { stage_id, turn, system, user, raw, value, model } => {
            let row = ReplyRow { stage_id, turn: *turn, user, raw, value, model: model.as_deref() };
            StoredEntry { json: serde_json::to_string(&row).unwrap_or_default(), prompt: Some(prompt_of(system)) }
        }
        other => StoredEntry { json: serde_json::to_string(other).unwrap_or_default(), prompt: None },
    }
}

/// A journal row read back: `json` as written, with the prompt it names (`digest`) joined back
/// in from `body` (the `run_prompts` row). Rows written before prompts were split out name
/// none and hold the whole entry.
pub(crate) fn join(run_id: &str, json: &str, digest: Option<&str>, body: Option<&str>) -> Result<JournalEntry, StoreError> {
    let unreadable = |e: serde_json::Error| StoreError::Database(format!("a journal entry of run {run_id} does not read: {e}"));
    let Some(digest) = digest else { return serde_json::from_str(json).map_err(unreadable) };
    let body = body.ok_or_else(|| StoreError::Database(format!("a journal entry of run {run_id} names the prompt {digest}, which the store does not have")))?;
    let system: String = serde_json::from_str(body).map_err(unreadable)?;
    let ReplyRead { stage_id, turn, user, raw, value, model } = serde_json::from_str(json).map_err(unreadable)?;
    Ok(JournalEntry::ModelReply { stage_id, turn, system, user, raw, value, model })
}

/// The digests of prompts a writer knows are committed (it committed them, or found them), so
/// that it does not write them again with every run. Bounded: forgetting costs one insert that
/// finds its row there.
#[derive(Debug, Default)]
pub(crate) struct Known(Mutex<HashSet<String>>);

/// Digests kept at the most; a catalogue has far fewer distinct system prompts.
const KNOWN_MAX: usize = 4096;

impl Known {
    /// Whether `digest` is known to be committed.
    pub fn has(&self, digest: &str) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).contains(digest)
    }

    /// Notes `digests` as committed (called after their transaction committed, never before).
    pub fn add<'a>(&self, digests: impl IntoIterator<Item = &'a str>) {
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for d in digests {
            if known.len() >= KNOWN_MAX {
                known.clear();
            }
            known.insert(d.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(system: &str) -> JournalEntry {
        JournalEntry::ModelReply {
            stage_id: "s".into(),
            turn: 2,
            system: system.into(),
            user: "u".into(),
            raw: "{\"a\":1}".into(),
            value: "{\"a\":1}".into(),
            model: None,
        }
    }

    #[test]
    fn a_reply_splits_and_joins_back_whole() {
        let entry = reply("You are\u{0} a \"clerk\".\n");
        let stored = split(&entry);
        let prompt = stored.prompt.expect("a reply names its prompt");
        assert!(!stored.json.contains("clerk"), "the row leaves the prompt out: {}", stored.json);
        assert_eq!(prompt.digest, digest("You are\u{0} a \"clerk\".\n"));
        assert!(!prompt.body.contains('\0'), "the body holds no NUL");
        assert_eq!(join("r", &stored.json, Some(&prompt.digest), Some(&prompt.body)).unwrap(), entry);
    }

    #[test]
    fn equal_prompts_have_one_digest_and_other_entries_none() {
        assert_eq!(split(&reply("p")).prompt, split(&reply("p")).prompt);
        assert_ne!(split(&reply("p")).prompt, split(&reply("q")).prompt);
        let note = JournalEntry::Note { note: "n".into() };
        let stored = split(&note);
        assert!(stored.prompt.is_none());
        assert_eq!(join("r", &stored.json, None, None).unwrap(), note);
    }

    #[test]
    fn a_row_written_before_prompts_were_split_still_reads() {
        let entry = reply("old");
        let json = serde_json::to_string(&entry).unwrap();
        assert_eq!(join("r", &json, None, None).unwrap(), entry);
    }

    #[test]
    fn a_missing_prompt_is_an_error_naming_the_run_and_digest() {
        let stored = split(&reply("p"));
        let d = stored.prompt.unwrap().digest.clone();
        let e = join("run-9", &stored.json, Some(&d), None).unwrap_err().to_string();
        assert!(e.contains("run-9") && e.contains(&d), "{e}");
    }

    #[test]
    fn known_forgets_when_full() {
        let known = Known::default();
        known.add(["a"]);
        assert!(known.has("a") && !known.has("b"));
        let many: Vec<String> = (0..KNOWN_MAX).map(|k| k.to_string()).collect();
        known.add(many.iter().map(String::as_str));
        assert!(known.0.lock().unwrap().len() <= KNOWN_MAX);
    }
}
