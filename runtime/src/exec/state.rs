//! The state of one run: what stays fixed while it runs ([`Run`]), what changes ([`RunState`],
//! rebuilt from a journal when a run is taken up again), an open stage, and how a stage or a
//! walk ends.

use std::sync::Arc;

use opentelemetry::Context;
use serde_json::{Map, Value};

use super::source::ReplySource;
use super::{JournalEntry, RunJournal, RunRequest, Slots};
use crate::cancel::Cancel;
use crate::events::RunEvents;
use crate::failure::ReasonClass;
use crate::hydrate::{Route, StageNode};

/// What stays fixed during one run (a child run gets its own).
#[derive(Clone, Copy)]
pub(super) struct Run<'a> {
    pub(super) route: &'a Route,
    pub(super) goal: &'a Map<String, Value>,
    pub(super) prefetch: &'a [String],
    pub(super) events: &'a RunEvents,
    /// 0 for a top-level run, +1 per child run level.
    pub(super) depth: u32,
    /// The step budget: the route's `max_loop_steps`, never more than its parent's budget.
    pub(super) budget: u32,
    /// Fires when the run is cancelled from outside; child runs share their parent's.
    pub(super) cancel: &'a Cancel,
    /// Where the run's record goes, when it is journalled (top-level runs only).
    pub(super) journal: Option<&'a dyn RunJournal>,
}

/// Mutable state of one run.
#[derive(Debug, Default)]
pub(super) struct RunState {
    pub(super) notes: Vec<String>,
    pub(super) slots: Slots,
    /// Structured outputs (compact JSON) of the stages whose fields a branch condition reads
    /// (most routes have none), read only when a condition asks.
    pub(super) structured: Vec<(Arc<str>, String)>,
    /// The goal's compact JSON, made at the run's first model call, shown in every call's message.
    pub(super) goal_json: Option<String>,
    /// The last model call's user message, its buffer reused by the next.
    pub(super) user_buf: String,
    /// Visits per node, indexed by node index (a handful of nodes: no hashing).
    pub(super) visits: Vec<u32>,
    /// Model turns of the decision loop.
    pub(super) turns: u32,
    /// Stages started so far (the next `stage_idx`).
    pub(super) stages_started: u32,
    /// Journal entries not yet committed (journalled runs only).
    pub(super) pending: Vec<JournalEntry>,
    /// Where the run's replies and tool results come from (the model and tool ports, its journal).
    pub(super) source: ReplySource,
    /// Model calls per stage of this route: (route, stage, calls), as the result reports them.
    pub(super) llm_calls: Vec<(Arc<str>, Arc<str>, u32)>,
    pub(super) child_calls: Vec<(Arc<str>, Arc<str>, u32)>,
    pub(super) last_output: Option<Last>,
    /// A recovered run's call its last holder was streaming (see [`super::OpenCall`]).
    pub(super) open: Option<super::OpenCall>,
    /// The agent's task whose question the run asked, as its journal ends (continued runs).
    pub(super) tool_ask: Option<super::journal::ToolAsk>,
    /// A continued run's reply that goes to that task instead of to the model.
    pub(super) answered: Option<(super::journal::ToolAsk, String)>,
}

/// What a completed run returns as its output: the slot of the stage that completed last (kept
/// as its place among the slots, not a copy of each stage's value), or a decision's answer.
#[derive(Debug)]
pub(super) enum Last {
    Slot(usize),
    Answer(String),
}

/// A stage between `begin_stage` and `end_stage`: its node, start time and span context.
pub(super) struct OpenStage<'s> {
    pub(super) stage: &'s StageNode,
    pub(super) started: crate::events::Stopwatch,
    /// The stage's trace context: the parent of its model call's span.
    pub(super) cx: Context,
}

/// What a stage of a workflow gave: its value, or (a stage calling an agent) the agent's new
/// question, which the run asks its user (recorded with the agent's task).
pub(super) enum Staged {
    Value(String),
    Asks(super::journal::ToolAsk),
}

/// How a walk ended when it did not fail.
pub(super) enum Finish {
    Completed,
    AwaitingInput(String),
}

pub(super) struct StageFailure {
    pub(super) class: ReasonClass,
    pub(super) message: String,
    /// Extra data for the `run.failed` event (the last decisions of a loop that ran out).
    pub(super) detail: Option<Value>,
}

impl<'a> Run<'a> {
    /// A top-level run of `route` (not a child run).
    pub(super) fn top(route: &'a Route, req: &'a RunRequest, events: &'a RunEvents, cancel: &'a Cancel, journal: Option<&'a dyn RunJournal>) -> Run<'a> {
        Run { route, goal: &req.goal, prefetch: &req.prefetch, events, depth: 0, budget: route.max_loop_steps(), cancel, journal }
    }
}

impl RunState {
    /// A new run's state, with room for each of the route's stages (its slots and their
    /// counters are then made once, not grown stage by stage).
    pub(super) fn for_route(route: &Route) -> RunState {
        let stages = route.graph().node_count();
        RunState { slots: Slots::with_capacity_and_hasher(stages, Default::default()), visits: vec![0; stages], ..RunState::default() }
    }

    /// The state a run that asked goes on from with the user's `reply` (its `note`), `None` when
    /// the route cannot take one. A decision loop: rebuilt from its journal, the reply a note
    /// (or, when the question was an agent's, sent to the agent's task). A workflow asked at a
    /// stage calling an agent (its journal's last entry): the walk goes again from the journal
    /// to that stage, whose agent gets the reply (the stage takes the note when it sends it).
    pub(super) fn continued(route: &Route, mut history: Vec<JournalEntry>, reply: &str, note: &str, events: &RunEvents) -> Option<RunState> {
        if route.path() == crate::hydrate::RoutePath::DecisionLoop {
            let mut state = RunState::from_history(route.shared_id(), route.entry_node().id(), &history);
            state.answered = state.tool_ask.take().map(|ask| (ask, reply.to_owned()));
            state.notes.push(note.to_owned());
            return Some(state);
        }
        let Some(JournalEntry::ToolAsked(ask)) = history.pop().filter(|_| route.can_ask()) else { return None };
        Some(RunState { source: ReplySource::recovering(history, events), answered: Some((ask, reply.to_owned())), ..RunState::for_route(route) })
    }

    /// The state a journal describes: notes, slots and the last output in order, model calls per
    /// stage, the decision loop's turns (the calls of its `decide` node).
    pub(super) fn from_history(route_id: &Arc<str>, decide_id: &str, history: &[JournalEntry]) -> RunState {
        let mut state = RunState::default();
        for entry in history {
            match entry {
                JournalEntry::ModelReply { stage_id, .. } => match state.llm_calls.iter_mut().find(|(_, id, _)| **id == **stage_id) {
                    Some(c) => c.2 += 1,
                    None => state.llm_calls.push((route_id.clone(), stage_id.as_str().into(), 1)),
                },
                JournalEntry::StageCompleted { stage_id, value, note } => {
                    state.stages_started += 1;
                    state.notes.extend(note.iter().cloned());
                    let (at, _) = state.slots.insert_full(stage_id.clone(), value.clone());
                    state.last_output = Some(Last::Slot(at));
                }
                JournalEntry::Note { note } => {
                    state.stages_started += 1;
                    state.notes.push(note.clone());
                }
                JournalEntry::UserReply { note, .. } => state.notes.push(note.clone()),
                JournalEntry::ToolAsked(ask) => state.tool_ask = Some(ask.clone()),
            }
            // Anything but the reply after an agent's question means it was answered.
            if !matches!(entry, JournalEntry::ToolAsked(_) | JournalEntry::UserReply { .. }) {
                state.tool_ask = None;
            }
        }
        state.turns = state.llm_calls.iter().find(|(_, id, _)| **id == *decide_id).map_or(0, |c| c.2);
        state
    }
}

impl StageFailure {
    pub(super) fn new(class: ReasonClass, message: impl Into<String>) -> StageFailure {
        StageFailure { class, message: message.into(), detail: None }
    }

    pub(super) fn with_detail(mut self, detail: Value) -> StageFailure {
        self.detail = Some(detail);
        self
    }
}
