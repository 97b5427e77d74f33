//! A run's inbox (issue 52): messages for a run that was not asking when they came (an A2A
//! message to a `working` task), behind the [`InboxStore`] port. A message is kept in the order
//! it came, once per sender's message id, and only while its run has not ended: the insert reads
//! the run's status in the same statement. When the run asks, the oldest message not taken is
//! its reply: [`InboxStore::claim_queued_reply`] claims the run to go on and marks the message
//! taken in one transaction, so a run claimed so has its reply with it; a message taken whose
//! reply was never recorded (the replica died first, and the run asks again) waits again.
//! Who looks: the replica whose run just asked, and every replica's cancel watcher
//! ([`InboxStore::runs_with_waiting_messages`], never-taken messages only: a cheap look) for a
//! run that asked while its message was being queued, or whose replica died in between.

use std::time::Instant;

use sqlx::Row;

use super::dialect::Dialect;
use super::reads::impossible;
use super::sql::SqlStore;
use super::sql_error::{db, write_error};
use super::{Holder, Lease, StoreError, StoredStatus, now};
use crate::failure::BoxFuture;

/// A message `i` of an asking run waits: never taken, or taken for a question the run never
/// recorded a reply to (no `run.resumed` at or after `taken_for`: its replica died between the
/// claim and the record, and the run asks again).
const WAITING: &str = "(i.taken_at IS NULL OR NOT EXISTS \
     (SELECT 1 FROM run_events e WHERE e.run_id = i.run_id AND e.seq >= i.taken_for AND e.kind = 'run.resumed'))";

/// The most messages that may wait for one run: each is at most a goal's size, so a run's inbox
/// stays small (a client that sends more is told to wait for the run to ask).
pub const MAX_WAITING: i64 = 32;

/// What queueing a message did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Queued {
    /// It waits for the run's next question.
    Queued,
    /// A message of that id and text was queued for the run before: nothing more was.
    Again,
    /// A message of that id but another text was queued for the run before: nothing was.
    Reused,
    /// `MAX_WAITING` messages wait for the run already: nothing was queued.
    Full,
    /// The run ended (or does not exist: `None`): it takes no more messages.
    Ended(Option<StoredStatus>),
}

/// A message as kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxMessage {
    pub message_id: String,
    pub text: String,
    pub created_at: String,
    /// When it became the reply to a question; `None`: it still waits.
    pub taken_at: Option<String>,
}

/// The inboxes of runs, in the run store's database.
pub trait InboxStore: Send + Sync {
    /// Queues `text` for run `run_id`, unless the run ended or `message_id` was queued for it.
    fn queue_message<'a>(&'a self, run_id: &'a str, message_id: &'a str, text: &'a str) -> BoxFuture<'a, Result<Queued, StoreError>>;
    /// Claims run `run_id` for `holder` to go on, if it awaits input, has no cancel request and
    /// a message waits for it: the oldest such message is taken, as its reply, in the same
    /// transaction. `None`: not so.
    fn claim_queued_reply<'a>(&'a self, run_id: &'a str, holder: &'a Holder) -> BoxFuture<'a, Result<Option<(Lease, String)>, StoreError>>;
    /// The message last taken for `run_id` waits again (the run it was to continue was not).
    fn put_back<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;
    /// Runs that await input while a message waits for them, oldest message first.
    fn runs_with_waiting_messages(&self, limit: usize) -> BoxFuture<'_, Result<Vec<String>, StoreError>>;
    /// The messages queued for `run_id`, in order, taken or not.
    fn messages<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<InboxMessage>, StoreError>>;
}

impl<DB> InboxStore for SqlStore<DB>
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
    fn queue_message<'a>(&'a self, run_id: &'a str, message_id: &'a str, text: &'a str) -> BoxFuture<'a, Result<Queued, StoreError>> {
        Box::pin(async move {
            self.health_ref().check()?;
            if impossible(run_id) {
                return Ok(Queued::Ended(None));
            }
            let began = Instant::now();
            // The run's status and its waiting messages are read by the insert itself: a
            // message is never kept for a run that had ended, nor past `MAX_WAITING`. (SQLite
            // wants a WHERE on the SELECT before an ON CONFLICT.)
            let inserted = sqlx::query(
                "INSERT INTO run_inbox (run_id, message_id, text, created_at) SELECT $1, $2, $3, $4 WHERE EXISTS \
                 (SELECT 1 FROM runs WHERE run_id = $1 AND status IN ('queued', 'running', 'awaiting_input')) \
                 AND (SELECT COUNT(*) FROM run_inbox WHERE run_id = $1 AND taken_at IS NULL) < $5 \
                 ON CONFLICT (run_id, message_id) DO NOTHING RETURNING queued_seq",
            )
            .bind(run_id)
            .bind(message_id)
            .bind(text)
            .bind(now())
            .bind(MAX_WAITING)
            .fetch_optional(self.pool_ref())
            .await
            .map_err(|e| write_error(self.health_ref(), began, e))?;
            if inserted.is_some() {
                return Ok(Queued::Queued);
            }
            let before = sqlx::query("SELECT text FROM run_inbox WHERE run_id = $1 AND message_id = $2")
                .bind(run_id)
                .bind(message_id)
                .fetch_optional(self.pool_ref())
                .await
                .map_err(db)?;
            if let Some(row) = before {
                let was: String = row.try_get("text").map_err(db)?;
                return Ok(if was == text { Queued::Again } else { Queued::Reused });
            }
            match SqlStore::get_run(self, run_id).await?.map(|r| r.status) {
                Some(StoredStatus::Queued | StoredStatus::Running | StoredStatus::AwaitingInput) => Ok(Queued::Full),
                ended => Ok(Queued::Ended(ended)),
            }
        })
    }

    fn claim_queued_reply<'a>(&'a self, run_id: &'a str, holder: &'a Holder) -> BoxFuture<'a, Result<Option<(Lease, String)>, StoreError>> {
        Box::pin(async move {
            self.health_ref().check()?;
            if impossible(run_id) {
                return Ok(None);
            }
            let began = Instant::now();
            let mut tx = self.pool_ref().begin().await.map_err(db)?;
            // The claim first: on SQLite the transaction's first statement is then a write,
            // which waits for the writer's lock (a read first would fail the upgrade at once).
            let sql = super::claims::reply_claim::<DB>(&format!(
                " AND cancel_reason IS NULL AND EXISTS (SELECT 1 FROM run_inbox i WHERE i.run_id = $4 AND {WAITING})"
            ));
            let claimed = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(holder.owner.as_str())
                .bind(holder.lease_ms())
                .bind(now())
                .bind(run_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| write_error(self.health_ref(), began, e))?;
            let Some(row) = claimed else { return Ok(None) };
            let lease = Lease::new(run_id.to_owned(), row.try_get("lease_token").map_err(db)?);
            let next_seq: i64 = row.try_get("next_seq").map_err(db)?;
            let sql = format!(
                "UPDATE run_inbox SET taken_at = $1, taken_for = $2 WHERE queued_seq = \
                 (SELECT MIN(queued_seq) FROM run_inbox i WHERE i.run_id = $3 AND {WAITING}) RETURNING text"
            );
            let taken = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(now())
                .bind(next_seq)
                .bind(run_id)
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| write_error(self.health_ref(), began, e))?;
            let text: String = taken.try_get("text").map_err(db)?;
            tx.commit().await.map_err(|e| write_error(self.health_ref(), began, e))?;
            Ok(Some((lease, text)))
        })
    }

    fn put_back<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let began = Instant::now();
            sqlx::query(
                "UPDATE run_inbox SET taken_at = NULL WHERE queued_seq = \
                 (SELECT MAX(queued_seq) FROM run_inbox WHERE run_id = $1 AND taken_at IS NOT NULL)",
            )
            .bind(run_id)
            .execute(self.pool_ref())
            .await
            .map_err(|e| write_error(self.health_ref(), began, e))?;
            Ok(())
        })
    }

    fn runs_with_waiting_messages(&self, limit: usize) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query(
                "SELECT i.run_id FROM run_inbox i JOIN runs r ON r.run_id = i.run_id \
                 WHERE i.taken_at IS NULL AND r.status = 'awaiting_input' AND r.cancel_reason IS NULL \
                 GROUP BY i.run_id ORDER BY MIN(i.queued_seq) LIMIT $1",
            )
            .bind(limit.clamp(1, 1000) as i64)
            .fetch_all(self.pool_ref())
            .await
            .map_err(db)?;
            rows.iter().map(|r| r.try_get(0).map_err(db)).collect()
        })
    }

    fn messages<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<InboxMessage>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query("SELECT message_id, text, created_at, taken_at FROM run_inbox WHERE run_id = $1 ORDER BY queued_seq")
                .bind(run_id)
                .fetch_all(self.pool_ref())
                .await
                .map_err(db)?;
            rows.iter()
                .map(|r| {
                    Ok(InboxMessage {
                        message_id: r.try_get("message_id").map_err(db)?,
                        text: r.try_get("text").map_err(db)?,
                        created_at: r.try_get("created_at").map_err(db)?,
                        taken_at: r.try_get("taken_at").map_err(db)?,
                    })
                })
                .collect()
        })
    }
}
