//! The schema: each database's numbered migrations (the same numbers and tables on SQLite and
//! PostgreSQL) and the one runner that applies them, [`migrate`], for both.
//!
//! The runner holds the lock that serialises migrating processes from its first statement to
//! its commit: the version read, every check and every migration applied are one transaction,
//! begun under SQLite's write lock (`BEGIN IMMEDIATE`, waiting out the busy timeout) or
//! PostgreSQL's advisory lock. So processes opening one fresh database at once apply each
//! migration once, the later ones finding it applied (`store::processes_opening_one_new_sqlite_
//! file_together_migrate_it_once`); reading the version before the lock let two of them both
//! apply the first. What differs between the databases is the [`Schema`] of each: how the
//! transaction begins and locks, and how the version table is looked at.
//!
//! Each applied migration's checksum (SHA-256 of its SQL) is recorded in `fabric_schema`, and a
//! database whose recorded checksum differs from this binary's migration of the same number is
//! refused: someone edited a migration after it was applied, and the schema is not what the
//! code expects. A version applied by a runtime before checksums were recorded gets its
//! checksum filled in on first sight.
//!
//! Why not `sqlx::migrate!` (its `migrate` feature is off): its SQLite migrator holds no lock
//! across reading the applied versions and applying them (each migration is a transaction of
//! its own), which is the race this runner closes; and it keeps its own table
//! (`_sqlx_migrations`, SHA-384) where every database this runtime ever opened records
//! `fabric_schema` (SHA-256), so bridging would rewrite each database's history at its first
//! open, one more path to get right for no behaviour gained.

use sha2::{Digest, Sha256};
use sqlx::Row;

use super::sql_error::db;
use super::{StoreError, now};
use crate::failure::BoxFuture;

/// How one database migrates: its numbered migrations, and the statements of the runner that
/// differ between the databases.
pub(crate) trait Schema: sqlx::Database {
    /// The schema versions this binary knows, in order: (version, SQL).
    const MIGRATIONS: &'static [(i64, &'static str)];
    /// Begins the migration's transaction.
    const BEGIN: &'static str;
    /// Run first in it: the lock that serialises migrating processes until the commit (empty
    /// where `BEGIN` took it).
    const LOCK: &'static str;
    /// One `BIGINT`, 1 when `fabric_schema` exists.
    const HAS_TABLE: &'static str;
    /// Creates `fabric_schema` (only where missing: PostgreSQL's `IF NOT EXISTS` would say so in
    /// a notice at every start).
    const CREATE_TABLE: &'static str;
    /// One `BIGINT`, 1 when `fabric_schema` has its `checksum` column (it came later than the
    /// table: a database of an older runtime gets the column).
    const HAS_CHECKSUMS: &'static str;
}

impl Schema for sqlx::Sqlite {
    const MIGRATIONS: &'static [(i64, &'static str)] = &[
        (1, include_str!("migrations/sqlite/0001_runs.sql")),
        (2, include_str!("migrations/sqlite/0002_leases.sql")),
        (3, include_str!("migrations/sqlite/0003_health.sql")),
        (4, include_str!("migrations/sqlite/0004_prompts.sql")),
        (5, include_str!("migrations/sqlite/0005_idempotency.sql")),
        (6, include_str!("migrations/sqlite/0006_cancel.sql")),
        (7, include_str!("migrations/sqlite/0007_webhooks.sql")),
        (8, include_str!("migrations/sqlite/0008_sessions.sql")),
        (9, include_str!("migrations/sqlite/0009_webhook_reopen.sql")),
        (10, include_str!("migrations/sqlite/0010_webhook_writer.sql")),
        (11, include_str!("migrations/sqlite/0011_session_order.sql")),
        (12, include_str!("migrations/sqlite/0012_llm_shares.sql")),
        (13, include_str!("migrations/sqlite/0013_catalogue_versions.sql")),
        (14, include_str!("migrations/sqlite/0014_schedules.sql")),
        (15, include_str!("migrations/sqlite/0015_experiments.sql")),
        (16, include_str!("migrations/sqlite/0016_run_inbox.sql")),
        (17, include_str!("migrations/sqlite/0017_a2a_push_configs.sql")),
    ];
    // The write lock, taken first (a read first would make the later upgrade fail at once).
    const BEGIN: &'static str = "BEGIN IMMEDIATE";
    const LOCK: &'static str = "";
    const HAS_TABLE: &'static str = "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'fabric_schema'";
    const CREATE_TABLE: &'static str = "CREATE TABLE fabric_schema (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)";
    const HAS_CHECKSUMS: &'static str = "SELECT COUNT(*) FROM pragma_table_info('fabric_schema') WHERE name = 'checksum'";
}

impl Schema for sqlx::Postgres {
    const MIGRATIONS: &'static [(i64, &'static str)] = &[
        (1, include_str!("migrations/postgres/0001_runs.sql")),
        (2, include_str!("migrations/postgres/0002_leases.sql")),
        (3, include_str!("migrations/postgres/0003_health.sql")),
        (4, include_str!("migrations/postgres/0004_prompts.sql")),
        (5, include_str!("migrations/postgres/0005_idempotency.sql")),
        (6, include_str!("migrations/postgres/0006_cancel.sql")),
        (7, include_str!("migrations/postgres/0007_webhooks.sql")),
        (8, include_str!("migrations/postgres/0008_sessions.sql")),
        (9, include_str!("migrations/postgres/0009_webhook_reopen.sql")),
        (10, include_str!("migrations/postgres/0010_webhook_writer.sql")),
        (11, include_str!("migrations/postgres/0011_session_order.sql")),
        (12, include_str!("migrations/postgres/0012_llm_shares.sql")),
        (13, include_str!("migrations/postgres/0013_catalogue_versions.sql")),
        (14, include_str!("migrations/postgres/0014_schedules.sql")),
        (15, include_str!("migrations/postgres/0015_experiments.sql")),
        (16, include_str!("migrations/postgres/0016_run_inbox.sql")),
        (17, include_str!("migrations/postgres/0017_a2a_push_configs.sql")),
    ];
    const BEGIN: &'static str = "BEGIN";
    // Any constant every migrating process agrees on: 0x6661_6272_6963, `fabric` in ASCII (the
    // sweep's and the sessions' locks are keys of their own, `Dialect`).
    const LOCK: &'static str = "SELECT pg_advisory_xact_lock(112568449526115)";
    const HAS_TABLE: &'static str = "SELECT CAST(CASE WHEN to_regclass('fabric_schema') IS NULL THEN 0 ELSE 1 END AS BIGINT)";
    const CREATE_TABLE: &'static str = "CREATE TABLE fabric_schema (version BIGINT PRIMARY KEY, applied_at TEXT NOT NULL)";
    const HAS_CHECKSUMS: &'static str = "SELECT COUNT(*) FROM information_schema.columns \
         WHERE table_name = 'fabric_schema' AND column_name = 'checksum' AND table_schema = current_schema()";
}

/// Brings the database at `pool` to this binary's schema, in one transaction under the
/// migration lock ([`Schema`]); refuses a database migrated by a newer runtime
/// ([`StoreError::TooNew`]) or whose applied migrations were edited since.
pub(crate) fn migrate<DB: Schema>(pool: &sqlx::Pool<DB>) -> BoxFuture<'_, Result<(), StoreError>>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'t> String: sqlx::Encode<'t, DB> + sqlx::Decode<'t, DB> + sqlx::Type<DB>,
    for<'t> i64: sqlx::Encode<'t, DB> + sqlx::Decode<'t, DB> + sqlx::Type<DB>,
    for<'r> usize: sqlx::ColumnIndex<DB::Row>,
{
    // Boxed here, where the bounds say it is `Send`: an `async fn` generic over the database
    // would leave that proof to each caller, which cannot make it for every lifetime.
    Box::pin(async move {
        use sqlx::Connection;
        let mut conn = pool.acquire().await.map_err(db)?;
        let mut tx = conn.begin_with(DB::BEGIN).await.map_err(db)?;
        if !DB::LOCK.is_empty() {
            sqlx::query(DB::LOCK).execute(&mut *tx).await.map_err(db)?;
        }
        let has_table: i64 = sqlx::query(DB::HAS_TABLE).fetch_one(&mut *tx).await.map_err(db)?.try_get(0).map_err(db)?;
        if has_table == 0 {
            sqlx::query(DB::CREATE_TABLE).execute(&mut *tx).await.map_err(db)?;
        }
        let has_sums: i64 = sqlx::query(DB::HAS_CHECKSUMS).fetch_one(&mut *tx).await.map_err(db)?.try_get(0).map_err(db)?;
        if has_sums == 0 {
            sqlx::query("ALTER TABLE fabric_schema ADD COLUMN checksum TEXT").execute(&mut *tx).await.map_err(db)?;
        }
        let applied: Vec<(i64, Option<String>)> = sqlx::query("SELECT version, checksum FROM fabric_schema ORDER BY version")
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(db)?;
        let found = applied.last().map_or(0, |a| a.0);
        let known = DB::MIGRATIONS.last().map_or(0, |m| m.0);
        if found > known {
            return Err(StoreError::TooNew { found, known });
        }
        for (version, sum) in verify(&applied, DB::MIGRATIONS)? {
            sqlx::query("UPDATE fabric_schema SET checksum = $1 WHERE version = $2").bind(sum).bind(version).execute(&mut *tx).await.map_err(db)?;
        }
        for (version, sql) in DB::MIGRATIONS.iter().filter(|(v, _)| *v > found) {
            sqlx::raw_sql(*sql).execute(&mut *tx).await.map_err(db)?;
            sqlx::query("INSERT INTO fabric_schema (version, applied_at, checksum) VALUES ($1, $2, $3)")
                .bind(*version)
                .bind(now())
                .bind(checksum(sql))
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        tx.commit().await.map_err(db)
    })
}

/// The hex SHA-256 of a migration's SQL.
pub(crate) fn checksum(sql: &str) -> String {
    Sha256::digest(sql.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// The applied versions (with their recorded checksums, if any) against the known migrations:
/// the versions whose checksum is to be filled in, or the first edited migration.
pub(crate) fn verify(applied: &[(i64, Option<String>)], known: &[(i64, &str)]) -> Result<Vec<(i64, String)>, StoreError> {
    let mut fill = Vec::new();
    for (version, recorded) in applied {
        let Some((_, sql)) = known.iter().find(|(v, _)| v == version) else { continue };
        let sum = checksum(sql);
        match recorded {
            None => fill.push((*version, sum)),
            Some(r) if *r == sum => {}
            Some(r) => {
                return Err(StoreError::Database(format!(
                    "migration {version} was changed after it was applied to this database (its checksum here is {sum}, the database recorded {r}): \
                     a migration already applied must never be edited; add a new one instead"
                )));
            }
        }
    }
    Ok(fill)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edited_migration_is_refused_and_an_unrecorded_one_is_filled_in() {
        let known = [(1, "CREATE TABLE a (x INTEGER);"), (2, "CREATE TABLE b (y INTEGER);")];
        let good = (1, Some(checksum(known[0].1)));
        assert_eq!(verify(&[good.clone(), (2, None)], &known).unwrap(), vec![(2, checksum(known[1].1))]);
        let edited = (2, Some(checksum("CREATE TABLE b (y TEXT);")));
        let e = verify(&[good, edited], &known).unwrap_err();
        assert!(e.to_string().contains("migration 2 was changed"), "{e}");
        assert_eq!(checksum("").len(), 64);
    }

    /// The checksums of the migrations that landed, as every database that applied them
    /// recorded them: an edit of one would make the store refuse those databases. A new migration
    /// is added here in the commit that adds it (0006 included: it ships with this table).
    const LANDED: &[(i64, &str, &str)] = &[
        (1, "6c22dca9f7288a384c5e32de5717ac7bff6b355e7fb1eee72246cb3635921580", "277e45e86943af5476a77c0559ce5accbb57e5ddd52286c09c9f14c0aaceeec5"),
        (2, "fcc3edc4f2e9c7cbe98494306e7d179301897023f578d7899216ec8c3d60b2b4", "f36f6a7ed7a9771ed71f52ec822215e46d9825a6d4eeb3578787cbb8c7fa8116"),
        (3, "55590e8954f1960753765a8592e00cb09f8d2b8027a4711f62dd898d7b491aeb", "060a92a11a779d53718b8db8abf8e76299adb8107dea7523e1bd9cedf96d68f1"),
        (4, "a4d7ff86e7f03eaa2b7f1eb3ffec79e267893faad148c663089349ded0da3c1f", "a4d7ff86e7f03eaa2b7f1eb3ffec79e267893faad148c663089349ded0da3c1f"),
        (5, "abcf37cf83140207b73d853a6eba36afd6cada9c34594fa6716b3d635b3b5b2e", "abcf37cf83140207b73d853a6eba36afd6cada9c34594fa6716b3d635b3b5b2e"),
        (6, "718fa1d8446fd18cc8c8f3c5b4314ea0d5884c46ec52a9f717ad7c23dc05a82f", "718fa1d8446fd18cc8c8f3c5b4314ea0d5884c46ec52a9f717ad7c23dc05a82f"),
        (7, "22583e7a828b0fef7975e1399529e9969aeafbbe053a8c49c2e7db5e2853b3a8", "bd9304c9cc309b9798749378c8cb3609be7a07444bee89a3466925a58f9b05b0"),
        (8, "703b92c4c088e26b00c8548cfadebd5159ae3b60da7478f7f008bee44afb48e4", "b7d72d32cb3774c2ce01122adb403849ac6f1aa3aeec8a31a4b3759ea1bd89a6"),
        (9, "80b196d7fe946311d229744ecdd3d0d74195040c04a47b880a7e0cefa6a88216", "c97608a3d9b72769c9f432305ef8b0d431b1b541204674968ed4784798f08498"),
        (10, "ece5fc142878e10b90d69cd47af0c75ea58327baf3b42a982c89b343b97a9dbf", "f2c9e71bebafdf0612dce9e38d3c6a4c5842c7cb97a8b4c5a82b4e0f58e4ba46"),
        (11, "5f28c84f3d77e4e0f9181141507a647956091d16fc0710cc2cdebe18bd552a89", "676b36525eec163fd0140838dcbf8129dbf051d644057f19ab83b903c3dda5e7"),
        (12, "17d4125a6f42316a11cd6532908ee2d7ac2c02a209bf9d25ddaf66e8fbcd98fc", "02c47440773722d33a6ac4400a669111526955e590cebc0003331f0c16161b15"),
        (13, "6e32a7b1c107e178c9a2364dc41e2a0fff1e2fa30aacb39cf9524da7e704531c", "6e32a7b1c107e178c9a2364dc41e2a0fff1e2fa30aacb39cf9524da7e704531c"),
        (14, "f7867815918bbf95269e9e48f4f0bd3677e43d1f1fe8322e24b48eec6b2bb9bd", "b55aa386824d9bf9278a895fcf52fdeeb7a75896fe2eb1c8843aafeb7fe8eec5"),
        (15, "b355db2b582535ef2378e20697d7ab1b66b6b3f589b8cd65ffbd753145c90e65", "d97a0e9c395fa98b09a63a1d0837cb4c8838ec2147023aab1e43cad7db860328"),
        (16, "399191c9abdd16b6365f8638a8664c5e8426daee2aec54decd88813163895d16", "83bc7ae9c4b36fd367c5db5e72b6cb4238f771139f68301d277cb7c3e5fd3b0d"),
        (17, "33aae95341f2ca41034a18e925d047f1d877cf451356a3e81db4b9ead01b7185", "86e372d7cb43d05c9e054a6d61db710de9912a89a35b4a1ee8c4a37dbe5cacc6"),
    ];

    #[test]
    fn no_landed_migration_is_edited() {
        for (migrations, column, store) in [(<sqlx::Sqlite as Schema>::MIGRATIONS, 1, "sqlite"), (<sqlx::Postgres as Schema>::MIGRATIONS, 2, "postgres")] {
            assert_eq!(migrations.len(), LANDED.len(), "{store}: every migration is in LANDED (add a new one there)");
            for ((version, sql), landed) in migrations.iter().zip(LANDED) {
                let want = if column == 1 { landed.1 } else { landed.2 };
                assert_eq!((*version, checksum(sql).as_str()), (landed.0, want), "{store}: migration {version} was edited after it landed; add a new one");
            }
        }
    }
}
