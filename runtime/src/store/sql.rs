//! The run store over any SQL database sqlx has: [`SqlStore`], one implementation of
//! [`RunStore`] for SQLite and PostgreSQL. Its methods live with their concern, each an
//! inherent method of the same name that the trait's method here hands the call to: the writes
//! of a run (new runs, batches) go through the writer ([`super::queue`]); [`super::reads`],
//! [`super::claims`] (claims and leases), [`super::cancels`], [`super::retention`] and
//! [`super::session`] are statements on the pool. What differs between the databases is the
//! [`Dialect`]; the adapters ([`super::sqlite`], [`super::postgres`]) only open, tune and
//! migrate a pool.

use std::sync::Arc;

use super::dialect::Dialect;
use super::health::Health;
use super::queue::WriteQueue;
use super::rows::Write;
use super::sql_error::db;
use super::{
    CancelAsk, CatalogueVersion, Claimed, Holder, IdempotencyKey, Keyed, Lease, NewRun, RunFilter, RunStore, SessionStart, Sources, StoreError, StoredEvent,
    StoredRun,
};
use crate::exec::{JournalBatch, JournalEntry};
use crate::failure::BoxFuture;

/// A run store on a pool of `DB` connections, with the shared writer task.
#[derive(Debug)]
pub struct SqlStore<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    queue: WriteQueue,
    health: Arc<Health>,
}

impl<DB: sqlx::Database> SqlStore<DB> {
    /// A store on `pool` (migrated), whose writes go through `queue` and report to `health`.
    pub(crate) fn new(pool: sqlx::Pool<DB>, queue: WriteQueue, health: Arc<Health>) -> SqlStore<DB> {
        SqlStore { pool, queue, health }
    }

    /// The pool, for the store's other parts over the same tables.
    pub(super) fn pool_ref(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }

    pub(super) fn health_ref(&self) -> &Health {
        &self.health
    }

    #[cfg(test)]
    pub(crate) fn pool(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }
}

/// Each method that is not a new run's is the inherent method of the same name in its concern's
/// module (an inherent method is found before the trait's, so `SqlStore::get_run(self, …)` here
/// is that one, not this). Each of those modules' `impl` blocks spells these bounds out again:
/// Rust has no alias for a set of higher-ranked bounds on other types than `DB`.
impl<DB> RunStore for SqlStore<DB>
where
    DB: sqlx::Database + Dialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'t> &'t str: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> String: sqlx::Encode<'t, DB> + sqlx::Decode<'t, DB> + sqlx::Type<DB>,
    for<'t> Option<&'t str>: sqlx::Encode<'t, DB>,
    for<'t> i64: sqlx::Encode<'t, DB> + sqlx::Decode<'t, DB> + sqlx::Type<DB>,
    for<'t> Option<i64>: sqlx::Encode<'t, DB>,
    for<'r> &'r str: sqlx::ColumnIndex<DB::Row>,
    for<'r> usize: sqlx::ColumnIndex<DB::Row>,
{
    fn create_run<'a>(&'a self, run: NewRun<'a>, holder: Option<&'a Holder>) -> BoxFuture<'a, Result<Option<Lease>, StoreError>> {
        Box::pin(async move {
            // While writes fail, a start is refused at once (the healer finds out when they
            // work again); it is never acknowledged without its row committed.
            self.health.check()?;
            self.queue.write(Write::create(&run, holder, None)).await?;
            Ok(holder.map(|_| Lease::new(run.run_id.to_owned(), 1)))
        })
    }

    fn create_keyed_run<'a>(&'a self, run: NewRun<'a>, holder: Option<&'a Holder>, key: &'a IdempotencyKey) -> BoxFuture<'a, Result<Keyed, StoreError>> {
        Box::pin(async move {
            self.health.check()?;
            match self.queue.write(Write::create(&run, holder, Some(key))).await {
                Ok(()) => Ok(Keyed::Created(holder.map(|_| Lease::new(run.run_id.to_owned(), 1)))),
                // The key's run is committed (the constraint saw it): read it.
                Err(StoreError::KeyTaken) => SqlStore::run_of_key(self, key)
                    .await?
                    .map(|run| Keyed::Existing(Box::new(run)))
                    .ok_or_else(|| StoreError::Database("the run of this idempotency key was removed while it was being read; start again".into())),
                Err(e) => Err(e),
            }
        })
    }

    fn create_session_run<'a>(
        &'a self,
        run: NewRun<'a>,
        holder: Option<&'a Holder>,
        policy: crate::config::SessionPolicy,
        key: Option<&'a IdempotencyKey>,
    ) -> BoxFuture<'a, Result<SessionStart, StoreError>> {
        Box::pin(super::session::session_run(self, run, holder, policy, key))
    }

    fn run_of_key<'a>(&'a self, key: &'a IdempotencyKey) -> BoxFuture<'a, Result<Option<StoredRun>, StoreError>> {
        Box::pin(SqlStore::run_of_key(self, key))
    }

    fn get_run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<StoredRun>, StoreError>> {
        Box::pin(SqlStore::get_run(self, run_id))
    }

    fn list_runs<'a>(&'a self, filter: &'a RunFilter) -> BoxFuture<'a, Result<Vec<StoredRun>, StoreError>> {
        Box::pin(SqlStore::list_runs(self, filter))
    }

    fn events_after<'a>(&'a self, run_id: &'a str, after_seq: u64) -> BoxFuture<'a, Result<Vec<StoredEvent>, StoreError>> {
        Box::pin(SqlStore::events_after(self, run_id, after_seq))
    }

    fn journal<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<JournalEntry>, StoreError>> {
        Box::pin(SqlStore::journal(self, run_id))
    }

    fn next_seq<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(SqlStore::next_seq(self, run_id))
    }

    fn claim_runs<'a>(&'a self, holder: &'a Holder, routes: &'a [String], limit: usize) -> BoxFuture<'a, Result<Vec<Claimed>, StoreError>> {
        Box::pin(SqlStore::claim_runs(self, holder, routes, limit))
    }

    fn claim_reply<'a>(&'a self, run_id: &'a str, holder: &'a Holder) -> BoxFuture<'a, Result<Option<Lease>, StoreError>> {
        Box::pin(SqlStore::claim_reply(self, run_id, holder))
    }

    fn reopen_reply<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.let_go(lease, "status = 'awaiting_input', "))
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<(), StoreError>> {
        // The token moves on: whatever the holder still writes is refused by the fence.
        Box::pin(self.let_go(lease, "lease_token = lease_token + 1, "))
    }

    fn request_cancel<'a>(&'a self, run_id: &'a str, reason: &'a str, holder: &'a Holder) -> BoxFuture<'a, Result<CancelAsk, StoreError>> {
        Box::pin(SqlStore::request_cancel(self, run_id, reason, holder))
    }

    fn cancel_requests<'a>(&'a self, holder: &'a Holder) -> BoxFuture<'a, Result<Vec<(Lease, String)>, StoreError>> {
        Box::pin(SqlStore::cancel_requests(self, holder))
    }

    fn pending_cancels(&self, limit: usize) -> BoxFuture<'_, Result<Vec<(String, String)>, StoreError>> {
        Box::pin(SqlStore::pending_cancels(self, limit))
    }

    fn prune<'a>(&'a self, cutoff: &'a str, limit: usize, dry_run: bool) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(SqlStore::prune(self, cutoff, limit, dry_run))
    }

    fn awaiting_since<'a>(&'a self, cutoff: &'a str, limit: usize) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(SqlStore::awaiting_since(self, cutoff, limit))
    }

    fn renew<'a>(&'a self, holder: &'a Holder, leases: &'a [Lease]) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(SqlStore::renew(self, holder, leases))
    }

    fn append<'a>(&'a self, lease: &'a Lease, batch: JournalBatch) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.queue.append(lease, batch))
    }

    fn commit<'a>(&'a self, lease: &'a Lease, batch: JournalBatch) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.queue.commit(lease, batch))
    }

    fn append_then<'a>(&'a self, lease: &'a Lease, batch: JournalBatch, durable: crate::exec::Durable) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.queue.append_then(lease, batch, durable))
    }

    fn put_catalogue<'a>(&'a self, version: &'a CatalogueVersion, sources: &'a Sources) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(SqlStore::put_catalogue(self, version, sources))
    }

    fn catalogue<'a>(&'a self, version: &'a CatalogueVersion) -> BoxFuture<'a, Result<Option<Sources>, StoreError>> {
        Box::pin(SqlStore::catalogue(self, version))
    }

    fn stranded_versions<'a>(&'a self, routes: &'a [String], limit: usize) -> BoxFuture<'a, Result<Vec<CatalogueVersion>, StoreError>> {
        Box::pin(SqlStore::stranded_versions(self, routes, limit))
    }

    fn move_catalogue<'a>(&'a self, lease: &'a Lease, version: &'a CatalogueVersion) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(SqlStore::move_catalogue(self, lease, version))
    }

    fn catalogue_versions<'a>(&'a self, prefix: &'a str, limit: usize) -> BoxFuture<'a, Result<Vec<CatalogueVersion>, StoreError>> {
        Box::pin(SqlStore::catalogue_versions(self, prefix, limit))
    }

    fn queued(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(SqlStore::queued(self))
    }

    fn health(&self) -> Result<(), StoreError> {
        self.health.check()
    }

    fn webhooks(&self) -> &dyn super::WebhookOutbox {
        self
    }

    fn experiments(&self) -> Option<&dyn super::experiments::ExperimentStore> {
        Some(self)
    }

    fn fleet(&self) -> Option<&dyn super::FleetBudget> {
        (self as &dyn std::any::Any).downcast_ref::<SqlStore<sqlx::Postgres>>().map(|s| s as &dyn super::FleetBudget)
    }

    fn schedules(&self) -> Option<&dyn super::schedules::ScheduleStore> {
        Some(self)
    }

    fn inbox(&self) -> Option<&dyn super::inbox::InboxStore> {
        Some(self)
    }

    fn push_configs(&self) -> Option<&dyn super::push::PushConfigStore> {
        Some(self)
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query("SELECT 1").execute(&self.pool).await.map_err(db)?;
            Ok(())
        })
    }
}
