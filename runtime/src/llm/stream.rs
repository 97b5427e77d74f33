//! Streaming a model's reply as it is written: a backend that streams hands each piece of text to
//! the call's [`Deltas`], which batches them into `run.llm.delta` events (the first piece at once,
//! then at most one every [`DELTA_EVERY`], or sooner for [`DELTA_BYTES`] of text, so a fast model
//! does not cost an event per token and a watcher waits for no batch to see the first word). What a stream changes is only what a watcher sees while the call
//! runs: the reply is read, validated, journalled, retried and replayed whole, as without it.
//!
//! A new attempt of the same call (a retry after a transient error) starts its text again: when
//! the failed attempt had shown any, `run.llm.restarted` says to drop it first.
//!
//! A decision shows only the text a user reads in it ([`DecisionText`]): its question or answer.
//!
//! The other end: [`TextFollower`] reads a run's events back into the text a watcher shows, call
//! by call (what `fabric run --stream` prints).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::decision_text::DecisionText;
use crate::events::{Event, EventData, RunEvents};

/// The shortest time between two deltas (a piece that comes sooner waits, with the others after
/// it, until this has passed since the last delta; the streaming backends flush what waits then
/// even when no piece follows, through [`Deltas::due_in`] and [`Deltas::flush_due`]).
pub const DELTA_EVERY: Duration = Duration::from_millis(50);

/// The most text one delta carries before it is sent, whatever the time.
pub const DELTA_BYTES: usize = 2048;

/// The deltas of one model call (all of its attempts).
#[derive(Debug)]
pub struct Deltas<'a> {
    events: &'a RunEvents,
    stage_id: &'a str,
    turn: u32,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The attempt the text is of (1 for the first).
    attempt: u32,
    /// The next delta's number within the attempt (from 0).
    index: u32,
    /// Text not sent yet, and when the last delta was sent.
    pending: String,
    last_sent: Option<Instant>,
    /// Whether the attempt's backend handed on any of its reply (shown or not).
    received: bool,
    /// Whether any attempt sent a delta.
    ever: bool,
    /// For a decision, what of the reply is shown (a fresh one per attempt).
    decision: Option<DecisionText>,
}

impl<'a> Deltas<'a> {
    pub fn new(events: &'a RunEvents, stage_id: &'a str, turn: u32) -> Deltas<'a> {
        Deltas { events, stage_id, turn, state: Mutex::new(State { attempt: 1, ..State::default() }) }
    }

    /// The deltas of a decision: only its question or answer is shown.
    pub fn for_decision(self) -> Deltas<'a> {
        self.state().decision = Some(DecisionText::default());
        self
    }

    /// The deltas of a call a process that did not finish it (it died, or lost the run) was
    /// streaming: this call's text is `attempt`'s (the run's events said `run.llm.restarted`
    /// when the earlier attempt's text was shown).
    pub fn continuing(&self, attempt: u32) {
        self.state().attempt = attempt;
    }

    /// Whether any attempt of the call sent text.
    pub fn shown(&self) -> bool {
        self.state().ever
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A piece of the reply's text, as it came; sent with the pieces before it once
    /// [`DELTA_EVERY`] passed since the first of them or they reach [`DELTA_BYTES`].
    pub fn push(&self, text: &str) {
        if text.is_empty() {
            return;
        }
        let mut s = self.state();
        s.received = true;
        let State { pending, decision, .. } = &mut *s;
        match decision {
            Some(d) => d.feed(text, pending),
            None => pending.push_str(text),
        }
        if s.pending.is_empty() {
            return;
        }
        if s.pending.len() >= DELTA_BYTES || s.last_sent.is_none_or(|t| t.elapsed() >= DELTA_EVERY) {
            self.send(&mut s);
        }
    }

    /// How long the text that waits has left before it is due (`None`: none waits).
    pub fn due_in(&self) -> Option<Duration> {
        let s = self.state();
        if s.pending.is_empty() {
            return None;
        }
        Some(s.last_sent.map_or(Duration::ZERO, |t| DELTA_EVERY.saturating_sub(t.elapsed())))
    }

    /// Sends the text that waits once it is due (a backend whose model paused).
    pub fn flush_due(&self) {
        let mut s = self.state();
        if s.last_sent.is_none_or(|t| t.elapsed() >= DELTA_EVERY) {
            self.send(&mut s);
        }
    }

    /// Sends what waits (the end of an attempt's text).
    pub fn flush(&self) {
        let mut s = self.state();
        self.send(&mut s);
    }

    /// Whether the current attempt's backend handed on any of its reply (a backend that does
    /// not stream hands on none, and its reply is shown whole at the end).
    pub fn sent(&self) -> bool {
        self.state().received
    }

    /// A new attempt of the call begins: what the last one did not send is dropped, and when it
    /// sent anything, `run.llm.restarted` tells the watchers to drop that text.
    pub fn restart(&self) {
        let mut s = self.state();
        let shown = s.index > 0;
        s.pending.clear();
        s.last_sent = None;
        s.index = 0;
        s.received = false;
        s.attempt += 1;
        if s.decision.is_some() {
            s.decision = Some(DecisionText::default());
        }
        if shown {
            let attempt = s.attempt;
            self.events.emit(Some(self.stage_id), || EventData::LlmRestarted { turn: self.turn, attempt });
        }
    }

    fn send(&self, s: &mut State) {
        if s.pending.is_empty() {
            return;
        }
        let text = std::mem::take(&mut s.pending);
        let (attempt, index) = (s.attempt, s.index);
        s.index += 1;
        s.ever = true;
        s.last_sent = Some(Instant::now());
        self.events.emit(Some(self.stage_id), || EventData::LlmDelta { turn: self.turn, attempt, index, text });
    }
}

/// What a run's events change in the streamed text a watcher shows ([`TextFollower::follow`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shown<'e> {
    /// A call's text begins (its first delta), or goes on after another call's text came in
    /// between (`again`). `parent_run_id` is set for a child run's stage.
    Begins { stage_id: &'e str, turn: u32, again: bool, parent_run_id: Option<&'e str> },
    /// More text of the call that began last.
    Text(&'e str),
    /// The text shown of the call is dropped: attempt `attempt` writes it again from its start.
    Restarted { stage_id: &'e str, turn: u32, attempt: u32 },
    /// The call's text is complete (its call ended, or the run did).
    Ends,
}

/// One model call of one run: (run, stage, turn).
type CallKey = (String, String, u32);

/// Follows a run's events (a child run's too) and says what changes in its streamed text: which
/// call's text is being written, its pieces in order, a restart, its end. Events other than
/// `run.llm.*` and a run's end change nothing.
#[derive(Debug, Default)]
pub struct TextFollower {
    /// The call whose text was written last, while it is open.
    open: Option<CallKey>,
    /// Every call that showed text, to tell a call that goes on from a new one.
    seen: std::collections::HashSet<CallKey>,
}

impl TextFollower {
    /// What `e` changes, in order (empty for most events).
    pub fn follow<'e>(&mut self, e: &'e Event) -> Vec<Shown<'e>> {
        let stage_id = e.stage_id.as_deref().unwrap_or_default();
        let key = |turn: u32| (e.run_id.to_string(), stage_id.to_owned(), turn);
        let open_here = |open: &Option<CallKey>| open.as_ref().is_some_and(|(run, stage, _)| **run == *e.run_id && stage == stage_id);
        let mut out = Vec::new();
        match &e.data {
            EventData::LlmDelta { turn, text, .. } => {
                let call = key(*turn);
                if self.open.as_ref() != Some(&call) {
                    if self.open.take().is_some() {
                        out.push(Shown::Ends);
                    }
                    let again = !self.seen.insert(call.clone());
                    out.push(Shown::Begins { stage_id, turn: *turn, again, parent_run_id: e.parent_run_id.as_deref() });
                    self.open = Some(call);
                }
                out.push(Shown::Text(text));
            }
            EventData::LlmRestarted { turn, attempt } if self.seen.contains(&key(*turn)) => {
                let call = key(*turn);
                if self.open.as_ref() != Some(&call) {
                    if self.open.take().is_some() {
                        out.push(Shown::Ends);
                    }
                    self.open = Some(call);
                }
                out.push(Shown::Restarted { stage_id, turn: *turn, attempt: *attempt });
            }
            EventData::LlmCompleted { .. } | EventData::LlmFailed { .. } if open_here(&self.open) => {
                self.open = None;
                out.push(Shown::Ends);
            }
            _ if e.kind.ends_run() && self.open.as_ref().is_some_and(|(run, ..)| **run == *e.run_id) => {
                self.open = None;
                out.push(Shown::Ends);
            }
            _ => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventKind, MemorySink};
    use std::sync::Arc;

    fn events() -> (RunEvents, Arc<MemorySink>) {
        let sink = Arc::new(MemorySink::default());
        (RunEvents::new("r", "route", None, sink.clone()), sink)
    }

    #[test]
    fn pieces_are_batched_by_size_and_sent_in_order_at_the_end() {
        let (ev, sink) = events();
        let d = Deltas::new(&ev, "s", 0);
        for _ in 0..(DELTA_BYTES / 8 + 1) {
            d.push("abcdefgh");
        }
        d.push("tail");
        d.flush();
        let got = sink.events();
        assert_eq!(got.len(), 3, "the first piece at once, then one delta at {DELTA_BYTES} bytes, one at the end");
        let texts: Vec<String> = got
            .iter()
            .map(|e| match &e.data {
                EventData::LlmDelta { text, index, attempt: 1, turn: 0 } => format!("{index}:{}", text.len()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(texts, ["0:8".to_owned(), format!("1:{DELTA_BYTES}"), "2:4".to_owned()]);
    }

    #[test]
    fn a_retry_after_shown_text_says_restarted_and_one_before_any_does_not() {
        let (ev, sink) = events();
        let d = Deltas::new(&ev, "s", 2);
        d.restart();
        assert!(sink.events().is_empty(), "nothing was shown, nothing to take back");
        d.push("shown");
        d.flush();
        d.restart();
        d.push("again");
        d.flush();
        let kinds: Vec<EventKind> = sink.events().iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [EventKind::LlmDelta, EventKind::LlmRestarted, EventKind::LlmDelta]);
        match &sink.events()[2].data {
            EventData::LlmDelta { attempt: 3, index: 0, text, turn: 2 } => assert_eq!(text, "again"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_slow_stream_sends_each_piece_once_its_time_is_up() {
        let (ev, sink) = events();
        let d = Deltas::new(&ev, "s", 0);
        d.push("a");
        assert_eq!(sink.events().len(), 1, "the first piece at once");
        d.push("b");
        assert_eq!(sink.events().len(), 1, "the next one waits");
        let due = d.due_in().expect("text waits");
        assert!(due <= DELTA_EVERY);
        d.flush_due();
        assert_eq!(sink.events().len(), 1, "not due yet");
        std::thread::sleep(due + Duration::from_millis(5));
        d.flush_due();
        assert_eq!(sink.events().len(), 2, "due: sent without a piece after it");
        assert_eq!(d.due_in(), None);
        std::thread::sleep(DELTA_EVERY + Duration::from_millis(5));
        d.push("c");
        assert_eq!(sink.events().len(), 3, "a piece after a quiet time goes at once");
        assert!(d.sent());
    }

    #[test]
    fn a_follower_shows_each_call_its_restart_and_its_end() {
        let (ev, sink) = events();
        let (a, b) = (Deltas::new(&ev, "a", 0), Deltas::new(&ev, "b", 0));
        a.push("one ");
        a.flush();
        a.restart();
        a.push("two");
        a.flush();
        b.push("other");
        b.flush();
        a.push(" more");
        a.flush();
        ev.emit(Some("a"), || EventData::LlmCompleted { duration_ms: 1.0, tokens: None });
        let mut f = TextFollower::default();
        let events = sink.events();
        let shown: Vec<Shown<'_>> = events.iter().flat_map(|e| f.follow(e)).collect();
        let begins = |stage_id, again| Shown::Begins { stage_id, turn: 0, again, parent_run_id: None };
        assert_eq!(
            shown,
            [
                begins("a", false),
                Shown::Text("one "),
                Shown::Restarted { stage_id: "a", turn: 0, attempt: 2 },
                Shown::Text("two"),
                Shown::Ends,
                begins("b", false),
                Shown::Text("other"),
                Shown::Ends,
                begins("a", true),
                Shown::Text(" more"),
                Shown::Ends,
            ]
        );
    }
}
