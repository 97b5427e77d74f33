//! A fleet's shared budget of model calls, on PostgreSQL: each replica's share of every limited
//! model's limits, and the pauses a 429 put on a model.
//!
//! Each replica beats once a second (faster while it wants more than it holds): in one
//! transaction, under an advisory lock per fleet, it drops the rows of replicas whose beats
//! stopped (expired, on the database's clock), writes its demand, reads every live replica's,
//! and takes its fair share (water-filling: no replica gets more than it asks for while another
//! gets less; units nobody asks for are spread over all, so an idle replica can start a call at
//! once). It raises its grant only into units no other live row holds, and never records less
//! than its calls in flight: the recorded grants of live rows never add up past the limit, and
//! a replica that lowers its grant keeps holding what its calls in flight use until they end.
//! A call costs nothing here: the gate in the process counts it; only beats touch the store.

use std::time::Duration;

use sqlx::Row;

use super::StoreError;
use super::dialect::Dialect;
use super::sql::SqlStore;
use super::sql_error::db;
use crate::failure::BoxFuture;

/// A replica's demand of one model's budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareBeat {
    pub key: String,
    /// Calls waiting and in flight.
    pub demand: u32,
    pub in_flight: u32,
    /// The budget's units: the concurrency limit, or a fixed count for rates only.
    pub units: u32,
    /// Whether the units are calls in flight (a concurrency limit): then a replica is given no
    /// more than its demand; for rates only, any demand asks for the whole.
    pub concurrency: bool,
}

/// What a beat found: this replica's grant per key, and the pauses in force (remaining).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetView {
    pub grants: Vec<(String, u32)>,
    pub pauses: Vec<(String, Duration)>,
}

/// The port of a fleet's budget (PostgreSQL only: [`super::RunStore::fleet`]).
pub trait FleetBudget: std::fmt::Debug + Send + Sync {
    /// One heartbeat of `replica` in `fleet`, its rows kept alive for `lease`. Before a grant
    /// lower than the one recorded is committed, `lower(key, grant)` holds the replica to it
    /// and says its calls in flight then (recorded if more): no moment when another replica may
    /// use units this one still does. Raises take effect after the commit (the caller sets the
    /// view's grants).
    fn beat<'a>(
        &'a self,
        fleet: &'a str,
        replica: &'a str,
        lease: Duration,
        shares: &'a [ShareBeat],
        lower: &'a Lower<'a>,
    ) -> BoxFuture<'a, Result<FleetView, StoreError>>;
    /// A 429 paused `key` for `pause`: every replica of the fleet pauses it (told at once
    /// through `NOTIFY`, and at its next beat otherwise).
    fn pause<'a>(&'a self, fleet: &'a str, key: &'a str, pause: Duration) -> BoxFuture<'a, Result<(), StoreError>>;
    /// Forwards the fleet's pauses as other replicas record them, `(key, remaining)`, until the
    /// connection fails (the caller listens again).
    fn watch_pauses<'a>(&'a self, fleet: &'a str, tx: tokio::sync::mpsc::UnboundedSender<(String, Duration)>) -> BoxFuture<'a, Result<(), StoreError>>;
    /// A replica that stops gives its shares back at once.
    fn leave<'a>(&'a self, fleet: &'a str, replica: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// Holds a replica to a lower grant of a key at once; returns its calls in flight.
pub type Lower<'l> = dyn Fn(&str, u32) -> u32 + Send + Sync + 'l;

/// The channel of pause notifications; the payload is `fleet \t key \t remaining_ms`.
const PAUSE_CHANNEL: &str = "fabric_llm_pause";

/// Fair shares of `units` among replicas asking `caps` (in replica order): water-filling, then
/// what nobody asked for spread over all of them, round-robin from the first.
pub fn water_fill(units: u32, caps: &[u32]) -> Vec<u32> {
    let mut out = vec![0u32; caps.len()];
    if caps.is_empty() {
        return out;
    }
    let mut left = units;
    loop {
        let hungry: Vec<usize> = (0..caps.len()).filter(|i| out[*i] < caps[*i]).collect();
        if hungry.is_empty() || left == 0 {
            break;
        }
        let each = (left / hungry.len() as u32).max(1);
        for i in hungry {
            if left == 0 {
                break;
            }
            let give = each.min(caps[i] - out[i]).min(left);
            out[i] += give;
            left -= give;
        }
    }
    let n = caps.len();
    for i in 0..left as usize {
        out[i % n] += 1;
    }
    out
}

/// This replica's grant: its target, raised only into units no other live row holds, and
/// recorded (the second value) never below its calls in flight.
pub fn next_grant(target: u32, held_by_others: u32, units: u32, in_flight: u32) -> (u32, u32) {
    let free = units.saturating_sub(held_by_others);
    let grant = target.min(free);
    (grant, grant.max(in_flight))
}

impl FleetBudget for SqlStore<sqlx::Postgres> {
    fn beat<'a>(
        &'a self,
        fleet: &'a str,
        replica: &'a str,
        lease: Duration,
        shares: &'a [ShareBeat],
        lower: &'a Lower<'a>,
    ) -> BoxFuture<'a, Result<FleetView, StoreError>> {
        Box::pin(async move {
            let now_ms = <sqlx::Postgres as Dialect>::NOW_MS;
            let mut tx = self.pool_ref().begin().await.map_err(db)?;
            sqlx::query("SELECT pg_advisory_xact_lock(hashtext('fabric_llm_shares'), hashtext($1))").bind(fleet).execute(&mut *tx).await.map_err(db)?;
            let sql = format!("DELETE FROM llm_shares WHERE fleet = $1 AND expires_ms < {now_ms}");
            sqlx::query(sqlx::AssertSqlSafe(sql)).bind(fleet).execute(&mut *tx).await.map_err(db)?;
            let keys: Vec<&str> = shares.iter().map(|s| s.key.as_str()).collect();
            sqlx::query("DELETE FROM llm_shares WHERE fleet = $1 AND replica = $2 AND NOT (model_key = ANY($3))")
                .bind(fleet)
                .bind(replica)
                .bind(&keys)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            let lease_ms = lease.as_millis() as i64;
            for s in shares {
                let sql = format!(
                    "INSERT INTO llm_shares (fleet, model_key, replica, demand, granted, expires_ms) VALUES ($1, $2, $3, $4, $5, {now_ms} + $6) \
                     ON CONFLICT (fleet, model_key, replica) DO UPDATE SET demand = EXCLUDED.demand, expires_ms = EXCLUDED.expires_ms"
                );
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(fleet)
                    .bind(&s.key)
                    .bind(replica)
                    .bind(i64::from(s.demand))
                    .bind(i64::from(s.in_flight))
                    .bind(lease_ms)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
            }
            let rows =
                sqlx::query("SELECT model_key, replica, demand, granted FROM llm_shares WHERE fleet = $1 AND model_key = ANY($2) ORDER BY model_key, replica")
                    .bind(fleet)
                    .bind(&keys)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(db)?;
            let mut grants = Vec::with_capacity(shares.len());
            for s in shares {
                let of_key: Vec<(String, u32, u32)> = rows
                    .iter()
                    .filter(|r| r.get::<String, _>("model_key") == s.key)
                    .map(|r| (r.get::<String, _>("replica"), clamp(r.get("demand")), clamp(r.get("granted"))))
                    .collect();
                let caps: Vec<u32> = of_key
                    .iter()
                    .map(|(_, d, _)| {
                        if s.concurrency {
                            (*d).min(s.units)
                        } else if *d > 0 {
                            s.units
                        } else {
                            0
                        }
                    })
                    .collect();
                let targets = water_fill(s.units, &caps);
                let me = of_key.iter().position(|(r, _, _)| r == replica);
                let target = me.map_or(0, |i| targets[i]);
                let held = me.map_or(0, |i| of_key[i].2);
                let others: u32 = of_key.iter().filter(|(r, _, _)| r != replica).map(|(_, _, g)| *g).sum();
                let (grant, _) = next_grant(target, others, s.units, s.in_flight);
                // Lowered here first, so the calls in flight read after it cannot grow.
                let in_flight = if grant < held { lower(&s.key, grant) } else { s.in_flight };
                let recorded = grant.max(in_flight);
                sqlx::query("UPDATE llm_shares SET granted = $4 WHERE fleet = $1 AND model_key = $2 AND replica = $3")
                    .bind(fleet)
                    .bind(&s.key)
                    .bind(replica)
                    .bind(i64::from(recorded))
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
                grants.push((s.key.clone(), grant));
            }
            let sql = format!("SELECT model_key, until_ms - {now_ms} AS left_ms FROM llm_pauses WHERE fleet = $1 AND until_ms > {now_ms}");
            let pauses = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(fleet)
                .fetch_all(&mut *tx)
                .await
                .map_err(db)?
                .iter()
                .map(|r| (r.get::<String, _>("model_key"), Duration::from_millis(r.get::<i64, _>("left_ms").max(0) as u64)))
                .collect();
            tx.commit().await.map_err(db)?;
            Ok(FleetView { grants, pauses })
        })
    }

    fn pause<'a>(&'a self, fleet: &'a str, key: &'a str, pause: Duration) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let now_ms = <sqlx::Postgres as Dialect>::NOW_MS;
            let ms = pause.as_millis() as i64;
            let sql = format!(
                "WITH p AS (INSERT INTO llm_pauses (fleet, model_key, until_ms) VALUES ($1, $2, {now_ms} + $3) \
                 ON CONFLICT (fleet, model_key) DO UPDATE SET until_ms = GREATEST(llm_pauses.until_ms, EXCLUDED.until_ms) RETURNING 1) \
                 SELECT pg_notify($4, $1 || chr(9) || $2 || chr(9) || CAST($3 AS TEXT)) FROM p"
            );
            sqlx::query(sqlx::AssertSqlSafe(sql)).bind(fleet).bind(key).bind(ms).bind(PAUSE_CHANNEL).execute(self.pool_ref()).await.map_err(db)?;
            Ok(())
        })
    }

    fn watch_pauses<'a>(&'a self, fleet: &'a str, tx: tokio::sync::mpsc::UnboundedSender<(String, Duration)>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut listener = sqlx::postgres::PgListener::connect_with(self.pool_ref()).await.map_err(db)?;
            listener.listen(PAUSE_CHANNEL).await.map_err(db)?;
            loop {
                let n = listener.recv().await.map_err(db)?;
                let mut parts = n.payload().split('\t');
                let (Some(f), Some(key), Some(ms)) = (parts.next(), parts.next(), parts.next()) else { continue };
                let Ok(ms) = ms.parse::<u64>() else { continue };
                if f == fleet && tx.send((key.to_owned(), Duration::from_millis(ms))).is_err() {
                    return Ok(());
                }
            }
        })
    }

    fn leave<'a>(&'a self, fleet: &'a str, replica: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query("DELETE FROM llm_shares WHERE fleet = $1 AND replica = $2").bind(fleet).bind(replica).execute(self.pool_ref()).await.map_err(db)?;
            Ok(())
        })
    }
}

fn clamp(v: i64) -> u32 {
    v.clamp(0, i64::from(u32::MAX)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_fair_and_never_exceed_the_units() {
        assert_eq!(water_fill(10, &[10, 10]), [5, 5]);
        assert_eq!(water_fill(10, &[2, 10]), [2, 8], "what one does not ask for goes to the other");
        assert_eq!(water_fill(10, &[0, 0]), [5, 5], "idle replicas each hold some, to start at once");
        assert_eq!(water_fill(3, &[3, 3]), [2, 1]);
        assert_eq!(water_fill(7, &[1, 1, 1]), [3, 2, 2]);
        assert_eq!(water_fill(5, &[]), Vec::<u32>::new());
        for units in [1, 2, 3, 7, 100] {
            for caps in [vec![0, 5, 9], vec![1, 1], vec![100, 0, 3, 4]] {
                assert_eq!(water_fill(units, &caps).iter().sum::<u32>(), units, "{units} {caps:?}");
            }
        }
    }

    #[test]
    fn a_grant_rises_only_into_free_units_and_records_calls_in_flight() {
        // The other replica still records 6 of 10: this one gets 4, not its target of 5.
        assert_eq!(next_grant(5, 6, 10, 0), (4, 4));
        // Lowered to 2 while 4 calls are in flight: 4 stay recorded until they end.
        assert_eq!(next_grant(2, 5, 10, 4), (2, 4));
        assert_eq!(next_grant(5, 12, 10, 0), (0, 0));
    }
}
