//! A run's events as the Vercel AI SDK's UI message stream (`?format=ui-message-stream`, header
//! `x-vercel-ai-ui-message-stream: v1`): a pure translation, event by event, that the event
//! stream (`stream`) applies to what it sends; it reads, follows and resumes the run as for the
//! plain stream. docs/ui-message-stream.md says what a client sees.
//!
//! - The run is one assistant message (`start` with `messageId` the run id; after a reply to a
//!   question, `{run_id}-{seq}` with the `seq` of `run.resumed`), ended by `finish` and
//!   `[DONE]` when the run completes, fails (`error` first), is cancelled (`abort` first) or asks
//!   (the question as a text part first): the stream ends there.
//! - Each stage is a step (`start-step` .. `finish-step`) with a `data-fabric-stage` part (the
//!   stage's latest event; one part per stage execution, updated in place); run events are the
//!   `data-fabric-run` part; model and tool events go as transient `data-fabric-call` parts.
//! - A model call's deltas are a text part, opened at its first delta, with an id of its own per
//!   stage, turn, attempt (and the `seq` that opened it). `run.llm.restarted`, or a stage begun
//!   again while its text was open (a takeover), ends the part and says so in a
//!   `data-fabric-restarted` part naming the dropped text part; the new text is a new part.
//!   Every text part carries `providerMetadata.fabric.textId`, so a front end can hide them.
//! - Frames carry SSE ids: the last frame of an event has its `seq`, the ones before `seq - 1`,
//!   so a client cut off in the middle of an event's frames gets them all again. A resume after
//!   `Last-Event-ID` replays the run's earlier events silently and then opens again what was
//!   open at that point (the message, the step, the text part, with the same ids): a client that
//!   lost its state reads a valid stream; one that kept it sees a new step and text part.

use serde::Deserialize;
use serde_json::{Value, json};

/// The response header that marks the protocol.
pub(super) const HEADER: (&str, &str) = ("x-vercel-ai-ui-message-stream", "v1");

/// One SSE event of the stream: its id (a `seq`) and its data (a chunk's JSON, or `[DONE]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Frame {
    pub id: u64,
    pub data: String,
}

/// The fields of an event the translation looks at.
#[derive(Debug, Default, Deserialize)]
struct Fields {
    stage_id: Option<String>,
    stage_idx: Option<u64>,
    turn: Option<u64>,
    attempt: Option<u64>,
    text: Option<String>,
    message: Option<String>,
    question: Option<String>,
    output: Option<String>,
    reason: Option<String>,
}

/// The text part open now: its call (stage, turn, attempt) and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Text {
    stage: String,
    turn: u64,
    attempt: u64,
    id: String,
}

/// The translation of one run's events, in order; silent up to `after` (a resume).
#[derive(Debug)]
pub(super) struct UiStream {
    run_id: String,
    after: u64,
    /// The message's id (the run id, or the segment's after a reply).
    message_id: String,
    /// A message is open (its `start` sent, or due while silent).
    open: bool,
    /// The message ended (`finish`).
    ended: bool,
    /// A frame after `after` was made: what was open then is open for the client too.
    live: bool,
    /// The step open: the stage's part id, and the stage.
    step: Option<(String, String)>,
    text: Option<Text>,
    /// The last text part ended, and whether it was dropped since.
    last_text: Option<(Text, bool)>,
    /// Any text part in this message (a run that streamed none ends with its output as text).
    any_text: bool,
    /// The last `seq`, and how often `seq`s came again (a segment's unrecorded events followed
    /// by the record's): told apart in text ids.
    prev: u64,
    epoch: u32,
}

impl UiStream {
    /// A translation that sends what comes after `after` (0: everything).
    pub fn new(run_id: &str, after: u64) -> UiStream {
        UiStream {
            run_id: run_id.to_owned(),
            after,
            message_id: run_id.to_owned(),
            open: false,
            ended: false,
            live: false,
            step: None,
            text: None,
            last_text: None,
            any_text: false,
            prev: 0,
            epoch: 0,
        }
    }

    /// Whether the message ended in what was sent: the stream ends.
    pub fn ended(&self) -> bool {
        self.ended && self.live
    }

    /// The frames of one event (none while silent, up to `after`).
    pub fn push(&mut self, seq: u64, kind: &str, json: &str) -> Vec<Frame> {
        if seq <= self.prev {
            self.epoch += 1;
        }
        self.prev = seq;
        let silent = seq <= self.after;
        let mut chunks = Vec::new();
        if !silent && !self.live {
            self.live = true;
            self.reopen(&mut chunks);
        }
        let fields: Fields = serde_json::from_str(json).unwrap_or_default();
        self.translate(seq, kind, json, &fields, &mut chunks);
        if silent {
            return Vec::new();
        }
        let n = chunks.len();
        chunks.into_iter().enumerate().map(|(i, data)| Frame { id: if i + 1 == n { seq } else { seq.saturating_sub(1) }, data }).collect()
    }

    /// A resume's first frames: the message, the step and the text part open at `after`, with
    /// their ids.
    fn reopen(&self, out: &mut Vec<String>) {
        if self.open {
            out.push(json!({"type": "start", "messageId": self.message_id}).to_string());
        }
        if self.step.is_some() {
            out.push(json!({"type": "start-step"}).to_string());
        }
        if let Some(t) = &self.text {
            out.push(text_start(&t.id, json!({"stageId": t.stage, "turn": t.turn, "attempt": t.attempt})));
        }
    }

    fn translate(&mut self, seq: u64, kind: &str, json: &str, f: &Fields, out: &mut Vec<String>) {
        if kind == "run.resumed" {
            // A reply to the question: a new message.
            self.message_id = format!("{}-{seq}", self.run_id);
            (self.ended, self.open, self.any_text) = (false, false, false);
        }
        if self.ended {
            return;
        }
        if !self.open {
            out.push(json!({"type": "start", "messageId": self.message_id}).to_string());
            self.open = true;
        }
        let stage = f.stage_id.as_deref().unwrap_or_default();
        match kind {
            "run.stage.started" => {
                if self.step.as_ref().is_some_and(|(_, s)| s == stage) {
                    // The same stage again while its step was open: it was interrupted (a
                    // takeover), and its text comes again.
                    self.drop_text(None, out);
                }
                self.end_step(out);
                let id = f.stage_idx.map_or_else(|| stage.to_owned(), |i| format!("{stage}#{i}"));
                out.push(json!({"type": "start-step"}).to_string());
                out.push(data_part("data-fabric-stage", &id, json));
                self.step = Some((id, stage.to_owned()));
            }
            "run.stage.completed" | "run.stage.failed" => {
                self.end_text(out);
                let id = self.step.as_ref().filter(|(_, s)| s == stage).map_or_else(|| stage.to_owned(), |(id, _)| id.clone());
                out.push(data_part("data-fabric-stage", &id, json));
                self.end_step(out);
            }
            "run.llm.delta" => {
                let call = (stage, f.turn.unwrap_or_default(), f.attempt.unwrap_or(1));
                if self.text.as_ref().is_some_and(|t| (t.stage.as_str(), t.turn, t.attempt) != call) {
                    self.end_text(out);
                }
                if self.text.is_none() {
                    let epoch = if self.epoch > 0 { format!(".{}", self.epoch) } else { String::new() };
                    let id = format!("text-{stage}-{}-{}-{seq}{epoch}", call.1, call.2);
                    out.push(text_start(&id, json!({"stageId": stage, "turn": call.1, "attempt": call.2})));
                    self.text = Some(Text { stage: stage.to_owned(), turn: call.1, attempt: call.2, id });
                    self.any_text = true;
                }
                if let Some(t) = &self.text {
                    out.push(json!({"type": "text-delta", "id": t.id, "delta": f.text.as_deref().unwrap_or_default()}).to_string());
                }
            }
            "run.llm.restarted" => self.drop_text(Some((stage, f.turn.unwrap_or_default(), f.attempt.unwrap_or_default())), out),
            "run.llm.started" => {
                // A text part still open: its call never ended (a takeover), and comes again.
                self.drop_text(None, out);
                out.push(call_part(json));
            }
            "run.llm.completed" | "run.llm.failed" => {
                self.end_text(out);
                out.push(call_part(json));
            }
            "run.completed" | "run.failed" | "run.cancelled" | "run.awaiting_input" => self.finish(seq, kind, json, f, out),
            k if k.starts_with("run.llm.") || k.starts_with("run.tool.") => out.push(call_part(json)),
            _ => out.push(data_part("data-fabric-run", &self.run_id, json)),
        }
    }

    /// The run's end or question: the message's last parts, `finish`, `[DONE]`.
    fn finish(&mut self, seq: u64, kind: &str, json: &str, f: &Fields, out: &mut Vec<String>) {
        self.end_step(out);
        let (text, reason) = match kind {
            "run.completed" => ((!self.any_text).then(|| f.output.clone()).flatten(), "stop"),
            "run.awaiting_input" => (f.question.clone(), "stop"),
            "run.failed" => (None, "error"),
            _ => (None, "other"),
        };
        if let Some(text) = text.filter(|t| !t.is_empty()) {
            let part = if kind == "run.completed" { "output" } else { "question" };
            let id = format!("text-{part}-{seq}");
            out.push(text_start(&id, json!({"part": part})));
            out.push(json!({"type": "text-delta", "id": id, "delta": text}).to_string());
            out.push(json!({"type": "text-end", "id": id}).to_string());
        }
        out.push(data_part("data-fabric-run", &self.run_id, json));
        match kind {
            "run.failed" => out.push(json!({"type": "error", "errorText": f.message.as_deref().unwrap_or("the run failed")}).to_string()),
            "run.cancelled" => out.push(json!({"type": "abort", "reason": f.reason.as_deref().unwrap_or("cancelled")}).to_string()),
            _ => {}
        }
        out.push(json!({"type": "finish", "finishReason": reason}).to_string());
        out.push("[DONE]".to_owned());
        (self.ended, self.open) = (true, false);
    }

    /// Ends the open text part (its call ended).
    fn end_text(&mut self, out: &mut Vec<String>) {
        if let Some(t) = self.text.take() {
            out.push(json!({"type": "text-end", "id": t.id}).to_string());
            self.last_text = Some((t, false));
        }
    }

    /// Ends the open step (and its text part).
    fn end_step(&mut self, out: &mut Vec<String>) {
        self.end_text(out);
        if self.step.take().is_some() {
            out.push(json!({"type": "finish-step"}).to_string());
        }
    }

    /// Drops a call's text: the open part (ended, then named in `data-fabric-restarted`); for
    /// `run.llm.restarted` (`call` given) else the last part of the call's stage and turn, unless
    /// dropped already.
    fn drop_text(&mut self, call: Option<(&str, u64, u64)>, out: &mut Vec<String>) {
        let dropped = if self.text.is_some() {
            self.end_text(out);
            self.last_text.as_ref().map(|(t, _)| t.clone())
        } else {
            let (stage, turn) = match call {
                Some((stage, turn, _)) => (stage, turn),
                None => return,
            };
            self.last_text.as_ref().filter(|(t, dropped)| !dropped && t.stage == stage && t.turn == turn).map(|(t, _)| t.clone())
        };
        let Some(t) = dropped else { return };
        let attempt = call.map_or(t.attempt + 1, |c| c.2);
        let data = json!({"stage_id": t.stage, "turn": t.turn, "attempt": attempt, "dropped": t.id});
        out.push(data_part("data-fabric-restarted", &t.id, &data.to_string()));
        self.last_text = Some((t, true));
    }
}

/// A `text-start` chunk with its id, and what it is in `providerMetadata.fabric`.
fn text_start(id: &str, mut meta: Value) -> String {
    meta["textId"] = json!(id);
    json!({"type": "text-start", "id": id, "providerMetadata": {"fabric": meta}}).to_string()
}

/// A typed data part: `{"type": "data-NAME", "id", "data"}`, `data` an event's JSON as it is.
fn data_part(kind: &str, id: &str, data: &str) -> String {
    format!(r#"{{"type":{},"id":{},"data":{data}}}"#, json!(kind), json!(id))
}

/// A model or tool call's event: a transient data part (to `onData`, not kept in the message).
fn call_part(data: &str) -> String {
    format!(r#"{{"type":"data-fabric-call","transient":true,"data":{data}}}"#)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A run's events: (seq, kind, JSON), numbered from 1.
    fn run(events: &[(&str, Value)]) -> Vec<(u64, String, String)> {
        events
            .iter()
            .enumerate()
            .map(|(i, (kind, extra))| {
                let mut e = json!({"type": kind, "run_id": "r1", "route_id": "t", "seq": i + 1});
                for (k, v) in extra.as_object().unwrap() {
                    e[k] = v.clone();
                }
                (i as u64 + 1, (*kind).to_owned(), e.to_string())
            })
            .collect()
    }

    fn delta(stage: &str, attempt: u64, index: u64, text: &str) -> (&'static str, Value) {
        ("run.llm.delta", json!({"stage_id": stage, "turn": 0, "attempt": attempt, "index": index, "text": text}))
    }

    fn stage(kind: &'static str, id: &str, idx: u64) -> (&'static str, Value) {
        (kind, json!({"stage_id": id, "stage_idx": idx, "output": "o"}))
    }

    fn llm(kind: &'static str, stage: &str) -> (&'static str, Value) {
        (kind, json!({"stage_id": stage, "turn": 0}))
    }

    /// Every frame of the events, sent after `after`; and whether the stream ended.
    fn frames(events: &[(u64, String, String)], after: u64) -> (Vec<Frame>, bool) {
        let mut ui = UiStream::new("r1", after);
        let mut out = Vec::new();
        for (seq, kind, json) in events {
            out.extend(ui.push(*seq, kind, json));
            if ui.ended() {
                return (out, true);
            }
        }
        (out, false)
    }

    /// What a client that starts with nothing makes of frames, as the AI SDK reads them (a
    /// delta or an end of a text part not started is an error there, and here).
    #[derive(Debug, Default)]
    struct Reader {
        message_id: String,
        /// Text parts: (id, text, ended).
        texts: Vec<(String, String, bool)>,
        active: HashMap<String, usize>,
        data: Vec<Value>,
        steps: usize,
        errors: Vec<String>,
        finish: Option<String>,
        done: bool,
    }

    fn read(frames: &[Frame]) -> Reader {
        let mut r = Reader::default();
        for f in frames {
            assert!(!r.done, "nothing after [DONE]: {f:?}");
            if f.data == "[DONE]" {
                r.done = true;
                continue;
            }
            let c: Value = serde_json::from_str(&f.data).unwrap();
            let id = c["id"].as_str().unwrap_or_default().to_owned();
            match c["type"].as_str().unwrap() {
                "start" => r.message_id = c["messageId"].as_str().unwrap().to_owned(),
                "start-step" => r.steps += 1,
                "finish-step" => r.active.clear(),
                "text-start" => {
                    assert_eq!(c["providerMetadata"]["fabric"]["textId"], c["id"]);
                    r.active.insert(id.clone(), r.texts.len());
                    r.texts.push((id, String::new(), false));
                }
                "text-delta" => r.texts[*r.active.get(&id).expect("a delta of a started part")].1 += c["delta"].as_str().unwrap(),
                "text-end" => r.texts[r.active.remove(&id).expect("the end of a started part")].2 = true,
                "error" => r.errors.push(c["errorText"].as_str().unwrap().to_owned()),
                "finish" => r.finish = Some(c["finishReason"].as_str().unwrap().to_owned()),
                "abort" => {}
                t if t.starts_with("data-") => r.data.push(c),
                other => panic!("not a chunk of the protocol: {other}"),
            }
        }
        r
    }

    fn streamed() -> Vec<(u64, String, String)> {
        run(&[
            ("run.started", json!({})),
            stage("run.stage.started", "intake", 0),
            llm("run.llm.started", "intake"),
            llm("run.llm.completed", "intake"),
            stage("run.stage.completed", "intake", 0),
            stage("run.stage.started", "answer", 1),
            llm("run.llm.started", "answer"),
            delta("answer", 1, 0, "You were "),
            delta("answer", 1, 1, "charged "),
            delta("answer", 1, 2, "twice."),
            llm("run.llm.completed", "answer"),
            stage("run.stage.completed", "answer", 1),
            ("run.completed", json!({"output": "You were charged twice."})),
        ])
    }

    #[test]
    fn a_streamed_run_is_one_message_with_a_step_per_stage_and_its_text_in_one_part() {
        let events = streamed();
        let (frames, ended) = frames(&events, 0);
        assert!(ended);
        let r = read(&frames);
        assert_eq!(r.message_id, "r1");
        assert_eq!(r.texts, [("text-answer-0-1-8".to_owned(), "You were charged twice.".to_owned(), true)]);
        assert_eq!((r.steps, r.finish.as_deref(), r.done, r.errors.len()), (2, Some("stop"), true, 0));
        // One part per stage execution, the latest event in it; the run's own part; the calls
        // transient.
        let stages: Vec<&Value> = r.data.iter().filter(|d| d["type"] == "data-fabric-stage").collect();
        assert_eq!(stages.iter().map(|d| d["id"].as_str().unwrap()).collect::<Vec<_>>(), ["intake#0", "intake#0", "answer#1", "answer#1"]);
        assert_eq!(stages[3]["data"]["type"], "run.stage.completed");
        assert!(r.data.iter().filter(|d| d["type"] == "data-fabric-call").all(|d| d["transient"] == true));
        assert_eq!(r.data.last().unwrap()["data"]["type"], "run.completed");
        // The last frame of each event has its seq, the ones before seq - 1.
        assert!(frames.windows(2).all(|w| w[0].id <= w[1].id), "{frames:?}");
        for (seq, ..) in &events {
            let of: Vec<&Frame> = frames.iter().filter(|f| f.id == *seq || f.id + 1 == *seq).collect();
            assert!(of.iter().any(|f| f.id == *seq), "event {seq} has its id");
        }
        assert_eq!(frames.last().unwrap(), &Frame { id: 13, data: "[DONE]".into() });
    }

    #[test]
    fn a_restarted_call_ends_its_part_names_it_dropped_and_starts_a_new_one() {
        let events = run(&[
            stage("run.stage.started", "answer", 0),
            llm("run.llm.started", "answer"),
            delta("answer", 1, 0, "Wrong"),
            ("run.llm.restarted", json!({"stage_id": "answer", "turn": 0, "attempt": 2})),
            delta("answer", 2, 0, "Right"),
            llm("run.llm.completed", "answer"),
            stage("run.stage.completed", "answer", 0),
            ("run.completed", json!({"output": "Right"})),
        ]);
        let r = read(&frames(&events, 0).0);
        assert_eq!(
            r.texts.iter().map(|t| (t.0.as_str(), t.1.as_str(), t.2)).collect::<Vec<_>>(),
            [("text-answer-0-1-3", "Wrong", true), ("text-answer-0-2-5", "Right", true)]
        );
        let dropped: Vec<&Value> = r.data.iter().filter(|d| d["type"] == "data-fabric-restarted").collect();
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0]["id"], "text-answer-0-1-3");
        assert_eq!(dropped[0]["data"], json!({"stage_id": "answer", "turn": 0, "attempt": 2, "dropped": "text-answer-0-1-3"}));
    }

    #[test]
    fn a_stage_begun_again_while_its_text_was_open_drops_that_text() {
        // A takeover: the interrupted stage's events again, its text from the start.
        let events = run(&[
            stage("run.stage.started", "answer", 0),
            llm("run.llm.started", "answer"),
            delta("answer", 1, 0, "Half a"),
            stage("run.stage.started", "answer", 0),
            llm("run.llm.started", "answer"),
            delta("answer", 1, 0, "A whole answer"),
            ("run.llm.restarted", json!({"stage_id": "answer", "turn": 0, "attempt": 1})),
            delta("answer", 1, 0, "A whole answer."),
            llm("run.llm.completed", "answer"),
            stage("run.stage.completed", "answer", 0),
            ("run.completed", json!({"output": "A whole answer."})),
        ]);
        let r = read(&frames(&events, 0).0);
        let texts: Vec<&str> = r.texts.iter().map(|t| t.1.as_str()).collect();
        assert_eq!(texts, ["Half a", "A whole answer", "A whole answer."]);
        let dropped: Vec<&str> = r.data.iter().filter(|d| d["type"] == "data-fabric-restarted").map(|d| d["data"]["dropped"].as_str().unwrap()).collect();
        assert_eq!(dropped, ["text-answer-0-1-3", "text-answer-0-1-6"], "the last part is the one shown");
        assert_eq!(r.steps, 2);
    }

    #[test]
    fn a_failed_run_ends_with_its_message_as_the_error_and_a_cancelled_one_with_abort() {
        let events = run(&[
            stage("run.stage.started", "answer", 0),
            ("run.stage.failed", json!({"stage_id": "answer", "reason_class": "timeout", "message": "the provider did not answer in 30 s"})),
            ("run.failed", json!({"reason_class": "timeout", "message": "the provider did not answer in 30 s", "stage_id": "answer"})),
        ]);
        let r = read(&frames(&events, 0).0);
        assert_eq!(r.errors, ["the provider did not answer in 30 s"]);
        assert_eq!((r.finish.as_deref(), r.done, r.texts.len()), (Some("error"), true, 0));
        let cancelled = run(&[("run.started", json!({})), ("run.cancelled", json!({"reason_class": "cancelled", "reason": "user stop"}))]);
        let (frames, _) = frames(&cancelled, 0);
        assert!(frames.iter().any(|f| f.data == r#"{"type":"abort","reason":"user stop"}"#), "{frames:?}");
        assert_eq!(read(&frames).finish.as_deref(), Some("other"));
    }

    #[test]
    fn a_run_that_asks_ends_its_message_with_the_question_and_its_reply_opens_the_next() {
        let events = run(&[
            ("run.started", json!({})),
            stage("run.stage.started", "clarify", 0),
            stage("run.stage.completed", "clarify", 0),
            ("run.awaiting_input", json!({"question": "Which order?"})),
            ("run.resumed", json!({"reply": "The last one"})),
            ("run.completed", json!({"output": "Refunded."})),
        ]);
        let (asked, ended) = frames(&events, 0);
        assert!(ended, "the stream ends at the question");
        let r = read(&asked);
        assert_eq!(r.texts, [("text-question-4".to_owned(), "Which order?".to_owned(), true)]);
        assert_eq!((r.finish.as_deref(), asked.last().unwrap().id), (Some("stop"), 4));
        // After the reply, from the question's id: a new message (no text streamed: the output).
        let (rest, _) = frames(&events, 4);
        let r = read(&rest);
        assert_eq!(r.message_id, "r1-5");
        assert_eq!(r.texts, [("text-output-6".to_owned(), "Refunded.".to_owned(), true)]);
        assert!(r.done);
    }

    #[test]
    fn a_resume_anywhere_opens_again_what_was_open_and_a_reader_with_nothing_reads_the_rest() {
        let events = streamed();
        let (all, _) = frames(&events, 0);
        for after in 1..=events.len() as u64 {
            let (rest, _) = frames(&events, after);
            let r = read(&rest);
            assert!(rest.iter().all(|f| f.id >= after), "{after}: {rest:?}");
            if after < events.len() as u64 {
                assert_eq!(r.message_id, "r1", "{after}");
                assert!(r.done && r.finish.as_deref() == Some("stop"), "{after}");
            } else {
                assert!(rest.is_empty(), "after the end, nothing");
            }
            // The text after the cut, in a part with the same id.
            let sent: String = all
                .iter()
                .filter(|f| f.id > after)
                .filter_map(|f| serde_json::from_str::<Value>(&f.data).ok())
                .filter(|c| c["type"] == "text-delta")
                .map(|c| c["delta"].as_str().unwrap().to_owned())
                .collect();
            let got: String = r.texts.iter().map(|t| t.1.as_str()).collect();
            assert_eq!(got, sent, "{after}");
            assert!(r.texts.iter().all(|t| t.0 == "text-answer-0-1-8" && t.2), "{after}: {:?}", r.texts);
        }
        // In the middle of the text part: the message, the step and the part again.
        let (rest, _) = frames(&events, 9);
        let heads: Vec<Value> = rest.iter().take(3).map(|f| serde_json::from_str(&f.data).unwrap()).collect();
        assert_eq!(heads.iter().map(|c| c["type"].as_str().unwrap()).collect::<Vec<_>>(), ["start", "start-step", "text-start"]);
        assert_eq!(heads[2]["id"], "text-answer-0-1-8");
    }

    #[test]
    fn seqs_that_come_again_give_text_parts_ids_of_their_own() {
        // A segment's unrecorded events, then the record's from seq 2 on.
        let mut events = run(&[stage("run.stage.started", "answer", 0), delta("answer", 1, 0, "lost")]);
        events.extend(run(&[stage("run.stage.started", "x", 0), stage("run.stage.started", "answer", 0), delta("answer", 1, 0, "kept")]).into_iter().skip(1));
        let r = read(&frames(&events, 0).0);
        assert_eq!(r.texts.iter().map(|t| t.0.as_str()).collect::<Vec<_>>(), ["text-answer-0-1-2", "text-answer-0-1-3.1"]);
        assert_eq!(r.data.iter().filter(|d| d["type"] == "data-fabric-restarted").count(), 1);
    }
}
