//! The run store: runs (start contract, status, result), their events and their journal, and who
//! executes each run (claims and leases).
//!
//! One small trait, [`RunStore`], with one implementation for SQLite ([`sqlite::SqliteStore`], the
//! default `sqlite://fabric.db`, embedded) and PostgreSQL ([`postgres::PgStore`]). A run is
//! `queued` until a process claims it; a claim holds a lease (renewed by a heartbeat) and a
//! fencing token that every write of the holder carries and the store checks under the run's row
//! lock, so a process that lost its lease never writes again ([`Fenced`] is a claimed run's
//! [`RunJournal`](crate::exec::RunJournal)). A journalled run commits its events and journal entries once per completed
//! stage and once at its end. SQL and its row types stay inside the implementations. Schema
//! versions are numbered; a store refuses a database whose schema is newer than it knows.
//!
//! The modules follow the store's concerns, not its types, so that each reads top to bottom as
//! one path: the write path (`queue`, the writer task; `rows`, what a transaction writes;
//! `pool_writer` and `sqlite_writer`, how each database writes it), then the statements outside
//! it (`reads`, `claims`, `cancels`, `retention`, `session`: methods of [`sql::SqlStore`];
//! `outbox`, `flow`, `schedules`: the other ports it implements), all on the same pool; below them what the
//! databases differ in (`dialect`), what their errors mean (`sql_error`) and the schema
//! (`migrations`); the adapters (`sqlite`, `postgres`) only open a pool. No module is another's
//! helper drawer: what two of them share lives in the lowest one that needs it.

mod cancels;
mod catalogues;
mod claims;
mod contract;
mod dialect;
pub mod experiments;
mod fenced;
mod flow;
mod health;
mod ids;
pub mod inbox;
mod lease;
mod migrations;
mod open;
mod outbox;
mod pool_writer;
pub mod postgres;
mod prompts;
pub mod push;
mod queue;
mod reads;
mod retention;
mod rows;
pub mod schedules;
mod session;
pub mod sql;
mod sql_error;
pub mod sqlite;
mod sqlite_writer;

use serde::Serialize;

pub use contract::StartRequest;
pub use fenced::Fenced;
pub use flow::{FleetBudget, FleetView, Lower, ShareBeat};
pub use ids::{BadKey, IdempotencyKey, RunId};
pub use lease::{Claimed, Holder, Lease};
pub use open::{open, open_existing};
pub use outbox::{Attempt, Delivery, DeliveryRecord, DeliveryState, WebhookOutbox};

use crate::exec::{JournalBatch, JournalEntry};
use crate::failure::BoxFuture;
pub use crate::version::{CatalogueVersion, Sources};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The URL names no store this runtime has, or cannot be parsed.
    #[error("{0}")]
    Url(String),
    /// The database's schema is newer than this binary (a newer runtime migrated it).
    #[error("the database's schema is version {found}; this runtime knows versions up to {known}: upgrade the runtime")]
    TooNew { found: i64, known: i64 },
    #[error("the run store failed: {0}")]
    Database(String),
    /// The database cannot be reached now (a restart, a network cut): worth trying again.
    #[error("the run store is unavailable: {0}")]
    Unavailable(String),
    /// The run's lease was taken over by another process (its own expired): this holder's
    /// writes are refused and it must stop the run.
    #[error("run {0}: its lease was lost (another process took the run over); this process stops it")]
    LeaseLost(String),
    #[error("no run `{0}`")]
    NotFound(String),
    /// A store that is read (`fabric runs`, `replay`) does not exist: nothing was created.
    #[error("{0}")]
    Missing(String),
    /// A new run was not written: another run has its idempotency key (the writer's answer,
    /// which [`RunStore::create_keyed_run`] turns into that run).
    #[error("the idempotency key is another run's")]
    KeyTaken,
    /// A kept catalogue version whose row does not read, or is not the version it is kept
    /// under (changed by hand, or written by another program): it cannot be had, now or later.
    #[error("{0}")]
    VersionUnreadable(String),
}

/// What a keyed start found: its run created (claimed or queued, as `create_run`), or the run
/// another start with the same key created, as it is now.
#[derive(Debug, Clone)]
pub enum Keyed {
    Created(Option<Lease>),
    Existing(Box<StoredRun>),
}

/// Where a run stands in the store (and in the API's views of a run, by the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StoredStatus {
    /// Accepted, not claimed yet: any process serving its route may claim it.
    Queued,
    Running,
    Completed,
    Failed,
    AwaitingInput,
    /// Cancelled on request: terminal, never claimed again.
    Cancelled,
}

impl StoredStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            StoredStatus::Queued => "queued",
            StoredStatus::Running => "running",
            StoredStatus::Completed => "completed",
            StoredStatus::Failed => "failed",
            StoredStatus::AwaitingInput => "awaiting_input",
            StoredStatus::Cancelled => "cancelled",
        }
    }

    /// Still to end or ask: queued or running.
    pub fn is_pending(self) -> bool {
        matches!(self, StoredStatus::Queued | StoredStatus::Running)
    }

    pub fn parse(s: &str) -> Option<StoredStatus> {
        [StoredStatus::Queued, StoredStatus::Running, StoredStatus::Completed, StoredStatus::Failed, StoredStatus::AwaitingInput, StoredStatus::Cancelled]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

/// A new run's row: its id, route and start contract, where its ends are posted, and its
/// session.
#[derive(Debug, Clone, Copy)]
pub struct NewRun<'a> {
    pub run_id: &'a str,
    pub route_id: &'a str,
    pub request: &'a StartRequest,
    /// Where each end (and question) of the run is posted ([`WebhookOutbox`]).
    pub webhook: Option<&'a str>,
    /// The contract's `session_id`: what a session policy looks at.
    pub session_id: Option<&'a str>,
    /// The catalogue version it starts on, and finishes on: its sources must be in the store
    /// ([`RunStore::put_catalogue`]) before the run is. [`crate::runtime::Durable`] gives every
    /// run its version; a row without one (written before versions were kept, or by a tool of
    /// its own) runs on whichever version the process that takes it has loaded.
    pub catalogue_version: Option<&'a CatalogueVersion>,
}

impl<'a> NewRun<'a> {
    /// A run of `request` (its route is the request's), without webhook, session or version.
    pub fn new(run_id: &'a str, request: &'a StartRequest) -> NewRun<'a> {
        NewRun { run_id, route_id: &request.route_id, request, webhook: None, session_id: None, catalogue_version: None }
    }

    /// The start contract as the row keeps it.
    pub(crate) fn request_json(&self) -> String {
        serde_json::to_string(self.request).unwrap_or_default()
    }
}

/// What a start under a session policy found ([`RunStore::create_session_run`]).
#[derive(Debug, Clone, PartialEq)]
pub enum SessionStart {
    /// Created: claimed under `lease` (`reject`, with a holder), or queued behind the session's
    /// live runs; `interrupted` are the live runs a cancel was requested on (`interrupt`).
    Created { lease: Option<Lease>, interrupted: Vec<String> },
    /// `reject`: this run of the session is live.
    Busy { run_id: String },
    /// The idempotency key's run, untouched.
    Existing(Box<StoredRun>),
}

/// A run as the store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRun {
    pub run_id: String,
    pub route_id: String,
    pub status: StoredStatus,
    /// The start contract as accepted, read back (a row whose contract does not read is a
    /// [`StoreError`] naming the run, never a default).
    pub request: StartRequest,
    /// The result (what `fabric run` prints) of the run's last end or question: a run continued
    /// after a reply keeps its question's until it ends or asks again. None before either.
    pub result: Option<crate::exec::RunResult>,
    /// The class of a failed or cancelled end; of a run failed without a result of its own (its
    /// process stopped and the claim that found it gave it up), the only record of why.
    pub reason_class: Option<crate::failure::ReasonClass>,
    pub question: Option<String>,
    /// The `seq` the run's next event gets.
    pub next_seq: u64,
    pub created_at: String,
    pub updated_at: String,
    /// How many times the run was claimed (its fencing token): 1 for a run executed by the
    /// process that accepted it and never taken over.
    pub lease_token: i64,
    /// The reason of a cancel request, once one was made ([`RunStore::request_cancel`]).
    pub cancel_reason: Option<String>,
    /// The catalogue version it started on; none for a run accepted before versions were kept.
    pub catalogue_version: Option<CatalogueVersion>,
}

/// What a cancel request found ([`RunStore::request_cancel`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelAsk {
    /// The run was queued or awaiting input: it is now claimed by the requester, under this
    /// lease, to end it `cancelled` (if the requester dies first, the claim expires and whoever
    /// takes the run over ends it so). Its route, for the end's record, and the request's
    /// reason: the first one made (a request made while the run ran, which asked before its
    /// holder saw the request, stays the reason).
    Claimed {
        lease: Lease,
        route_id: String,
        reason: String,
    },
    /// The run is running: the request is recorded, and the process that holds it ends it with
    /// `reason`, the first request's.
    Requested {
        reason: String,
    },
    /// Cancelled already.
    AlreadyCancelled,
    /// It ended otherwise (completed or failed): it cannot be cancelled.
    Ended(StoredStatus),
    NotFound,
}

/// Which runs to list, newest first.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub route_id: Option<String>,
    pub status: Option<StoredStatus>,
    /// Only runs created before this run (its id; ids sort by start time): the next page.
    pub before: Option<String>,
    pub limit: u32,
}

/// One stored event: its `seq`, its type and the JSON object.
///
/// The object stays the text that was written (`Event::write_json_line`), not an `Event` read
/// back: every reader (the API's event streams, `fabric runs show --events`, the inspector)
/// passes it on as it is, and rows written by older versions go out unchanged.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub seq: u64,
    pub kind: String,
    pub body: String,
}

/// The port to a run store. Contract:
/// - `create_run` inserts a new run, `queued`, or `running` and claimed by `holder`; with a
///   `webhook` URL, each end of the run (and each question it asks) adds a delivery to its outbox
///   ([`WebhookOutbox`]) in the transaction that writes it.
/// - `claim_runs` claims runnable runs of the given routes, oldest first: `queued` ones, and
///   `running` ones whose lease expired (their process died or stalled). Each claim bumps the
///   run's fencing token; concurrent claimers never get the same run.
/// - `append`/`commit` (through [`Fenced`]) write a batch only while the run is `running` with the
///   writer's token, checked in the transaction that writes it under the run's row lock; a fenced
///   run's batch fails with [`StoreError::LeaseLost`] and nothing of it is written, without failing
///   the other runs of the same transaction. With an end, the run's status, result and next `seq`
///   change in the same transaction and its lease is let go.
/// - `claim_reply` atomically moves a run from `awaiting_input` to `running`, claimed (two replies
///   cannot both continue a run).
/// - `renew` extends the leases this process still holds and returns those another process took.
pub trait RunStore: std::fmt::Debug + Send + Sync {
    fn create_run<'a>(&'a self, run: NewRun<'a>, holder: Option<&'a Holder>) -> BoxFuture<'a, Result<Option<Lease>, StoreError>>;
    /// `create_run` unless a run with `key` exists, decided by a constraint of the store (two
    /// processes racing on one key create one run): then that run, untouched.
    fn create_keyed_run<'a>(&'a self, run: NewRun<'a>, holder: Option<&'a Holder>, key: &'a IdempotencyKey) -> BoxFuture<'a, Result<Keyed, StoreError>>;
    /// A run of a session (`run.session_id`) under `policy` (not `allow`), decided in one
    /// transaction that no other start of the session interleaves with (PostgreSQL: an advisory
    /// lock on the session; SQLite: the write lock): `reject` creates it (claimed by `holder`)
    /// only if no run of the session is live, else names the live one; `enqueue` creates it
    /// queued, claimable once every older live run of the session ended; `interrupt` does the
    /// same and records a cancel request (`interrupted_by_session`) on each live run, returned
    /// for the caller to end at once. With `key`, as `create_keyed_run`.
    fn create_session_run<'a>(
        &'a self,
        run: NewRun<'a>,
        holder: Option<&'a Holder>,
        policy: crate::config::SessionPolicy,
        key: Option<&'a IdempotencyKey>,
    ) -> BoxFuture<'a, Result<SessionStart, StoreError>>;
    /// The run started with `key`, if any.
    fn run_of_key<'a>(&'a self, key: &'a IdempotencyKey) -> BoxFuture<'a, Result<Option<StoredRun>, StoreError>>;
    fn get_run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<StoredRun>, StoreError>>;
    fn list_runs<'a>(&'a self, filter: &'a RunFilter) -> BoxFuture<'a, Result<Vec<StoredRun>, StoreError>>;
    fn events_after<'a>(&'a self, run_id: &'a str, after_seq: u64) -> BoxFuture<'a, Result<Vec<StoredEvent>, StoreError>>;
    /// One past the last event written (what a resumed run numbers its next event).
    fn next_seq<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>>;
    fn journal<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<JournalEntry>, StoreError>>;
    fn claim_runs<'a>(&'a self, holder: &'a Holder, routes: &'a [String], limit: usize) -> BoxFuture<'a, Result<Vec<Claimed>, StoreError>>;
    fn claim_reply<'a>(&'a self, run_id: &'a str, holder: &'a Holder) -> BoxFuture<'a, Result<Option<Lease>, StoreError>>;
    /// Puts a claimed reply back (`running` → `awaiting_input`) when the run could not go on.
    fn reopen_reply<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<(), StoreError>>;
    /// Ends a lease early (the holder stops the run without an end): any process may claim it
    /// now, and the holder's later writes are refused (the fencing token moves on).
    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<(), StoreError>>;
    /// Records a request to cancel `run_id` with `reason`, atomically: a queued or awaiting run
    /// is claimed by `holder` at once ([`CancelAsk::Claimed`]); a running one keeps its holder,
    /// who finds the request through [`RunStore::cancel_requests`]. The first reason stays.
    fn request_cancel<'a>(&'a self, run_id: &'a str, reason: &'a str, holder: &'a Holder) -> BoxFuture<'a, Result<CancelAsk, StoreError>>;
    /// The runs `holder` executes that someone asked to cancel, with each request's reason.
    fn cancel_requests<'a>(&'a self, holder: &'a Holder) -> BoxFuture<'a, Result<Vec<(Lease, String)>, StoreError>>;
    /// Deletes up to `limit` ended runs (completed, failed, cancelled) whose last change is
    /// before `cutoff` (a time as stored), with their events and journal entries (their
    /// idempotency keys are columns of their rows), in one short transaction; returns how many.
    /// With `dry_run`, deletes nothing and counts every such run. One sweep at a time across
    /// processes: while another holds the sweep, 0.
    /// Runs queued or awaiting input with a cancel request on them (left by an interrupting
    /// start that did not end them: its replica died, or its client went away), oldest first:
    /// (run id, reason), for any process to end.
    fn pending_cancels(&self, limit: usize) -> BoxFuture<'_, Result<Vec<(String, String)>, StoreError>>;
    fn prune<'a>(&'a self, cutoff: &'a str, limit: usize, dry_run: bool) -> BoxFuture<'a, Result<u64, StoreError>>;
    /// Up to `limit` runs awaiting input since before `cutoff`, oldest first.
    fn awaiting_since<'a>(&'a self, cutoff: &'a str, limit: usize) -> BoxFuture<'a, Result<Vec<String>, StoreError>>;
    /// Extends these leases by the holder's lease length; returns the runs whose lease another
    /// process holds now.
    fn renew<'a>(&'a self, holder: &'a Holder, leases: &'a [Lease]) -> BoxFuture<'a, Result<Vec<String>, StoreError>>;
    /// Queues a batch (see [`RunJournal`](crate::exec::RunJournal)): an earlier failure of the run's writes, as it was
    /// (`LeaseLost`, `Database`, `Unavailable`), is the answer.
    fn append<'a>(&'a self, lease: &'a Lease, batch: JournalBatch) -> BoxFuture<'a, Result<(), StoreError>>;
    /// Writes a batch and waits until every batch of the run is durable (see [`RunJournal`](crate::exec::RunJournal)).
    fn commit<'a>(&'a self, lease: &'a Lease, batch: JournalBatch) -> BoxFuture<'a, Result<(), StoreError>>;
    /// [`RunStore::append`], `durable` called once the batch committed (see
    /// [`RunJournal::append_then`](crate::exec::RunJournal::append_then)); by default once queued.
    fn append_then<'a>(&'a self, lease: &'a Lease, batch: JournalBatch, durable: crate::exec::Durable) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.append(lease, batch).await?;
            durable();
            Ok(())
        })
    }
    /// Keeps a catalogue version's `sources` under `version`, their digest, once (a version kept
    /// already is left as it is). Done before the first run that records the version.
    fn put_catalogue<'a>(&'a self, version: &'a CatalogueVersion, sources: &'a Sources) -> BoxFuture<'a, Result<(), StoreError>>;
    /// The sources of `version`, checked against it (a row that does not read, or whose digest
    /// differs, is [`StoreError::VersionUnreadable`]); `None` when the store does not keep it.
    fn catalogue<'a>(&'a self, version: &'a CatalogueVersion) -> BoxFuture<'a, Result<Option<Sources>, StoreError>>;
    /// The versions kept whose digest starts with `prefix` (hex digits), in order, at most `limit`.
    fn catalogue_versions<'a>(&'a self, prefix: &'a str, limit: usize) -> BoxFuture<'a, Result<Vec<CatalogueVersion>, StoreError>>;
    /// The catalogue versions (at most `limit`) that runs waiting for a claim (queued, or running
    /// with their lease expired) recorded, of routes other than `routes`.
    fn stranded_versions<'a>(&'a self, routes: &'a [String], limit: usize) -> BoxFuture<'a, Result<Vec<CatalogueVersion>, StoreError>>;
    /// Records that the run `lease` holds goes on on `version` from now on (it moved, and its
    /// events say so); refused ([`StoreError::LeaseLost`]) when the lease is not the run's.
    fn move_catalogue<'a>(&'a self, lease: &'a Lease, version: &'a CatalogueVersion) -> BoxFuture<'a, Result<(), StoreError>>;
    /// How many runs wait for a claim.
    fn queued(&self) -> BoxFuture<'_, Result<u64, StoreError>>;
    /// Whether the database answers (`/readyz`).
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>>;
    /// Whether the store takes writes now, as its last writes found it (no I/O): while they
    /// fail, [`StoreError::Unavailable`] with the reason, and starts and replies are refused
    /// with it at once; a background probe finds out when writes work again. Also `Unavailable`
    /// for good once a SQLite file was removed or replaced under the store.
    fn health(&self) -> Result<(), StoreError>;
    /// The outbox of the runs' webhook deliveries, in the same database.
    fn webhooks(&self) -> &dyn WebhookOutbox;
    /// The fleet's shared budget of model calls, where the store can hold one for many
    /// replicas (PostgreSQL); `None` where the limits hold per process (SQLite).
    fn fleet(&self) -> Option<&dyn FleetBudget> {
        None
    }
    /// The scheduled runs' schedules and fire records in the same database (`None`: a test's double).
    fn schedules(&self) -> Option<&dyn schedules::ScheduleStore> {
        None
    }

    /// The experiments of `fabric eval` (issue 51), where the store keeps them (SQL stores do).
    fn experiments(&self) -> Option<&dyn experiments::ExperimentStore> {
        None
    }

    /// The runs' inboxes: messages for a run that was not asking (`None`: a test's double).
    fn inbox(&self) -> Option<&dyn inbox::InboxStore> {
        None
    }

    /// The runs' A2A push notification configs (issue 52; `None`: a test's double).
    fn push_configs(&self) -> Option<&dyn push::PushConfigStore> {
        None
    }
}

/// The time now, as stored (`YYYY-MM-DDTHH:MM:SS.mmmZ`, sortable as text).
pub(crate) fn now() -> String {
    crate::events::rfc3339_now()
}
