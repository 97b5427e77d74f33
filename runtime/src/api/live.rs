//! Runs executing in this process: their events as they happen (for Server-Sent Events) and
//! their end (for `?wait=true`). The store is the record; this is only the live tail.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::watch;

use crate::cancel::{Cancel, CancelHandle};
use crate::events::{Event, EventSink};
use crate::store::Lease;

/// An event as the live tail keeps it: ready to send.
#[derive(Debug, Clone)]
pub struct LiveEvent {
    pub seq: u64,
    pub kind: &'static str,
    pub json: Arc<str>,
}

/// One run segment in flight (from its start, or from a reply, to its end or its question).
#[derive(Debug)]
pub struct LiveRun {
    run_id: String,
    /// The lease this process executes it under.
    lease: Lease,
    /// Stops this segment (a lost lease, the end of a shutdown).
    stop: CancelHandle,
    /// Set once stopped: what the segment does after that (its interruption) is not the run's
    /// record and is shown to nobody.
    stopped: std::sync::atomic::AtomicBool,
    /// Every event of this segment, in order.
    log: Mutex<Vec<LiveEvent>>,
    /// The last `seq` handed to the run's record. A model's text is shown only once it was
    /// (and what came after it waits with it): a client must never see text of a call that a
    /// takeover could make again under the same `seq`s without a `run.llm.restarted` between.
    recorded: std::sync::atomic::AtomicU64,
    /// Bumped on every event and at the end, so waiters wake up.
    tick: watch::Sender<u64>,
    /// The result object once the segment ended.
    end: Mutex<Option<Value>>,
}

impl LiveRun {
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The token the segment runs with: fires when it is stopped.
    pub fn cancel_token(&self) -> Cancel {
        self.stop.token()
    }

    /// Stops the segment: it is no longer this process's to run (its lease is lost or handed
    /// over, so its interruption is kept from the record by the fence), and from now on its
    /// events reach neither the live tail nor the metrics.
    pub fn stop(&self, reason: &str) {
        self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        self.stop.cancel(reason);
    }

    /// Cancels the segment on request: unlike [`LiveRun::stop`], the run is still this
    /// process's, and its end (`cancelled`) is recorded and shown like any end.
    pub fn cancel(&self, reason: &str) {
        self.stop.cancel_run(reason);
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Events with `seq > after`, and whether the segment has ended (then they are all).
    pub fn events_after(&self, after: u64) -> (Vec<LiveEvent>, bool) {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let ended = self.end.lock().unwrap_or_else(|p| p.into_inner()).is_some();
        let recorded = self.recorded.load(std::sync::atomic::Ordering::Acquire);
        let shown = log.iter().filter(|e| e.seq > after).take_while(|e| e.seq <= recorded || e.kind != "run.llm.delta");
        (shown.cloned().collect(), ended)
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.tick.subscribe()
    }

    /// The result, once ended.
    pub fn end(&self) -> Option<Value> {
        self.end.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until the segment ended; returns its result.
    pub async fn wait(&self) -> Value {
        let mut rx = self.subscribe();
        loop {
            if let Some(v) = self.end() {
                return v;
            }
            if rx.changed().await.is_err() {
                return self.end().unwrap_or(Value::Null);
            }
        }
    }
}

impl EventSink for LiveRun {
    /// The run's events up to `through` are durable in its record: the text among them can
    /// be shown.
    fn recorded(&self, run_id: &str, through: u64) {
        if *run_id == *self.run_id {
            self.recorded.fetch_max(through, std::sync::atomic::Ordering::AcqRel);
            self.tick.send_modify(|t| *t += 1);
        }
    }

    fn follows_record(&self) -> bool {
        true
    }

    fn emit(&self, event: &Event) {
        // A child run's events have their own ids and numbering; the parent's stream shows the
        // child through its stage.
        if *event.run_id != *self.run_id || self.is_stopped() {
            return;
        }
        // A run's end is streamed from the store once recorded, never from here: a segment whose
        // end could not be recorded (its lease lost) must not tell a client the run ended.
        if event.kind.ends_run() {
            self.tick.send_modify(|t| *t += 1);
            return;
        }
        let mut line = Vec::with_capacity(256);
        event.write_json_line(&mut line);
        line.pop();
        let json: Arc<str> = String::from_utf8(line).unwrap_or_default().into();
        self.log.lock().unwrap_or_else(|p| p.into_inner()).push(LiveEvent { seq: event.seq, kind: event.kind.as_str(), json });
        self.tick.send_modify(|t| *t += 1);
    }
}

/// Every live run of this process, by id.
#[derive(Debug, Default)]
pub struct Live {
    runs: Mutex<HashMap<String, Arc<LiveRun>>>,
}

impl Live {
    /// Registers a new segment of a run this process holds (replacing an ended one).
    pub fn begin(&self, lease: &Lease) -> Arc<LiveRun> {
        let run_id = lease.run_id().to_owned();
        let (stop, _) = CancelHandle::new();
        let run = Arc::new(LiveRun {
            run_id: run_id.clone(),
            lease: lease.clone(),
            stop,
            stopped: false.into(),
            log: Mutex::default(),
            recorded: 0.into(),
            tick: watch::channel(0).0,
            end: Mutex::default(),
        });
        self.runs.lock().unwrap_or_else(|p| p.into_inner()).insert(run_id, run.clone());
        run
    }

    /// The leases of the runs in flight (for the store's heartbeat).
    pub fn leases(&self) -> Vec<Lease> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner()).values().map(|r| r.lease.clone()).collect()
    }

    pub fn get(&self, run_id: &str) -> Option<Arc<LiveRun>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner()).get(run_id).cloned()
    }

    /// Ends a segment: records its result, wakes its waiters, forgets it (its record is in the
    /// store by now: the run's last commit came before).
    pub fn finish(&self, run: &LiveRun, result: Value) {
        *run.end.lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
        run.tick.send_modify(|t| *t += 1);
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        if runs.get(&run.run_id).is_some_and(|r| std::ptr::eq(r.as_ref(), run)) {
            runs.remove(&run.run_id);
        }
    }

    /// How many runs are in flight.
    pub fn len(&self) -> usize {
        self.runs.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::events::{EventData, RunEvents};

    #[test]
    fn text_is_shown_once_its_record_is_durable_and_what_follows_waits_with_it() {
        let live = Live::default();
        let run = live.begin(&Lease::new("r", 1));
        let events = RunEvents::new("r", "route", None, run.clone() as Arc<dyn EventSink>).recording(1);
        events.emit(Some("answer"), || EventData::LlmDelta { turn: 0, attempt: 1, index: 0, text: "Hel".into() });
        events.emit(Some("answer"), || EventData::LlmRestarted { turn: 0, attempt: 2 });
        assert!(run.events_after(0).0.is_empty(), "not recorded yet, and what follows waits with it");
        let taken = events.take_recorded();
        assert_eq!(taken.len(), 2);
        let durable = events.on_durable(&taken).unwrap();
        events.emit(Some("answer"), || EventData::LlmDelta { turn: 0, attempt: 2, index: 0, text: "Hello".into() });
        assert!(run.events_after(0).0.is_empty(), "handed to the record, not yet durable there");
        durable();
        let seqs: Vec<u64> = run.events_after(0).0.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [1, 2], "the durable ones");
        let taken = events.take_recorded();
        events.on_durable(&taken).unwrap()();
        assert_eq!(run.events_after(2).0.len(), 1);
    }
}
