//! Experiments kept in the store (issue 51): an experiment's row (its name, its dataset as read,
//! its last report) and the runs of its cases (`experiment_runs`: case, repeat, run). The runs
//! themselves are ordinary runs, written by the writer like any other; these rows only tag them,
//! so they are statements on the pool, outside the write queue.

use sqlx::Row;

use super::dialect::Dialect;
use super::sql::SqlStore;
use super::sql_error::{db, write_error};
use super::{StoreError, now};
use crate::failure::BoxFuture;

/// An experiment as kept.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredExperiment {
    pub experiment_id: String,
    pub name: String,
    /// The dataset's file, as it was named.
    pub dataset: String,
    /// The dataset as it was read (what `regrade` grades with unless given another).
    pub dataset_text: String,
    pub created_at: String,
    /// The last grading's report, as JSON.
    pub report: Option<String>,
}

/// One run of a case of an experiment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseRun {
    pub case_id: String,
    /// 0 to `--repeat` − 1.
    pub repeat: u32,
    pub run_id: String,
    /// A partial re-run's first stage run live (the stages before it came from a journal).
    pub started_from: Option<String>,
}

/// The experiments' port ([`super::RunStore::experiments`]).
pub trait ExperimentStore: Send + Sync {
    /// Keeps a new experiment (its report none yet).
    fn put_experiment<'a>(&'a self, experiment: &'a StoredExperiment) -> BoxFuture<'a, Result<(), StoreError>>;
    /// Tags `run` as a run of `experiment_id`.
    fn add_case_run<'a>(&'a self, experiment_id: &'a str, run: &'a CaseRun) -> BoxFuture<'a, Result<(), StoreError>>;
    /// Keeps `report` as the experiment's last.
    fn set_report<'a>(&'a self, experiment_id: &'a str, report: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;
    fn experiment<'a>(&'a self, experiment_id: &'a str) -> BoxFuture<'a, Result<Option<StoredExperiment>, StoreError>>;
    /// Its case runs, by case then repeat.
    fn case_runs<'a>(&'a self, experiment_id: &'a str) -> BoxFuture<'a, Result<Vec<CaseRun>, StoreError>>;
    /// The newest `limit` experiments (their dataset texts and reports left out).
    fn list_experiments(&self, limit: u32) -> BoxFuture<'_, Result<Vec<StoredExperiment>, StoreError>>;
    /// The verdict (JSON) judge `key` gave run `run_id`, with the tokens it cost.
    fn judgement<'a>(&'a self, run_id: &'a str, key: &'a str) -> BoxFuture<'a, Result<Option<(String, u64)>, StoreError>>;
    /// Keeps a judge's verdict on a run (the first one kept stays).
    fn put_judgement<'a>(&'a self, run_id: &'a str, key: &'a str, verdict: &'a str, tokens: u64) -> BoxFuture<'a, Result<(), StoreError>>;
}

impl<DB> ExperimentStore for SqlStore<DB>
where
    DB: sqlx::Database + Dialect,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'t> &'t str: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> String: sqlx::Encode<'t, DB> + sqlx::Decode<'t, DB> + sqlx::Type<DB>,
    for<'t> Option<&'t str>: sqlx::Encode<'t, DB>,
    for<'t> i64: sqlx::Encode<'t, DB> + sqlx::Decode<'t, DB> + sqlx::Type<DB>,
    for<'r> &'r str: sqlx::ColumnIndex<DB::Row>,
{
    fn put_experiment<'a>(&'a self, e: &'a StoredExperiment) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.health_ref().check()?;
            let began = std::time::Instant::now();
            sqlx::query("INSERT INTO experiments (experiment_id, name, dataset, dataset_text, created_at, report) VALUES ($1, $2, $3, $4, $5, NULL)")
                .bind(e.experiment_id.as_str())
                .bind(e.name.as_str())
                .bind(e.dataset.as_str())
                .bind(e.dataset_text.as_str())
                .bind(now())
                .execute(self.pool_ref())
                .await
                .map_err(|err| write_error(self.health_ref(), began, err))?;
            Ok(())
        })
    }

    fn add_case_run<'a>(&'a self, experiment_id: &'a str, run: &'a CaseRun) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let began = std::time::Instant::now();
            sqlx::query("INSERT INTO experiment_runs (experiment_id, case_id, repeat_idx, run_id, started_from) VALUES ($1, $2, $3, $4, $5)")
                .bind(experiment_id)
                .bind(run.case_id.as_str())
                .bind(i64::from(run.repeat))
                .bind(run.run_id.as_str())
                .bind(run.started_from.as_deref())
                .execute(self.pool_ref())
                .await
                .map_err(|err| write_error(self.health_ref(), began, err))?;
            Ok(())
        })
    }

    fn set_report<'a>(&'a self, experiment_id: &'a str, report: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let began = std::time::Instant::now();
            sqlx::query("UPDATE experiments SET report = $1 WHERE experiment_id = $2")
                .bind(report)
                .bind(experiment_id)
                .execute(self.pool_ref())
                .await
                .map_err(|err| write_error(self.health_ref(), began, err))?;
            Ok(())
        })
    }

    fn experiment<'a>(&'a self, experiment_id: &'a str) -> BoxFuture<'a, Result<Option<StoredExperiment>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query("SELECT experiment_id, name, dataset, dataset_text, created_at, report FROM experiments WHERE experiment_id = $1")
                .bind(experiment_id)
                .fetch_optional(self.pool_ref())
                .await
                .map_err(db)?;
            row.map(|r| experiment_of(&r)).transpose()
        })
    }

    fn case_runs<'a>(&'a self, experiment_id: &'a str) -> BoxFuture<'a, Result<Vec<CaseRun>, StoreError>> {
        Box::pin(async move {
            let rows =
                sqlx::query("SELECT case_id, repeat_idx, run_id, started_from FROM experiment_runs WHERE experiment_id = $1 ORDER BY case_id, repeat_idx")
                    .bind(experiment_id)
                    .fetch_all(self.pool_ref())
                    .await
                    .map_err(db)?;
            rows.iter()
                .map(|r| {
                    let repeat: i64 = r.try_get("repeat_idx").map_err(db)?;
                    Ok(CaseRun {
                        case_id: r.try_get("case_id").map_err(db)?,
                        repeat: u32::try_from(repeat).map_err(|_| StoreError::Database(format!("experiment {experiment_id}: a repeat of {repeat}")))?,
                        run_id: r.try_get("run_id").map_err(db)?,
                        started_from: r.try_get("started_from").map_err(db)?,
                    })
                })
                .collect()
        })
    }

    fn list_experiments(&self, limit: u32) -> BoxFuture<'_, Result<Vec<StoredExperiment>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query(
                "SELECT experiment_id, name, dataset, '' AS dataset_text, created_at, CAST(NULL AS TEXT) AS report FROM experiments ORDER BY experiment_id DESC LIMIT $1",
            )
            .bind(i64::from(limit.min(1000)))
            .fetch_all(self.pool_ref())
            .await
            .map_err(db)?;
            rows.iter().map(experiment_of).collect()
        })
    }

    fn judgement<'a>(&'a self, run_id: &'a str, key: &'a str) -> BoxFuture<'a, Result<Option<(String, u64)>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query("SELECT verdict, tokens FROM judgements WHERE run_id = $1 AND judge_key = $2")
                .bind(run_id)
                .bind(key)
                .fetch_optional(self.pool_ref())
                .await
                .map_err(db)?;
            row.map(|r| {
                let tokens: i64 = r.try_get("tokens").map_err(db)?;
                Ok((r.try_get("verdict").map_err(db)?, u64::try_from(tokens).unwrap_or(0)))
            })
            .transpose()
        })
    }

    fn put_judgement<'a>(&'a self, run_id: &'a str, key: &'a str, verdict: &'a str, tokens: u64) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let began = std::time::Instant::now();
            sqlx::query(
                "INSERT INTO judgements (run_id, judge_key, verdict, tokens, created_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (run_id, judge_key) DO NOTHING",
            )
            .bind(run_id)
            .bind(key)
            .bind(verdict)
            .bind(i64::try_from(tokens).unwrap_or(i64::MAX))
            .bind(now())
            .execute(self.pool_ref())
            .await
            .map_err(|err| write_error(self.health_ref(), began, err))?;
            Ok(())
        })
    }
}

fn experiment_of<R: Row>(r: &R) -> Result<StoredExperiment, StoreError>
where
    for<'t> String: sqlx::Decode<'t, R::Database> + sqlx::Type<R::Database>,
    for<'r> &'r str: sqlx::ColumnIndex<R>,
{
    Ok(StoredExperiment {
        experiment_id: r.try_get("experiment_id").map_err(db)?,
        name: r.try_get("name").map_err(db)?,
        dataset: r.try_get("dataset").map_err(db)?,
        dataset_text: r.try_get("dataset_text").map_err(db)?,
        created_at: r.try_get("created_at").map_err(db)?,
        report: r.try_get("report").map_err(db)?,
    })
}
