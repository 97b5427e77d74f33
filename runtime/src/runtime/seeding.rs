//! A new run seeded with the journal of another run's first stages ([`Durable::run_seeded`]):
//! what a partial re-run of an experiment's case is (`fabric eval run --from`). The seed is the
//! new run's own record from its first write, so the run is walked as a recovered run is
//! (`Begin::Recover`): the stages the seed covers answered from it (no model or tool call, their
//! events not emitted), then live from the first stage it does not.

use std::sync::Arc;

use super::{AcceptError, Durable, RunOutcome, StartRequest};
use crate::cancel::{Cancel, CancelHandle};
use crate::events::EventSink;
use crate::exec::{Begin, JournalBatch, JournalEntry, RunHistory, RunJournal};
use crate::store::Fenced;

impl Durable {
    /// Accepts `req` as a new run, writes `seed` (journal entries of the stages it starts with)
    /// as its record, and runs it here from there, holding its lease as
    /// [`Durable::run_recorded`] does. The seed must be a journal's prefix for this route and
    /// goal (entries of whole stages, in order), else the run leaves it where the path does.
    pub async fn run_seeded(
        &self,
        req: &StartRequest,
        seed: Vec<JournalEntry>,
        sink: Arc<dyn EventSink>,
        handle: &CancelHandle,
        cancel: Cancel,
    ) -> Result<RunOutcome, AcceptError> {
        let accepted = self.accept_here(req).await?;
        let lease = accepted.lease.ok_or(AcceptError::NotClaimed)?;
        let fenced = Fenced { store: self.store.as_ref(), lease: &lease };
        let run_id = lease.run_id().to_owned();
        if !seed.is_empty() {
            let batch = JournalBatch { events: Vec::new(), entries: seed.clone(), end: None };
            fenced.append(&run_id, batch).await.map_err(|e| crate::store::StoreError::Database(e.to_string()))?;
        }
        let history = RunHistory { run_id, entries: seed, next_seq: 1, open: None };
        let run = accepted.edition.runner().execute(req.run_request(), Begin::Recover(history), sink, cancel, Some(&fenced));
        let result = self.holding(&lease, handle, run).await?;
        Ok(RunOutcome { result, unused_script_lines: Vec::new() })
    }
}
