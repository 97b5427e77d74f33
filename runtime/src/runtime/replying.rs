//! A run that asked, answered: the reply claims it in the store (only one reply can), the
//! run goes on from its journal with the reply (`exec::Begin::Continue`), under the run's lease
//! ([`Durable::reply_recorded`] for `fabric runs reply`, [`Durable::claim_reply`] and
//! [`Durable::continue_run`] for the service); and [`Durable::replay`], a finished run re-executed
//! from its journal alone.

use std::sync::Arc;

use super::durable::read_history;
use super::{Durable, RunOutcome, StartRequest};
use crate::cancel::{Cancel, CancelHandle};
use crate::events::{EventSink, NullSink};
use crate::exec::{Begin, RunHistory, StartError};
use crate::store::inbox::Queued;
use crate::store::{Fenced, Lease, StoreError, StoredStatus};
use serde_json::Value;

impl Durable {
    /// Continues a run that asked with the user's `message`, here, recorded in the store,
    /// holding its lease until it ends or asks again (renewed every third of it; if another
    /// process takes the run anyway, `handle` stops it with "lease lost"). What
    /// `fabric runs reply` does; the service does the same over its replicas' leases.
    pub async fn reply_recorded(
        &self,
        run_id: &str,
        message: String,
        sink: Arc<dyn EventSink>,
        handle: &CancelHandle,
        cancel: Cancel,
    ) -> Result<RunOutcome, ReplyError> {
        let claimed = self.claim_reply(run_id, message).await?;
        let lease = claimed.lease().clone();
        Ok(self.holding(&lease, handle, self.continue_run(claimed, sink, cancel)).await?)
    }

    /// Claims a run that awaits the user for `message`: only one reply can claim it.
    pub async fn claim_reply(&self, run_id: &str, message: String) -> Result<ClaimedReply, ReplyError> {
        let (request, on) = self.reply_checks(run_id).await?;
        let Some(lease) = self.store.claim_reply(run_id, &self.holder).await? else {
            return Err(ReplyError::NotWaiting { run_id: run_id.to_owned(), status: "running" });
        };
        self.claimed(request, on, lease, message, false).await
    }

    /// Claims a run that awaits the user for the oldest message queued for it
    /// ([`Durable::queue_message`]), taken in the same transaction; `None` when it does not
    /// await the user or no message waits for it.
    pub async fn claim_queued_reply(&self, run_id: &str) -> Result<Option<ClaimedReply>, ReplyError> {
        let Some(inbox) = self.store.inbox() else { return Ok(None) };
        let (request, on) = match self.reply_checks(run_id).await {
            Ok(checked) => checked,
            Err(ReplyError::NotWaiting { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some((lease, text)) = inbox.claim_queued_reply(run_id, &self.holder).await? else { return Ok(None) };
        self.claimed(request, on, lease, text, true).await.map(Some)
    }

    /// Keeps `text` for run `run_id`, which is not asking now, as the reply to its next question
    /// (the oldest message first; `message_id` once). Only a run that can ask
    /// ([`crate::hydrate::Route::can_ask`]) takes messages, and only until it ends.
    pub async fn queue_message(&self, run_id: &str, message_id: &str, text: &str) -> Result<Queued, ReplyError> {
        let inbox = self.store.inbox().ok_or(ReplyError::NoInbox)?;
        let run = self.store.get_run(run_id).await?.ok_or_else(|| ReplyError::NotFound(run_id.to_owned()))?;
        if run.status.is_pending() || run.status == StoredStatus::AwaitingInput {
            self.version_to_go_on(&run).await?;
        }
        Ok(inbox.queue_message(run_id, message_id, text).await?)
    }

    /// Runs that asked while a message waits for them, for [`Durable::claim_queued_reply`].
    pub async fn runs_with_waiting_messages(&self) -> Result<Vec<String>, StoreError> {
        match self.store.inbox() {
            Some(inbox) => inbox.runs_with_waiting_messages(64).await,
            None => Ok(Vec::new()),
        }
    }

    /// The messages queued for run `run_id`, in order (none where the store keeps none).
    pub async fn queued_messages(&self, run_id: &str) -> Result<Vec<crate::store::inbox::InboxMessage>, StoreError> {
        match self.store.inbox() {
            Some(inbox) => inbox.messages(run_id).await,
            None => Ok(Vec::new()),
        }
    }

    /// What must hold before a run that asked is claimed to go on: it awaits the user, it is
    /// not to be cancelled, its version and route can continue it (a claimed run that cannot go
    /// on would be stuck `running`). Its request and the edition it goes on on.
    async fn reply_checks(&self, run_id: &str) -> Result<(StartRequest, super::on_version::OnVersion), ReplyError> {
        let run = self.store.get_run(run_id).await?.ok_or_else(|| ReplyError::NotFound(run_id.to_owned()))?;
        if run.status != StoredStatus::AwaitingInput {
            return Err(ReplyError::NotWaiting { run_id: run_id.to_owned(), status: run.status.as_str() });
        }
        // Someone asked to cancel it while it was running, and it asked before its holder saw
        // the request: the request stands, so the run ends `cancelled` now instead of going on.
        if let Some(reason) = &run.cancel_reason {
            let _ = self.cancel(run_id, Some(reason), Arc::new(NullSink)).await;
            return Err(ReplyError::NotWaiting { run_id: run_id.to_owned(), status: StoredStatus::Cancelled.as_str() });
        }
        let on = self.version_to_go_on(&run).await?;
        Ok((run.request, on))
    }

    /// The edition `run` goes on on after a reply (its own version), if its route there can
    /// take one ([`crate::hydrate::Route::can_ask`]).
    async fn version_to_go_on(&self, run: &crate::store::StoredRun) -> Result<super::on_version::OnVersion, ReplyError> {
        let on = self.edition_of(run.catalogue_version.as_ref(), Some(self.runtime.settings().service.resume_on)).await?;
        if !on.edition.check_route(&run.request.route_id)?.can_ask() {
            return Err(StartError::NotResumable { route: run.request.route_id.clone() }.into());
        }
        Ok(on)
    }

    /// A claimed run with its history, read after the claim: between a read and the claim
    /// another process could have continued the run and seen it ask again, and this claim would
    /// go on from stale history.
    async fn claimed(
        &self,
        request: StartRequest,
        on: super::on_version::OnVersion,
        lease: Lease,
        reply: String,
        queued: bool,
    ) -> Result<ClaimedReply, ReplyError> {
        match read_history(self.store.as_ref(), lease.run_id()).await {
            Ok(history) => Ok(ClaimedReply { request, lease, history, reply, edition: on.edition, moved: on.moved, queued }),
            Err(e) => {
                self.reopen(&lease, queued).await;
                Err(e.into())
            }
        }
    }

    /// A claimed run not continued after all: it awaits the user again, and a queued message it
    /// took waits again for it.
    async fn reopen(&self, lease: &Lease, queued: bool) {
        if queued && let Some(inbox) = self.store.inbox() {
            let _ = inbox.put_back(lease.run_id()).await;
        }
        let _ = self.store.reopen_reply(lease).await;
    }

    /// Continues a claimed run with its reply (`exec::Begin::Continue`).
    pub async fn continue_run(&self, claimed: ClaimedReply, sink: Arc<dyn EventSink>, cancel: Cancel) -> Result<RunOutcome, StartError> {
        let ClaimedReply { request, lease, mut history, reply, edition, moved, queued } = claimed;
        if let Some(moved) = moved
            && let Err(e) = self.note_moved(&lease, &request.route_id, &mut history, moved, &edition, sink.clone()).await
        {
            // Not continued: it awaits the reply again, and the outcome says why.
            self.reopen(&lease, queued).await;
            let why = format!("the run's record could not be written: {e}");
            let result = crate::exec::result_from_journal(lease.run_id(), &request.route_id, &history.entries, crate::failure::ReasonClass::StoreError, &why);
            return Ok(RunOutcome { result, unused_script_lines: Vec::new() });
        }
        let fenced = Fenced { store: self.store.as_ref(), lease: &lease };
        match edition.runner().execute(request.run_request(), Begin::Continue { history, reply }, sink, cancel, Some(&fenced)).await {
            Ok(result) => Ok(RunOutcome { result, unused_script_lines: Vec::new() }),
            Err(e) => {
                // Not started after all (the catalogue changed since the check): it still waits.
                self.reopen(&lease, queued).await;
                Err(e)
            }
        }
    }

    /// Re-executes a finished run from its journal with no model and no tool call, and reports
    /// every divergence: a prompt, a user message, a result or a path that differs from what was
    /// recorded, and an end that differs from the stored one. On `ReplayOn::Recorded` the run's
    /// own catalogue version (rebuilt from the store), so a run replays as it ran; on
    /// `ReplayOn::Loaded` the catalogue this runtime loaded, to see what another catalogue would
    /// have done.
    pub async fn replay(&self, run_id: &str, on: ReplayOn) -> Result<crate::exec::ReplayReport, ReplyError> {
        let store = &self.store;
        let run = store.get_run(run_id).await?.ok_or_else(|| ReplyError::NotFound(run_id.to_owned()))?;
        if run.status == StoredStatus::Running {
            return Err(ReplyError::NotWaiting { run_id: run_id.to_owned(), status: "running" });
        }
        let edition = match on {
            ReplayOn::Loaded => self.runtime.current(),
            ReplayOn::Recorded => {
                // Replay is on the version the run ran on, whatever the fleet resumes runs on.
                let on = self.edition_of(run.catalogue_version.as_ref(), None).await?;
                if let Some(crate::events::EventData::CatalogueMoved { reason, .. }) = on.moved {
                    return Err(ReplyError::VersionGone { run_id: run_id.to_owned(), reason });
                }
                on.edition
            }
        };
        let history = store.journal(run_id).await?;
        let result = edition.runner().execute(run.request.run_request(), Begin::Replay(history), Arc::new(NullSink), Cancel::never(), None).await?;
        let mut report = crate::exec::ReplayReport::from(result);
        // Compared as written: the stored result is what a `RunResult` serialises to.
        let recorded = serde_json::to_value(&run.result).unwrap_or(Value::Null);
        let now = serde_json::to_value(&report.result).unwrap_or(Value::Null);
        for key in ["status", "output", "question"] {
            if recorded.get(key) != now.get(key) {
                let (was, is) = (recorded.get(key).cloned().unwrap_or(Value::Null), now.get(key).cloned().unwrap_or(Value::Null));
                report.divergences.push(format!("the run's `{key}` differs: recorded {was}, now {is}"));
            }
        }
        Ok(report)
    }
}

/// Why a reply was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReplyError {
    #[error("no run `{0}`")]
    NotFound(String),
    #[error("run `{run_id}` is {status}, not awaiting the user")]
    NotWaiting { run_id: String, status: &'static str },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Start(#[from] StartError),
    /// The store keeps no messages for runs (a test's double).
    #[error("this run store keeps no messages for runs that are not asking")]
    NoInbox,
    /// A replay on the run's own version, which cannot be had here.
    #[error("run `{run_id}` cannot be replayed on the catalogue version it ran on: {reason}")]
    VersionGone { run_id: String, reason: String },
}

/// Which catalogue a replay runs on ([`Durable::replay`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayOn {
    /// The version the run recorded.
    Recorded,
    /// The catalogue this runtime loaded.
    Loaded,
}

/// A run a reply may continue: claimed in the store (no other reply can take it).
#[derive(Debug)]
pub struct ClaimedReply {
    request: StartRequest,
    lease: Lease,
    /// The run's record so far, read after the claim.
    history: RunHistory,
    /// The user's reply.
    reply: String,
    /// The edition it goes on on, and the event that says it moved when that is not its own.
    edition: Arc<super::Edition>,
    moved: Option<crate::events::EventData>,
    /// The reply is a queued message (put back if the run is not continued).
    queued: bool,
}

impl ClaimedReply {
    pub fn run_id(&self) -> &str {
        &self.history.run_id
    }

    pub fn lease(&self) -> &Lease {
        &self.lease
    }
}
