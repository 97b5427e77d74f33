//! Where a stage's reply or tool result comes from: the [`ReplySource`] of a run.
//!
//! The walk and the stage handlers ask the source first and call the model or the tool only
//! when it says so; they never ask which mode the run is in. A live run's source has no journal
//! (every answer is asked for); a recovered or continued run's source answers from the journal
//! while the run follows it (events muted) and goes on live once it is used up or the path
//! leaves it; a replay's source answers from the journal only, and everything the journal does
//! not have is a divergence (`replay_diverged`), noted and never asked for.

use std::collections::VecDeque;

use super::journal::{JournalEntry, ToolAsk, describe};
use super::state::StageFailure;
use crate::events::RunEvents;
use crate::failure::ReasonClass;

/// Which answers a source may give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Mode {
    /// Every reply and result is asked for (the journal is empty).
    #[default]
    Live,
    /// The journal's entries first, in order, then live (recovery, continuation).
    JournalThenLive,
    /// The journal's entries only: a missing one is a divergence (replay).
    JournalOnly,
}

/// What a run's journal says happened and is not caught up with yet, and how a missing entry is
/// treated. Built once per run ([`ReplySource::live`], [`ReplySource::recovering`],
/// [`ReplySource::replaying`]).
#[derive(Debug, Default)]
pub(super) struct ReplySource {
    mode: Mode,
    entries: VecDeque<JournalEntry>,
    /// A replay's divergences from the journal, in the order they were found.
    divergences: Vec<String>,
}

impl ReplySource {
    /// A live run: the model port and the tool port answer everything.
    pub(super) fn live() -> ReplySource {
        ReplySource::default()
    }

    /// A run taken up again from its journal (after a crash, or after the user replied): the
    /// journal answers while it lasts, with `events` muted (they were written before), then the
    /// run goes on live.
    pub(super) fn recovering(history: Vec<JournalEntry>, events: &RunEvents) -> ReplySource {
        if history.is_empty() {
            return ReplySource::live();
        }
        events.set_muted(true);
        ReplySource { mode: Mode::JournalThenLive, entries: history.into(), divergences: Vec::new() }
    }

    /// A replay (`fabric replay`): the journal answers everything, and every difference from it
    /// is noted.
    pub(super) fn replaying(history: Vec<JournalEntry>) -> ReplySource {
        ReplySource { mode: Mode::JournalOnly, entries: history.into(), divergences: Vec::new() }
    }

    /// The recorded reply of model call `turn` of `stage_id` (its value, as the stage took it),
    /// when the journal's next entry is that call; `None`: ask the model. A replay notes a
    /// prompt or user message that differs, and fails a call the journal does not have.
    #[inline]
    pub(super) fn model_reply(&mut self, stage_id: &str, turn: u32, system: &str, user: &str, events: &RunEvents) -> Result<Option<String>, StageFailure> {
        // A live run asks at once (every stage of every run passes here).
        if self.mode == Mode::Live { Ok(None) } else { self.recorded_model_reply(stage_id, turn, system, user, events) }
    }

    #[inline(never)]
    fn recorded_model_reply(&mut self, stage_id: &str, turn: u32, system: &str, user: &str, events: &RunEvents) -> Result<Option<String>, StageFailure> {
        match self.entries.front() {
            Some(JournalEntry::ModelReply { stage_id: recorded, turn: t, system: asked_system, user: asked, value, .. })
                if recorded == stage_id && *t == turn =>
            {
                let value = value.clone();
                if self.mode == Mode::JournalOnly {
                    if asked_system != system {
                        let what = format!("stage `{stage_id}` turn {turn}: the prompt differs:\n  recorded: {asked_system}\n  now:      {system}");
                        self.divergences.push(what);
                    }
                    if asked != user {
                        let what = format!("stage `{stage_id}` turn {turn}: the user message differs:\n  recorded: {asked}\n  now:      {user}");
                        self.divergences.push(what);
                    }
                }
                self.advance(events);
                Ok(Some(value))
            }
            other if self.mode == Mode::JournalOnly => {
                let found = other.map_or("nothing more".to_owned(), describe);
                Err(self.diverge(format!("stage `{stage_id}` turn {turn} calls the model where the journal has {found}")))
            }
            _ => {
                self.leave(events);
                Ok(None)
            }
        }
    }

    /// The recorded result of `stage_id` (a tool call, a child run), when the journal's next
    /// entry is its completion; `None`: call it. A replay fails a call the journal has no result
    /// of; `call` says what the stage does, for that message (`stage `x` calls its tool`).
    #[inline]
    pub(super) fn tool_result(&mut self, stage_id: &str, call: impl FnOnce() -> String) -> Result<Option<String>, StageFailure> {
        match self.stage_result(stage_id) {
            Some(value) => Ok(Some(value)),
            None if self.mode == Mode::JournalOnly => Err(self.diverge(format!("{} where the journal has no result", call()))),
            None => Ok(None),
        }
    }

    /// The recorded value of `stage_id` when the journal's next entry is its completion (a stage
    /// that computes its value takes it too: a replay compares it at the stage's end).
    #[inline]
    pub(super) fn stage_result(&self, stage_id: &str) -> Option<String> {
        match self.entries.front() {
            Some(JournalEntry::StageCompleted { stage_id: recorded, value, .. }) if recorded == stage_id => Some(value.clone()),
            _ => None,
        }
    }

    /// Whether `stage_id`'s completion with `value` is the journal's next entry (then the caller
    /// calls [`ReplySource::advance`] after the stage's muted event: it was written before); if
    /// not, it is new and goes into the run's record. A replay notes a value or a path that
    /// differs; a recovery whose journal the path leaves goes on live from here.
    #[inline]
    pub(super) fn completion_recorded(&mut self, stage_id: &str, value: &str, events: &RunEvents) -> bool {
        !self.entries.is_empty() && self.recorded_completion(stage_id, value, events)
    }

    #[inline(never)]
    fn recorded_completion(&mut self, stage_id: &str, value: &str, events: &RunEvents) -> bool {
        match self.entries.front() {
            Some(JournalEntry::StageCompleted { stage_id: recorded, value: was, .. }) if recorded == stage_id => {
                if was != value && self.mode == Mode::JournalOnly {
                    let what = format!("stage `{stage_id}`: the result differs: recorded {was}, now {value}");
                    self.divergences.push(what);
                }
                true
            }
            Some(other) if self.mode == Mode::JournalOnly => {
                let what = format!("stage `{stage_id}` completed where the journal has {}", describe(other));
                self.divergences.push(what);
                false
            }
            _ => {
                self.leave(events);
                false
            }
        }
    }

    /// The note of a recorded tool error of the decision loop, when it is the journal's next
    /// entry (the caller calls [`ReplySource::advance`] after the tool stage's muted event).
    pub(super) fn tool_error_note(&self) -> Option<String> {
        match self.entries.front() {
            Some(JournalEntry::Note { note }) => Some(note.clone()),
            _ => None,
        }
    }

    /// The note of the user's recorded reply to a question, when it is the journal's next entry
    /// (taken: the run goes on from it instead of asking again).
    pub(super) fn user_reply(&mut self, events: &RunEvents) -> Option<String> {
        let note = match self.entries.front() {
            Some(JournalEntry::UserReply { note, .. }) => note.clone(),
            _ => return None,
        };
        self.advance(events);
        Some(note)
    }

    /// The agent's question recorded for `stage_id`, when it is the journal's next entry (taken).
    pub(super) fn tool_ask(&mut self, stage_id: &str, events: &RunEvents) -> Option<ToolAsk> {
        let ask = match self.entries.front() {
            Some(JournalEntry::ToolAsked(ask)) if ask.stage_id == stage_id => ask.clone(),
            _ => return None,
        };
        self.advance(events);
        Some(ask)
    }

    /// The user's recorded reply (its message and note), when it is the journal's next entry (taken).
    pub(super) fn user_reply_message(&mut self, events: &RunEvents) -> Option<(String, String)> {
        let reply = match self.entries.front() {
            Some(JournalEntry::UserReply { message, note }) => (message.clone(), note.clone()),
            _ => return None,
        };
        self.advance(events);
        Some(reply)
    }

    /// Takes the journal's next entry; once a recovery's journal is used up, the run goes on
    /// live (its events are no longer muted).
    pub(super) fn advance(&mut self, events: &RunEvents) {
        self.entries.pop_front();
        if self.entries.is_empty() && self.mode == Mode::JournalThenLive {
            self.mode = Mode::Live;
            events.set_muted(false);
        }
    }

    /// A recovery whose journal does not fit the path taken goes on live from here.
    fn leave(&mut self, events: &RunEvents) {
        if self.mode == Mode::JournalThenLive {
            self.mode = Mode::Live;
            self.entries.clear();
            events.set_muted(false);
        }
    }

    /// Notes a replay's divergence and fails the call it stops.
    fn diverge(&mut self, what: String) -> StageFailure {
        let failure = StageFailure::new(ReasonClass::ReplayDiverged, format!("replay: {what}"));
        self.divergences.push(what);
        failure
    }

    /// A replay's divergences, with what the journal still holds when the run ended before it
    /// (none for a live or recovered run).
    pub(super) fn finish(self) -> Vec<String> {
        let mut divergences = self.divergences;
        if self.mode == Mode::JournalOnly && !self.entries.is_empty() {
            let rest: Vec<String> = self.entries.iter().map(describe).collect();
            divergences.push(format!("the run ended before the journal did; it still has {}", rest.join(", ")));
        }
        divergences
    }
}
