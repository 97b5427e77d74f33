//! A recorded run on its catalogue version: the version's sources kept in the store before the
//! first run that records it ([`Durable::keep_version`]); the edition a run taken up again goes on
//! on ([`Durable::edition_of`]: the one it recorded, rebuilt from the store when this process does
//! not have it, or the current one under `FABRIC_RESUME_ON=current`); and the event that says a
//! run moved to another version ([`Durable::note_moved`]), so that no run mixes two versions
//! without saying so.

use std::sync::Arc;

use super::{Durable, Edition};
use crate::config::ResumeOn;
use crate::events::{EventData, EventSink, RunEvents};
use crate::exec::{JournalBatch, RunHistory};
use crate::store::{Lease, StoreError};
use crate::version::CatalogueVersion;

/// How often a replica asks the store which other catalogue versions its unclaimed runs recorded.
pub const STRANDED_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The edition a run goes on on, and, when it is not the version the run recorded, the event
/// that says so.
pub(super) struct OnVersion {
    pub edition: Arc<Edition>,
    pub moved: Option<EventData>,
}

impl Durable {
    /// Keeps `edition`'s sources in the store, once per process and version (the store keeps
    /// them once per version): before the first run that records the version, so that any
    /// replica can rebuild it.
    pub(super) async fn keep_version(&self, edition: &Edition) -> Result<(), StoreError> {
        let kept = |v| self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(v);
        if !kept(edition.version()) {
            // Two first runs at once both write it: the store keeps one row.
            self.store.put_catalogue(edition.version(), edition.sources()).await?;
            self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(edition.version().clone());
        }
        Ok(())
    }

    /// The edition a run recorded on `recorded` goes on on here (see the module docs), under
    /// `resume_on` (the fleet's `FABRIC_RESUME_ON`; a replay asks for the recorded one, and takes
    /// its catalogue whatever the stub's part of it: a replay asks no model). A
    /// run accepted before versions were kept (`None`) goes on on the current one. A version the
    /// store does not have or cannot read, or that builds here as another version, moves the run
    /// to the current one, saying why; a store that cannot be read is an error (the run waits for
    /// another try).
    pub(super) async fn edition_of(&self, recorded: Option<&CatalogueVersion>, resume_on: Option<ResumeOn>) -> Result<OnVersion, StoreError> {
        let replay = resume_on.is_none();
        let current = self.runtime.current();
        let Some(recorded) = recorded.filter(|v| *v != current.version()) else { return Ok(OnVersion { edition: current, moved: None }) };
        let moved = |current: Arc<Edition>, reason: String| {
            let to = current.version().to_string();
            OnVersion { edition: current, moved: Some(EventData::CatalogueMoved { from: Some(recorded.to_string()), to, reason }) }
        };
        if resume_on == Some(ResumeOn::Current) {
            return Ok(moved(current, "FABRIC_RESUME_ON=current: runs go on on the version loaded".into()));
        }
        if let Some(built) = self.runtime.built(recorded) {
            return Ok(OnVersion { edition: built, moved: None });
        }
        let _one = self.rebuilding.lock().await;
        // Built by the rebuild this one waited for.
        if let Some(built) = self.runtime.built(recorded) {
            return Ok(OnVersion { edition: built, moved: None });
        }
        let sources = match self.store.catalogue(recorded).await {
            Ok(Some(sources)) => sources,
            Ok(None) => return Ok(moved(current, "the run store does not keep the version it started on".into())),
            // A row that will never read: going on elsewhere beats being claimed for ever.
            Err(StoreError::VersionUnreadable(why)) => return Ok(moved(current, why)),
            Err(e) => return Err(e),
        };
        // Parsing and hydrating a catalogue is work for a blocking thread, not the runtime's.
        let runtime = self.runtime.clone();
        let rebuilt = tokio::task::spawn_blocking(move || runtime.rebuild(sources)).await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        Ok(match rebuilt {
            Ok(edition) if replay || edition.version() == recorded => OnVersion { edition, moved: None },
            // The stub's scripts are part of a version: one recorded under the stub is another
            // version under a provider, and the reverse.
            Ok(edition) => moved(current, format!("the version it started on builds here as version {} (the stub or the provider differs)", edition.version())),
            Err(e) => moved(current, format!("the version it started on cannot be built here: {e}")),
        })
    }

    /// The routes this process may claim runs of: those of the version in force, and those of
    /// the other versions it has built or that runs waiting for a claim recorded (a route a
    /// reload removed still has its runs, which finish on their version). The store is asked
    /// for those versions at most every [`STRANDED_EVERY`].
    pub(super) async fn claimable_routes(&self) -> Vec<String> {
        let current = self.runtime.current();
        let mut routes = self.runtime.claimable_routes();
        let due = {
            let mut last = self.stranded_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let due = last.is_none_or(|t| t.elapsed() >= STRANDED_EVERY);
            if due {
                *last = Some(std::time::Instant::now());
            }
            due
        };
        if due {
            match self.store.stranded_versions(&routes, 8).await {
                Ok(versions) => {
                    for v in versions.iter().filter(|v| *v != current.version()) {
                        // Built once and kept; a version that cannot be had waits for a replica
                        // that can (its runs are not claimed here).
                        let _ = self.edition_of(Some(v), None).await;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "run store: looking for runs of other catalogue versions"),
            }
        }
        for edition in self.runtime.others() {
            for id in edition.claimable_routes() {
                if !routes.iter().any(|known| known == id) {
                    routes.push(id.to_owned());
                }
            }
        }
        routes
    }

    /// Records `moved` (a [`EventData::CatalogueMoved`]) as the run's next event, committed
    /// before the run goes on; `history` then numbers the events after it. Logged too.
    /// The run's row then names `edition`'s version (kept in the store first), so whoever takes
    /// the run up next goes on on it, not back on the one it left. The event comes first: a crash
    /// between the two leaves an event the next holder repeats, never a move unsaid.
    pub(super) async fn note_moved(
        &self,
        lease: &Lease,
        route_id: &str,
        history: &mut RunHistory,
        moved: EventData,
        edition: &Edition,
        sink: Arc<dyn EventSink>,
    ) -> Result<(), StoreError> {
        if let EventData::CatalogueMoved { from, to, reason } = &moved {
            tracing::warn!(run_id = lease.run_id(), from = from.as_deref().unwrap_or("none"), to = %to, reason = %reason, "a run goes on on another catalogue version");
        }
        self.keep_version(edition).await?;
        let events = RunEvents::new(lease.run_id(), route_id, None, sink).recording(history.next_seq);
        events.emit(None, || moved);
        let recorded = events.take_recorded();
        let durable = events.on_durable(&recorded);
        history.next_seq += recorded.len() as u64;
        self.store.commit(lease, JournalBatch { events: recorded, entries: Vec::new(), end: None }).await?;
        if let Some(d) = durable {
            d();
        }
        self.store.move_catalogue(lease, edition.version()).await
    }
}
