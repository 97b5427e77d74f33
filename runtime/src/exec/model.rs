//! The model call of a stage: the user message, the stack of the route's model profile, the
//! reply source asked first (a recorded reply is read the way the reply was read when it came),
//! and the reply journalled at once.

use std::time::Duration;

use opentelemetry::Context;

use super::state::{Run, RunState, StageFailure};
use super::{JournalBatch, JournalEntry, RunJournal, Runner, message};
use crate::events::RunEvents;
use crate::failure::ReasonClass;
use crate::hydrate::StageNode;
use crate::llm::stream::Deltas;
use crate::llm::{LlmRequest, OutputSpec, ReplyValue};

/// How often a journalled call that streams records its events so far (its deltas), so that
/// another replica's watchers see the text while the call runs, not when the stage ends.
pub const STREAM_RECORD_EVERY: Duration = Duration::from_millis(100);

impl Runner {
    pub(super) async fn call_model(&self, run: &Run<'_>, stage: &StageNode, state: &mut RunState, cx: &Context) -> Result<ReplyValue, StageFailure> {
        let Run { route, goal, prefetch, events, cancel, .. } = *run;
        let goal_json = state.goal_json.get_or_insert_with(|| message::goal_json(goal));
        // One buffer for the run's user messages (a journalled run keeps each in its entry).
        let mut user = std::mem::take(&mut state.user_buf);
        message::write_user_message(&mut user, goal_json, prefetch, &state.notes);
        let idx = match state.llm_calls.iter().position(|(_, id, _)| **id == *stage.id()) {
            Some(i) => i,
            None => {
                state.llm_calls.push((route.shared_id().clone(), stage.shared_id().clone(), 0));
                state.llm_calls.len() - 1
            }
        };
        let turn = &mut state.llm_calls[idx].2;
        // Only where someone watches (a live sink: the service's, `--events-out`, a library's):
        // a run whose events are only recorded streams nothing and pays nothing for it.
        let deltas = (stage.streams() && events.watched()).then(|| {
            let deltas = Deltas::new(events, stage.id(), *turn);
            if matches!(stage.output(), OutputSpec::Decision(_)) { deltas.for_decision() } else { deltas }
        });
        let req = LlmRequest {
            events,
            route_id: route.id(),
            stage_id: stage.id(),
            turn: *turn,
            priority: route.priority(),
            system: stage.prompt().system_text(),
            user: &user,
            output: stage.output(),
            cx,
            cancel,
            stream: deltas.as_ref(),
        };
        *turn += 1;
        if let Some(value) = state.source.model_reply(stage.id(), req.turn, req.system, &user, events)? {
            return recorded_reply(stage, &value);
        }
        let llm = match self.profile_llms.get(route.model_profile()) {
            Some(Ok(l)) => l,
            // Refused at start (`route`); never reached.
            Some(Err(e)) => return Err(StageFailure::new(ReasonClass::ProviderError, e.to_string())),
            None => &self.llm,
        };
        // Asked of the model: a call its last holder was streaming when it stopped is made again,
        // its text the attempt after the one recorded (`RunEvents::continue_call` said
        // `run.llm.restarted` when that one had shown text).
        if let Some(open) = state.open.take_if(|o| o.stage_id == stage.id() && o.turn == req.turn)
            && let Some(d) = &deltas
        {
            d.continuing(if open.shown { open.attempt + 1 } else { open.attempt });
        }
        // The stack's telemetry layer sends the deltas' last text before the call's end.
        let call = llm.complete(&req);
        let reply = match (run.journal, &deltas) {
            (Some(journal), Some(d)) => {
                let (reply, unrecorded) = recorded_as_it_streams(call, journal, events, d).await;
                // A write of the run failed during the call: the run stops here, as after a
                // checkpoint that failed (the reply is not used, nor recorded).
                if let Some(e) = unrecorded {
                    return Err(StageFailure::new(ReasonClass::StoreError, format!("the run's record could not be written: {e}")));
                }
                reply
            }
            _ => call.await,
        };
        let reply = reply.map_err(|e| StageFailure::new(e.class, e.message))?;
        if run.journal.is_some() {
            let (stage_id, system, raw, value) = (stage.id().to_owned(), req.system.to_owned(), reply.raw_text(), reply.value.recorded());
            let model = reply.served_by.as_deref().map(str::to_owned);
            state.pending.push(JournalEntry::ModelReply { stage_id, turn: req.turn, system, user, raw, value, model });
            // Recorded at once: a run recovered after a crash does not ask the model again.
            self.checkpoint(run, state).await?;
        } else {
            state.user_buf = user;
        }
        Ok(reply.value)
    }
}

/// The stage value of a recorded reply, read the way the reply was read when it came.
fn recorded_reply(stage: &StageNode, value: &str) -> Result<ReplyValue, StageFailure> {
    let bad = |why: String| StageFailure::new(ReasonClass::StoreError, format!("the recorded reply of stage `{}` does not read: {why}", stage.id()));
    Ok(match stage.output() {
        OutputSpec::Bindable(schema) => ReplyValue::Structured(crate::structured::decode_reply(schema, value).map_err(|e| bad(e.to_string()))?),
        OutputSpec::Decision(spec) => ReplyValue::Decision(spec.parse_json(value).map_err(|e| bad(e.to_string()))?),
        OutputSpec::Text | OutputSpec::Unbindable { .. } => ReplyValue::Text(value.to_owned()),
    })
}

/// Awaits a streaming call, handing its events so far to the journal every
/// [`STREAM_RECORD_EVERY`] once it has shown text: the store is how other replicas follow a run,
/// and a client that reconnects to one of them mid-call must get the text written so far. (Not
/// before: the run's next holder goes on from a recorded call only when it streamed, see
/// [`super::open_call`].) A write that fails ends the recording, not the call; the caller stops
/// the run with it once the call is over.
async fn recorded_as_it_streams<T>(
    call: impl std::future::Future<Output = T>,
    journal: &dyn RunJournal,
    events: &RunEvents,
    deltas: &Deltas<'_>,
) -> (T, Option<super::JournalError>) {
    let mut call = std::pin::pin!(call);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + STREAM_RECORD_EVERY, STREAM_RECORD_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            reply = &mut call => return (reply, None),
            _ = tick.tick() => {
                if !deltas.shown() {
                    continue;
                }
                let so_far = events.take_recorded();
                let durable = events.on_durable(&so_far);
                if let Err(e) = journal.append_then(events.run_id(), JournalBatch { events: so_far, entries: Vec::new(), end: None }, durable).await {
                    return (call.await, Some(e));
                }
            }
        }
    }
}
