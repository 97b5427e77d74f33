//! Whether the store can write now, as its writes found it: the state readiness, starts and
//! replies read (fail fast with [`StoreError::Unavailable`] while writes fail), and the healing
//! that needs no traffic: a probe write while writes fail, and, for a SQLite file, a check that
//! the file the store opened is still the one at its path.
//!
//! A connection whose state is unknown after an error (a failed transaction, a read-only or
//! full file, a cut socket) must not serve again: SQLite keeps a connection opened while its
//! file was read-only read-only for good, and a COMMIT that failed can leave a transaction open
//! that a later "commit" of a savepoint inside it would seem to end. [`Health::poison`] marks
//! every connection open at that moment; the pool's `before_acquire` hook ([`Health::fresh`])
//! closes them instead of handing them out.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::StoreError;

/// How often the healer looks while writes fail (a probe) and at the file (SQLite).
pub(crate) const HEAL_EVERY: Duration = Duration::from_millis(500);

#[derive(Debug)]
pub(crate) struct Health {
    state: Mutex<State>,
    /// False for an in-memory SQLite database, whose one connection is the database.
    discard_connections: bool,
    /// Writers trying a transaction again now ([`Health::retrying`]).
    retrying: std::sync::atomic::AtomicUsize,
}

/// A writer trying a transaction again, for as long as it lives.
pub(crate) struct Retrying<'a>(&'a Health);

impl Drop for Retrying<'_> {
    fn drop(&mut self) {
        self.0.retrying.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[derive(Debug)]
struct State {
    /// Since when writes fail, and the last error.
    failing: Option<(Instant, String)>,
    /// When writes last came back after failing (takeovers wait a renewal period after it).
    recovered: Option<Instant>,
    /// The database file is not the one the store opened any more: nothing heals that.
    file: Option<String>,
    /// Connections opened at or before this instant are closed when next acquired.
    poisoned: Option<Instant>,
}

impl Health {
    pub(crate) fn new(discard_connections: bool) -> Health {
        Health { state: Mutex::new(State { failing: None, recovered: None, file: None, poisoned: None }), discard_connections, retrying: Default::default() }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Err(Unavailable)` with the reason while the store cannot take writes.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        let state = self.state();
        if let Some(file) = &state.file {
            return Err(StoreError::Unavailable(file.clone()));
        }
        match &state.failing {
            Some((since, error)) => Err(StoreError::Unavailable(format!("writes have failed for {} s: {error}", since.elapsed().as_secs()))),
            None => Ok(()),
        }
    }

    /// Whether writes fail now.
    pub(crate) fn failing(&self) -> bool {
        let state = self.state();
        state.failing.is_some() || state.file.is_some()
    }

    /// How long ago writes came back after failing, if they did.
    pub(crate) fn recovered_ago(&self) -> Option<Duration> {
        self.state().recovered.map(|at| at.elapsed())
    }

    /// A write that `began` then failed in a way that trying again may cure (full, read-only,
    /// locked, away). A failure of a write that began before writes last came back says
    /// nothing of now: a renewal that waited out a PostgreSQL restart for a pooled connection
    /// times out after the store recovered, and must not make it unready again.
    pub(crate) fn write_failed(&self, began: Instant, error: &str) {
        let mut state = self.state();
        if state.failing.is_none() && state.recovered.is_some_and(|at| began < at) {
            tracing::debug!(error, "run store: a write begun before writes came back failed; ignored");
            return;
        }
        if state.failing.is_none() {
            tracing::error!(error, "run store: writes fail; starts and replies are refused (503) and /readyz says so until they succeed again");
            state.failing = Some((Instant::now(), error.to_owned()));
        } else if let Some((_, last)) = state.failing.as_mut() {
            error.clone_into(last);
        }
    }

    /// A write committed.
    pub(crate) fn write_succeeded(&self) {
        let mut state = self.state();
        if let Some((since, _)) = state.failing.take() {
            tracing::warn!(failed_for_s = since.elapsed().as_secs(), "run store: writes succeed again");
            state.recovered = Some(Instant::now());
        }
    }

    /// A writer tries a transaction again (while the guard lives): meanwhile the probe's small
    /// write passing says nothing (a full disk has room for it, not for the runs' rows), only
    /// the writers' own transactions do.
    pub(crate) fn retrying(&self) -> Retrying<'_> {
        self.retrying.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Retrying(self)
    }

    /// The healer's probe write committed: writes work again unless a writer's transaction is
    /// still being tried again.
    pub(crate) fn probe_succeeded(&self) {
        if self.retrying.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            self.write_succeeded();
        }
    }

    /// The file at the store's path is not the one it opened (removed, or replaced).
    pub(crate) fn file_lost(&self, why: String) {
        let mut state = self.state();
        if state.file.is_none() {
            tracing::error!(problem = why.as_str(), "run store: the database file is gone; this process is not ready and refuses starts: restart it");
            state.file = Some(why);
        }
    }

    /// Every connection open now is closed before it serves again.
    pub(crate) fn poison(&self) {
        if self.discard_connections {
            self.state().poisoned = Some(Instant::now());
        }
    }

    /// Whether a connection of this age may serve (the pool's `before_acquire`).
    pub(crate) fn fresh(&self, age: Duration) -> bool {
        let Some(poisoned) = self.state().poisoned else { return true };
        Instant::now().checked_sub(age).is_none_or(|opened| opened > poisoned)
    }

    /// Whether connections are closed after an error (not for an in-memory database).
    pub(crate) fn discards(&self) -> bool {
        self.discard_connections
    }
}

/// The database file as the store opened it: a handle of its own on it (`O_PATH`: it reads no
/// data and takes no lock, so closing it never drops SQLite's POSIX locks, which any other close
/// of the file would), so that the inode cannot be reused while the store lives, and a removed
/// file shows as unlinked even if a new one took its name at once.
#[derive(Debug)]
pub(crate) struct FileWatch {
    path: std::path::PathBuf,
    file: std::fs::File,
}

impl FileWatch {
    pub(crate) fn open(path: &std::path::Path) -> std::io::Result<FileWatch> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new().read(true).custom_flags(nix::fcntl::OFlag::O_PATH.bits()).open(path)?;
        Ok(FileWatch { path: path.to_owned(), file })
    }

    /// What happened to the file since it was opened, if anything.
    pub(crate) fn problem(&self) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        let ours = self.file.metadata().ok()?;
        let there = std::fs::metadata(&self.path).ok();
        let path = self.path.display();
        match there {
            Some(m) if (m.dev(), m.ino()) == (ours.dev(), ours.ino()) && ours.nlink() > 0 => None,
            Some(_) => Some(format!("the database file {path} was replaced by another file; this process writes to the old one, which no one else sees")),
            None => Some(format!("the database file {path} was removed; this process writes to a file no one else sees")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_failing_refuse_until_one_succeeds_and_recovery_is_dated() {
        let h = Health::new(true);
        assert!(h.check().is_ok() && h.recovered_ago().is_none());
        h.write_failed(Instant::now(), "database or disk is full (13)");
        let e = h.check().unwrap_err();
        assert!(matches!(&e, StoreError::Unavailable(m) if m.contains("disk is full")), "{e}");
        assert!(h.failing());
        h.write_succeeded();
        assert!(h.check().is_ok() && !h.failing());
        assert!(h.recovered_ago().is_some());
    }

    #[test]
    fn a_probe_passing_while_a_writer_tries_again_heals_nothing() {
        let h = Health::new(true);
        h.write_failed(Instant::now(), "database or disk is full (13)");
        let retrying = h.retrying();
        // A full disk has room for the probe's one small row, not for the runs' rows.
        h.probe_succeeded();
        assert!(h.failing(), "still failing while a writer's transaction is tried again");
        drop(retrying);
        h.probe_succeeded();
        assert!(!h.failing());
    }

    #[test]
    fn a_write_begun_before_writes_came_back_does_not_undo_their_recovery() {
        let h = Health::new(true);
        // A renewal starts waiting for a connection while the database is away ...
        let began = Instant::now();
        h.write_failed(began, "pool timed out while waiting for an open connection");
        std::thread::sleep(Duration::from_millis(2));
        // ... the database comes back and a write commits ...
        h.write_succeeded();
        // ... then the renewal's wait times out: writes still work.
        h.write_failed(began, "pool timed out while waiting for an open connection");
        assert!(h.check().is_ok() && !h.failing(), "a stale failure made the store unready");
        // A write begun after the recovery that fails is news.
        h.write_failed(Instant::now(), "connection refused");
        assert!(h.failing());
        // While writes fail, any failure updates the reason.
        h.write_failed(began, "the old wait timed out");
        assert!(matches!(h.check(), Err(StoreError::Unavailable(m)) if m.contains("old wait")));
    }

    #[test]
    fn a_lost_file_never_heals() {
        let h = Health::new(true);
        h.file_lost("removed".into());
        h.write_succeeded();
        assert!(h.check().is_err());
    }

    #[test]
    fn connections_opened_before_a_poison_are_not_fresh() {
        let h = Health::new(true);
        assert!(h.fresh(Duration::from_secs(5)));
        std::thread::sleep(Duration::from_millis(5));
        h.poison();
        assert!(!h.fresh(Duration::from_secs(5)), "opened before");
        assert!(h.fresh(Duration::ZERO), "opened after");
        let memory = Health::new(false);
        memory.poison();
        assert!(memory.fresh(Duration::from_secs(5)), "an in-memory database keeps its one connection");
    }

    #[test]
    fn a_removed_or_replaced_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.db");
        std::fs::write(&path, "a").unwrap();
        let watch = FileWatch::open(&path).unwrap();
        assert_eq!(watch.problem(), None);
        std::fs::remove_file(&path).unwrap();
        assert!(watch.problem().unwrap().contains("removed"));
        // A new file at once where it was: its inode cannot be the old one (still held).
        std::fs::write(&path, "c").unwrap();
        assert!(watch.problem().unwrap().contains("replaced"));
    }
}
