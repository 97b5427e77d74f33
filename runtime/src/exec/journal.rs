//! A run's record as the executor writes and reads it: [`JournalEntry`] (one durable fact),
//! [`JournalBatch`] (what one commit writes), the [`RunJournal`] port the store implements, and
//! [`RunHistory`] (what a journal holds when a run is taken up again).

use serde::{Deserialize, Serialize};

use super::RunResult;
use crate::events::Event;
use crate::failure::BoxFuture;

/// One durable fact of a run, in the order it happened. A run's journal is the list of them;
/// with the start contract it is enough to rebuild the run's state (notes, slots, turns).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "entry", rename_all = "snake_case")]
pub enum JournalEntry {
    /// A model call: what it was asked (system text, user message), its reply as received, and
    /// the value the stage took from it (what a recovered or replayed run uses instead of asking).
    /// `model`: the model of a fallback chain that answered (`provider:model`); none outside a
    /// chain. What answered is recorded, so a resumed or replayed run never asks the chain again.
    ModelReply {
        stage_id: String,
        turn: u32,
        system: String,
        user: String,
        raw: String,
        value: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
    },
    /// A stage that completed: its slot value and the note it added, if any.
    StageCompleted { stage_id: String, value: String, note: Option<String> },
    /// A note added without a completed stage (a failed tool call in the decision loop).
    Note { note: String },
    /// The user's reply to a run that asked, and the note the next decision sees.
    UserReply { message: String, note: String },
    /// An A2A agent called as a tool asked a question, which the run asks its user: recorded
    /// with the ask, so the reply goes to that task (on any replica, after a crash), never a new one.
    ToolAsked(ToolAsk),
}

/// An agent's task that asked ([`JournalEntry::ToolAsked`]): the tool stage, the call's message
/// id (its replies' ids derive from it), which question of the task this is (1 for the first),
/// the task and its context as the agent named them, and the question.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolAsk {
    pub stage_id: String,
    pub call: String,
    pub asked: u32,
    pub task_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    pub question: String,
}

/// What one commit writes: the events since the last one, the journal entries, and at the
/// run's end (or when it asks) its result.
#[derive(Debug, Clone, Default)]
pub struct JournalBatch {
    pub events: Vec<Event>,
    pub entries: Vec<JournalEntry>,
    pub end: Option<RunResult>,
}

/// Why a journal did not take a batch. The executor only needs to know whether its lease is
/// gone (another process runs the run now) or the write failed otherwise; the message is the
/// store's own, shown as it was. Defined here, not as the store's `StoreError`, because `exec`
/// sits below `store` (the store implements this port): the port names what the executor can
/// branch on, and `store` converts its error into it (`From<StoreError>`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    /// The run's lease was taken over: this process must write nothing more and stop the run.
    #[error("{0}")]
    LeaseLost(String),
    /// The write failed (the database refused it, cannot be reached, or an earlier batch of the
    /// run failed): the run stops, and whoever holds it next goes on from its journal.
    #[error("{0}")]
    Failed(String),
}

/// Where a journalled run's record goes as it runs: one batch per completed stage (its events and
/// entries together), and one at the end.
///
/// Contract: batches of a run are written in the order given. `append` queues a batch and
/// returns once it is queued (it waits only while the writer's queue is full), so a stage does
/// not wait for the disk; an error says an earlier write of the run failed (or its lease is
/// lost: [`JournalError::LeaseLost`]), and the run stops there (`store_error`). `commit` queues the last batch and returns
/// once every batch of the run is durable: a run is reported ended only when its record is.
pub trait RunJournal: Send + Sync {
    fn append<'a>(&'a self, run_id: &'a str, batch: JournalBatch) -> BoxFuture<'a, Result<(), JournalError>>;
    fn commit<'a>(&'a self, run_id: &'a str, batch: JournalBatch) -> BoxFuture<'a, Result<(), JournalError>>;

    /// [`RunJournal::append`], and `durable` (if any) called once the batch is durable (never
    /// when its write fails): what a watcher may be shown of a run is what a takeover cannot
    /// replace. By default once queued (a journal whose queue is its record).
    fn append_then<'a>(&'a self, run_id: &'a str, batch: JournalBatch, durable: Option<Durable>) -> BoxFuture<'a, Result<(), JournalError>> {
        Box::pin(async move {
            self.append(run_id, batch).await?;
            if let Some(d) = durable {
                d();
            }
            Ok(())
        })
    }
}

/// What to do once a batch is durable ([`RunJournal::append_then`]).
pub type Durable = Box<dyn FnOnce() + Send>;

/// What a run's record holds when the run is taken up again: recovered after its process died
/// ([`Runner::recover`](super::Runner::recover)), continued after the user replied
/// ([`Runner::resume`](super::Runner::resume)), or given up ([`Runner::abandon`](super::Runner::abandon)).
#[derive(Debug, Clone)]
pub struct RunHistory {
    pub run_id: String,
    /// The journal so far, in order.
    pub entries: Vec<JournalEntry>,
    /// The `seq` the next event gets (one past the last recorded).
    pub next_seq: u64,
    /// The model call a process was streaming when it stopped (its start and some of its text
    /// recorded, its reply not): the call made again goes on from its recorded events.
    pub open: Option<OpenCall>,
}

/// A model call whose start and text its last holder recorded as it streamed, and not its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenCall {
    pub stage_id: String,
    pub turn: u32,
    /// The attempt of its last recorded text (or of its last `run.llm.restarted`).
    pub attempt: u32,
    /// Whether text of that attempt was recorded (then `run.llm.restarted` takes it back).
    pub shown: bool,
}

/// The call a run's recorded events stream without its end: deltas (or a `run.llm.restarted`)
/// of a model call, and after them no `run.llm.completed`, `run.llm.failed` or end of its stage.
/// `events` are a run's recorded events in order, as (type, JSON).
pub fn open_call<'a>(events: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<OpenCall> {
    #[derive(Deserialize)]
    struct Call {
        stage_id: Option<String>,
        turn: Option<u32>,
        attempt: Option<u32>,
    }
    let mut open: Option<OpenCall> = None;
    for (kind, body) in events {
        let streams = matches!(kind, "run.llm.delta" | "run.llm.restarted");
        let ends = matches!(kind, "run.llm.completed" | "run.llm.failed" | "run.stage.completed" | "run.stage.failed");
        if !streams && !ends {
            continue;
        }
        let Ok(Call { stage_id: Some(stage_id), turn, attempt }) = serde_json::from_str(body) else { continue };
        if streams {
            let (turn, attempt) = (turn.unwrap_or(0), attempt.unwrap_or(1));
            open = Some(OpenCall { stage_id, turn, attempt, shown: kind == "run.llm.delta" });
        } else if open.as_ref().is_some_and(|o| o.stage_id == stage_id) {
            open = None;
        }
    }
    open
}

/// A journal entry in a divergence message.
pub(super) fn describe(entry: &JournalEntry) -> String {
    match entry {
        JournalEntry::ModelReply { stage_id, turn, .. } => format!("a model reply of stage `{stage_id}` turn {turn}"),
        JournalEntry::StageCompleted { stage_id, .. } => format!("the completion of stage `{stage_id}`"),
        JournalEntry::Note { .. } => "a tool error".into(),
        JournalEntry::UserReply { .. } => "a reply of the user".into(),
        JournalEntry::ToolAsked(ask) => format!("a question of the agent of stage `{}`", ask.stage_id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_call_is_the_last_streamed_one_without_its_end() {
        let e = |kind: &'static str, body: &'static str| (kind, body);
        let delta = r#"{"stage_id":"answer","turn":0,"attempt":1,"index":0,"text":"Hel"}"#;
        let started = e("run.stage.started", r#"{"stage_id":"answer"}"#);
        assert_eq!(open_call([started, e("run.llm.delta", delta)]), Some(OpenCall { stage_id: "answer".into(), turn: 0, attempt: 1, shown: true }));
        let restarted = e("run.llm.restarted", r#"{"stage_id":"answer","turn":0,"attempt":2}"#);
        assert_eq!(open_call([e("run.llm.delta", delta), restarted]), Some(OpenCall { stage_id: "answer".into(), turn: 0, attempt: 2, shown: false }));
        for end in ["run.llm.completed", "run.llm.failed", "run.stage.failed"] {
            assert_eq!(open_call([e("run.llm.delta", delta), e(end, r#"{"stage_id":"answer"}"#)]), None, "{end}");
        }
        // Another stage's end, or an event that does not read, leaves it open.
        let other = e("run.stage.completed", r#"{"stage_id":"intake"}"#);
        assert!(open_call([e("run.llm.delta", delta), other, e("run.llm.completed", "not json")]).is_some());
        assert_eq!(open_call([started]), None, "nothing streamed: the start was not recorded apart from its end");
    }
}
