//! A recovered run that goes on with a model call its last holder was streaming: the events
//! that start the call again were recorded already (a streaming call records its events as it
//! goes), so they are not emitted twice.

use std::sync::atomic::Ordering;

use super::{EventData, RunEvents};

/// The start of a model call already recorded: its stage, and what stands in for its
/// `run.llm.started` (a `run.llm.restarted` when text of it was shown).
#[derive(Debug)]
pub(super) struct Through {
    stage_id: String,
    instead: Option<EventData>,
}

impl RunEvents {
    /// A recovered run goes on with a model call of `stage_id` whose start its last holder
    /// recorded (and streamed some of: it recorded the call's events as it went): the run's
    /// `run.started`, the stage's `run.stage.started` and the call's `run.llm.started`, made
    /// again on the way there, are not emitted twice; `instead` (a `run.llm.restarted`, when text
    /// was shown) takes the place of the last. Any other event on the way means the run went
    /// another way: from it on, every event is emitted.
    pub fn continue_call(&self, stage_id: &str, instead: Option<EventData>) {
        *self.through.lock().unwrap_or_else(|p| p.into_inner()) = Some(Through { stage_id: stage_id.to_owned(), instead });
        self.continuing.store(true, Ordering::Relaxed);
    }

    /// Whether `data` is an event of the recorded start of the continued call: then it is not
    /// emitted (the last of them gives way to what stands in for it).
    #[cold]
    pub(super) fn continued(&self, stage_id: Option<&str>, data: &EventData) -> bool {
        let mut through = self.through.lock().unwrap_or_else(|p| p.into_inner());
        let Some(t) = through.as_ref() else { return false };
        let of_stage = stage_id == Some(t.stage_id.as_str());
        let done = match data {
            EventData::RunStarted { .. } => false,
            EventData::StageStarted { .. } if of_stage => false,
            EventData::LlmStarted { .. } if of_stage => true,
            _ => {
                *through = None;
                self.continuing.store(false, Ordering::Relaxed);
                return false;
            }
        };
        if done {
            let t = through.take();
            self.continuing.store(false, Ordering::Relaxed);
            drop(through);
            if let Some(instead) = t.and_then(|t| t.instead) {
                self.send(stage_id, instead);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::events::{EventData, EventKind, MemorySink, RunEvents};

    fn started(ev: &RunEvents, stage: &str) {
        ev.emit(None, || EventData::RunStarted { model_profile: "p".into(), path: "workflow", prefetch_chunks: 0, source: None, activation_target: None });
        ev.emit(Some(stage), || EventData::StageStarted { llm_role: "synthesis", stage_idx: 2, kind: "task" });
        ev.emit(Some(stage), || EventData::LlmStarted { provider: "stub".into(), model: "m".into(), turn: 0, structured: false });
    }

    #[test]
    fn a_continued_call_starts_once_and_says_restarted_in_its_place() {
        let sink = Arc::new(MemorySink::default());
        let ev = RunEvents::new("r", "route", None, sink.clone()).numbered_from(9);
        ev.continue_call("answer", Some(EventData::LlmRestarted { turn: 0, attempt: 2 }));
        started(&ev, "answer");
        started(&ev, "answer");
        let got: Vec<(u64, EventKind)> = sink.events().iter().map(|e| (e.seq, e.kind)).collect();
        assert_eq!(got[0], (9, EventKind::LlmRestarted), "in the place of the recorded start, numbered after the record");
        assert_eq!(got[1..].iter().map(|e| e.1).collect::<Vec<_>>(), [EventKind::RunStarted, EventKind::StageStarted, EventKind::LlmStarted], "once only");
    }

    #[test]
    fn a_run_that_goes_another_way_emits_everything() {
        let sink = Arc::new(MemorySink::default());
        let ev = RunEvents::new("r", "route", None, sink.clone());
        ev.continue_call("answer", None);
        started(&ev, "intake");
        let kinds: Vec<EventKind> = sink.events().iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [EventKind::StageStarted, EventKind::LlmStarted], "run.started is taken as recorded; another stage's start goes another way");
    }
}
