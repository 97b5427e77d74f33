//! The model call of a stage: the user message, the stack of the route's model profile, the
//! reply source asked first (a recorded reply is read the way the reply was read when it came),
//! and the reply journalled at once.

use opentelemetry::Context;

use super::state::{Run, RunState, StageFailure};
use super::{JournalEntry, Runner, message};
use crate::failure::ReasonClass;
use crate::hydrate::StageNode;
use crate::llm::stream::Deltas;
use crate::llm::{LlmRequest, OutputSpec, ReplyValue};

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
        let deltas = (stage.streams() && events.watched()).then(|| Deltas::new(events, stage.id(), *turn));
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
        // The stack's telemetry layer sends the deltas' last text before the call's end.
        let reply = llm.complete(&req).await.map_err(|e| StageFailure::new(e.class, e.message))?;
        if run.journal.is_some() {
            let (stage_id, system, raw, value) = (stage.id().to_owned(), req.system.to_owned(), reply.raw_text(), reply.value.recorded());
            state.pending.push(JournalEntry::ModelReply { stage_id, turn: req.turn, system, user, raw, value });
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
