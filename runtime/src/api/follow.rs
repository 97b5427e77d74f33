//! Event streams of runs this process does not execute (queued, or executed by another
//! replica), followed through the store: one poller per run, shared by every stream of it, and
//! the caps on event streams (per run and in all).
//!
//! Each stream polling the store on its own cost about ten statements a second; a few hundred
//! streams of one run were a fifth of a core. A [`Feeds`] registry keeps one task per followed
//! run that reads the run's status and new events every [`FOLLOW_POLL`] and hands them to every
//! subscriber (a broadcast of the events, a watch of where the run stands); the task ends when
//! its last subscriber goes, or when the run ends or asks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, watch};

use crate::store::{RunStore, StoredEvent};

/// How often a run followed through the store is read (by its one poller).
pub(super) const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// Events a poller keeps for a subscriber that has not taken them yet; one further behind reads
/// the store itself to catch up (a slow client costs itself a read, not the others' events).
const FEED_BUFFER: usize = 256;

/// Where a followed run stands after a poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FeedState {
    /// The last `seq` handed to subscribers.
    pub last: u64,
    /// The run ended or asked: every event of it was handed on before this state.
    pub ended: bool,
    /// Bumped at every poll, so subscribers wake to look whether the run is executing here now.
    pub polls: u64,
}

struct Feed {
    events: broadcast::Sender<Arc<StoredEvent>>,
    state: watch::Sender<FeedState>,
}

/// One stream's share of a run's poller.
pub(super) struct Follower {
    pub events: broadcast::Receiver<Arc<StoredEvent>>,
    pub state: watch::Receiver<FeedState>,
}

/// The pollers of the runs followed through the store, by run id.
#[derive(Default)]
pub(super) struct Feeds {
    runs: Mutex<HashMap<String, Arc<Feed>>>,
}

impl Feeds {
    /// A share of the run's poller, started if none runs. Subscribe before reading the store to
    /// catch up: an event written in between then comes through the feed (the caller skips those
    /// it has, and reads the store again on a gap).
    pub fn follow(self: &Arc<Self>, store: Arc<dyn RunStore>, run_id: &str) -> Follower {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(feed) = runs.get(run_id) {
            return Follower { events: feed.events.subscribe(), state: feed.state.subscribe() };
        }
        let feed = Arc::new(Feed { events: broadcast::channel(FEED_BUFFER).0, state: watch::channel(FeedState { last: 0, ended: false, polls: 0 }).0 });
        let follower = Follower { events: feed.events.subscribe(), state: feed.state.subscribe() };
        runs.insert(run_id.to_owned(), feed.clone());
        tokio::spawn(poll(self.clone(), store, run_id.to_owned(), feed));
        follower
    }

    /// Pollers running now (`fabric_event_stream_pollers`).
    pub fn len(&self) -> usize {
        self.runs.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Forgets this feed (not a newer one of the same run) when nobody follows it, or at once
    /// with `always`. Under the registry's lock, so no subscriber joins a feed that is ending.
    fn retire(&self, run_id: &str, feed: &Arc<Feed>, always: bool) -> bool {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        if !always && feed.events.receiver_count() > 0 {
            return false;
        }
        if runs.get(run_id).is_some_and(|f| Arc::ptr_eq(f, feed)) {
            runs.remove(run_id);
        }
        true
    }
}

/// The one poller of a run: status, then the events after the last one handed on (so an end
/// seen comes after all its events), every [`FOLLOW_POLL`].
async fn poll(feeds: Arc<Feeds>, store: Arc<dyn RunStore>, run_id: String, feed: Arc<Feed>) {
    // From the events there now: each subscriber read those itself.
    let Ok(next) = store.next_seq(&run_id).await else {
        feeds.retire(&run_id, &feed, true);
        return;
    };
    let mut last = next.saturating_sub(1);
    let mut polls = 0;
    let mut tick = tokio::time::interval(FOLLOW_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if feeds.retire(&run_id, &feed, false) {
            return;
        }
        // A store error or a vanished run ends the feed; its subscribers read the store
        // themselves, and end their streams as before if it fails them too.
        let status = match store.get_run(&run_id).await {
            Ok(Some(run)) => run.status,
            _ => {
                feeds.retire(&run_id, &feed, true);
                return;
            }
        };
        let Ok(events) = store.events_after(&run_id, last).await else {
            feeds.retire(&run_id, &feed, true);
            return;
        };
        for e in events {
            last = e.seq;
            // Err: nobody subscribed at this instant; the next tick retires the feed.
            let _ = feed.events.send(Arc::new(e));
        }
        polls += 1;
        let ended = !status.is_pending();
        feed.state.send_replace(FeedState { last, ended, polls });
        if ended {
            feeds.retire(&run_id, &feed, true);
            return;
        }
    }
}

/// The caps on run event streams: per run (one client opening many streams of a run) and in all.
#[derive(Default)]
pub(super) struct StreamSlots {
    open: Mutex<(usize, HashMap<String, usize>)>,
}

/// One open stream's place, given back when the stream ends.
pub(super) struct StreamSlot {
    slots: Arc<StreamSlots>,
    run_id: String,
}

impl StreamSlots {
    /// A place for a stream of `run_id`, or `None` past either cap.
    pub fn take(self: &Arc<Self>, run_id: &str, per_run: usize, total: usize) -> Option<StreamSlot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let (all, by_run) = &mut *open;
        let of_run = by_run.get(run_id).copied().unwrap_or(0);
        if *all >= total || of_run >= per_run {
            return None;
        }
        *all += 1;
        by_run.insert(run_id.to_owned(), of_run + 1);
        Some(StreamSlot { slots: self.clone(), run_id: run_id.to_owned() })
    }

    /// Run event streams open now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).0
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().unwrap_or_else(|p| p.into_inner());
        let (all, by_run) = &mut *open;
        *all = all.saturating_sub(1);
        if let Some(n) = by_run.get_mut(&self.run_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                by_run.remove(&self.run_id);
            }
        }
    }
}
