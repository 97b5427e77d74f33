//! The webhook outbox: the deliveries of runs accepted with a webhook URL. A row is added by the
//! writers (`sqlite_writer`, `pool_writer`) in the transaction that ends the run or makes it ask (the
//! fence, the one statement that does); a sender claims the due rows under a lease (any process of the store: a dead sender's rows come due again when its lease expires),
//! makes one attempt each and records it. Delivery is at least once: a sender that dies between
//! its POST and the record of it is followed by another POST, with the same `webhook-id`.

use std::time::Duration;

use sqlx::Row;

use super::dialect::{Dialect, rows_sql};
use super::reads::{RUN_COLUMNS, run_of};
use super::sql::SqlStore;
use super::sql_error::db;
use super::{Holder, StoreError, StoredRun};
use crate::failure::BoxFuture;

/// A delivery claimed by a sender: the run as it was when the row was added.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// The outbox row.
    pub id: i64,
    /// Where it goes (the URL as the run was accepted with it: it may carry a secret).
    pub url: String,
    /// Attempts made before this one.
    pub attempts: u32,
    /// The run then: its status, result, reason class and question as the end or the question
    /// left them, and `updated_at` the time of that change.
    pub run: StoredRun,
    /// The A2A push notification config it is for (its body is then A2A's), or `None`: the
    /// run's own webhook.
    pub push: Option<super::push::PushConfig>,
}

impl Delivery {
    /// The `webhook-id`: the same on every attempt, unique in the store.
    pub fn webhook_id(&self) -> String {
        webhook_id(self.id, &self.run.run_id)
    }
}

fn webhook_id(id: i64, run_id: &str) -> String {
    format!("msg_{}_{id}", run_id.replace('-', ""))
}

/// What one attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// A 2xx answer.
    Delivered { status: u16 },
    /// A non-2xx answer (`status`), a timeout or a connection error (`status: None`); `retry_in`
    /// is when to try again, `None` when no attempt is left.
    Failed { status: Option<u16>, error: String, retry_in: Option<Duration> },
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Not sent yet, or to be tried again.
    Pending,
    Delivered,
    /// Every attempt failed.
    Failed,
}

impl DeliveryState {
    fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Option<DeliveryState> {
        [DeliveryState::Pending, DeliveryState::Delivered, DeliveryState::Failed].into_iter().find(|d| d.as_str() == s)
    }
}

/// A delivery as `GET /v1/runs/{id}/webhooks` tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRecord {
    pub webhook_id: String,
    /// The run's status the delivery tells (`completed`, `failed`, `cancelled`, `awaiting_input`).
    pub status: String,
    pub url: String,
    pub state: DeliveryState,
    pub attempts: u32,
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
    /// When the run's status changed (the delivery's `timestamp`).
    pub at: String,
    /// When the next attempt is due (milliseconds since the epoch), while pending after a
    /// failed attempt.
    pub next_attempt_ms: Option<i64>,
    /// When it was delivered, or given up.
    pub done_at: Option<String>,
    /// The A2A push notification config it is for, if it is for one.
    pub push_config: Option<String>,
}

/// The outbox's port: claims, the record of attempts, and a run's deliveries.
pub trait WebhookOutbox: std::fmt::Debug + Send + Sync {
    /// Claims up to `limit` deliveries that are due (and not claimed by a live lease), for
    /// `holder`'s lease, none to the origins in `skip` (`scheme://host[:port]`, as
    /// `url::Origin::ascii_serialization` writes them); none while the store's writes fail.
    fn claim_deliveries<'a>(&'a self, holder: &'a Holder, limit: usize, skip: &'a [String]) -> BoxFuture<'a, Result<Vec<Delivery>, StoreError>>;
    /// Records an attempt on a delivery `holder` claimed; false if its claim was lost (another
    /// sender claimed it after the lease expired: that one's attempt is the one recorded). A
    /// delivery is recorded delivered whoever holds it, while it is pending: a 2xx is final.
    fn record_attempt<'a>(&'a self, holder: &'a Holder, id: i64, attempt: &'a Attempt) -> BoxFuture<'a, Result<bool, StoreError>>;
    /// A run's deliveries, oldest first.
    fn deliveries<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<DeliveryRecord>, StoreError>>;
}

impl<DB> WebhookOutbox for SqlStore<DB>
where
    DB: sqlx::Database + Dialect,
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
    fn claim_deliveries<'a>(&'a self, holder: &'a Holder, limit: usize, skip: &'a [String]) -> BoxFuture<'a, Result<Vec<Delivery>, StoreError>> {
        Box::pin(async move {
            if limit == 0 || self.health_ref().failing() {
                return Ok(Vec::new());
            }
            let now_ms = DB::NOW_MS;
            // A URL of an origin starts with the origin and a `/` (the URL parser wrote both),
            // so a prefix, compared by length, tells it without parsing URLs in SQL; ASCII, so
            // characters are bytes on both databases.
            let skipped: String = skip.iter().enumerate().map(|(i, o)| format!(" AND substr(url, 1, {}) <> ${}", o.len() + 1, i + 4)).collect();
            let claim = format!(
                "UPDATE run_webhooks SET lease_owner = $1, lease_until = {now_ms} + $2 WHERE id IN (SELECT id FROM run_webhooks \
                 WHERE state = 'pending' AND next_attempt_ms <= {now_ms} AND lease_until < {now_ms}{skipped} ORDER BY next_attempt_ms, id LIMIT $3{}) \
                 RETURNING id",
                DB::SKIP_LOCKED
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(claim)).bind(holder.owner.as_str()).bind(holder.lease_ms()).bind(limit.min(1000) as i64);
            for origin in skip {
                q = q.bind(format!("{origin}/"));
            }
            let ids: Vec<i64> = q.fetch_all(self.pool_ref()).await.map_err(db)?.iter().map(|r| r.try_get(0)).collect::<Result<_, _>>().map_err(db)?;
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            // The run's columns, with the row's snapshot in place of what changed since.
            let columns = RUN_COLUMNS
                .split(", ")
                .map(|c| match c {
                    "status" | "result" | "reason_class" | "question" => format!("w.{c}"),
                    "updated_at" => "w.at AS updated_at".to_owned(),
                    other => format!("r.{other}"),
                })
                .collect::<Vec<_>>()
                .join(", ");
            // A push config's row carries the config (its token and `Authorization`): one
            // deleted since is given up below.
            let sql = format!(
                "SELECT w.id, w.url, w.attempts, w.push_config, p.run_id AS push_run_id, p.config_id AS push_config_id, w.url AS push_url, p.token AS push_token, \
                 p.auth_scheme AS push_auth_scheme, p.auth_credentials AS push_auth_credentials, p.legacy AS push_legacy, {columns} \
                 FROM run_webhooks w JOIN runs r ON r.run_id = w.run_id \
                 LEFT JOIN a2a_push_configs p ON p.run_id = w.run_id AND p.config_id = w.push_config WHERE w.id IN ({}) ORDER BY w.id",
                rows_sql("", "?", ids.len(), 1, true)
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for id in &ids {
                q = q.bind(*id);
            }
            let rows = q.fetch_all(self.pool_ref()).await.map_err(db)?;
            let mut deliveries = Vec::with_capacity(rows.len());
            for row in &rows {
                let id: i64 = row.try_get("id").map_err(db)?;
                let push = push_of(row)?;
                if let Push::Deleted = push {
                    let given_up = Attempt::Failed { status: None, error: "its push notification config was deleted".into(), retry_in: None };
                    self.record_attempt(holder, id, &given_up).await?;
                    continue;
                }
                match run_of(row) {
                    Ok(run) => deliveries.push(Delivery {
                        id,
                        url: row.try_get("url").map_err(db)?,
                        attempts: row.try_get::<i64, _>("attempts").map_err(db)?.clamp(0, i64::from(u32::MAX)) as u32,
                        push: match push {
                            Push::Config(c) => Some(c),
                            Push::Webhook | Push::Deleted => None,
                        },
                        run,
                    }),
                    // A run whose row does not read has no payload to send: its delivery is
                    // given up with why, so that it holds no other delivery back.
                    Err(e) => {
                        tracing::error!(delivery = id, error = %e, "webhooks: a delivery given up, its run does not read");
                        let given_up = Attempt::Failed { status: None, error: e.to_string(), retry_in: None };
                        self.record_attempt(holder, id, &given_up).await?;
                    }
                }
            }
            Ok(deliveries)
        })
    }

    fn record_attempt<'a>(&'a self, holder: &'a Holder, id: i64, attempt: &'a Attempt) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let (state, status, error, retry_ms) = match attempt {
                Attempt::Delivered { status } => (DeliveryState::Delivered, Some(*status), None, 0),
                Attempt::Failed { status, error, retry_in: Some(after) } => {
                    (DeliveryState::Pending, *status, Some(error.as_str()), after.as_millis().min(i64::MAX as u128) as i64)
                }
                Attempt::Failed { status, error, retry_in: None } => (DeliveryState::Failed, *status, Some(error.as_str()), 0),
            };
            let done_at = (state != DeliveryState::Pending).then(super::now);
            let sql = format!(
                "UPDATE run_webhooks SET attempts = attempts + 1, state = $1, last_status = $2, last_error = $3, \
                 next_attempt_ms = {} + $4, lease_owner = NULL, lease_until = 0, done_at = $5 WHERE id = $6 AND state = 'pending' AND (lease_owner = $7 OR $1 = 'delivered') RETURNING id",
                DB::NOW_MS
            );
            let done = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(state.as_str())
                .bind(status.map(i64::from))
                .bind(error)
                .bind(retry_ms)
                .bind(done_at.as_deref())
                .bind(id)
                .bind(holder.owner.as_str())
                .fetch_optional(self.pool_ref())
                .await
                .map_err(db)?;
            Ok(done.is_some())
        })
    }

    fn deliveries<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<DeliveryRecord>, StoreError>> {
        Box::pin(async move {
            if run_id.contains('\0') {
                return Ok(Vec::new());
            }
            let sql = "SELECT id, run_id, status, url, state, attempts, last_status, last_error, at, next_attempt_ms, done_at, push_config \
                       FROM run_webhooks WHERE run_id = $1 ORDER BY id";
            let rows = sqlx::query(sql).bind(run_id).fetch_all(self.pool_ref()).await.map_err(db)?;
            rows.iter()
                .map(|row| {
                    let text = |k: &str| row.try_get::<String, _>(k).map_err(db);
                    let state = text("state")?;
                    let state = DeliveryState::parse(&state).ok_or_else(|| StoreError::Database(format!("unknown webhook state `{state}` in the store")))?;
                    Ok(DeliveryRecord {
                        webhook_id: webhook_id(row.try_get("id").map_err(db)?, &text("run_id")?),
                        status: text("status")?,
                        url: text("url")?,
                        state,
                        attempts: row.try_get::<i64, _>("attempts").map_err(db)?.clamp(0, i64::from(u32::MAX)) as u32,
                        last_status: row.try_get::<Option<i64>, _>("last_status").map_err(db)?.and_then(|s| u16::try_from(s).ok()),
                        last_error: row.try_get("last_error").map_err(db)?,
                        at: text("at")?,
                        next_attempt_ms: {
                            let attempts: i64 = row.try_get("attempts").map_err(db)?;
                            (state == DeliveryState::Pending && attempts > 0).then(|| row.try_get("next_attempt_ms")).transpose().map_err(db)?
                        },
                        done_at: row.try_get("done_at").map_err(db)?,
                        push_config: row.try_get("push_config").map_err(db)?,
                    })
                })
                .collect()
        })
    }
}

/// What a claimed row is for.
enum Push {
    /// The run's own webhook.
    Webhook,
    /// An A2A push config.
    Config(super::push::PushConfig),
    /// A push config deleted since the row was added.
    Deleted,
}

fn push_of<R: Row>(row: &R) -> Result<Push, StoreError>
where
    for<'r> &'r str: sqlx::ColumnIndex<R>,
    for<'t> String: sqlx::Decode<'t, R::Database> + sqlx::Type<R::Database>,
    for<'t> i64: sqlx::Decode<'t, R::Database> + sqlx::Type<R::Database>,
{
    if row.try_get::<Option<String>, _>("push_config").map_err(db)?.is_none() {
        return Ok(Push::Webhook);
    }
    if row.try_get::<Option<String>, _>("push_config_id").map_err(db)?.is_none() {
        return Ok(Push::Deleted);
    }
    super::push::config_of(row, "push_").map(Push::Config)
}
