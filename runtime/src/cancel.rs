//! Stopping runs from outside: a signal to the CLI, a shutdown of the service, a cancel request.
//!
//! A [`CancelHandle`] fires once with a reason (`SIGTERM`, `shutdown`, a client's words); every
//! [`Cancel`] cloned from it then resolves. Model and tool calls race their work against it, so
//! the run ends at once with a result that keeps everything done: `interrupted` when it was
//! stopped ([`CancelHandle::cancel`]), status `cancelled` when it was cancelled on request
//! ([`CancelHandle::cancel_run`]).

use tokio::sync::watch;

/// Why a run's call ended before its work did: the run was cancelled, for this reason (a signal's
/// name, `shutdown`, `lease lost`). Callers turn it into an `interrupted` failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Cancelled {
    pub reason: String,
}

/// How a token fired: its reason, and whether the run was cancelled on request (it then ends
/// `cancelled`) rather than stopped (it ends `interrupted`, or is handed over).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stop {
    reason: String,
    requested: bool,
}

/// The sending side: fires once; later fires are ignored (the first reason stays).
#[derive(Debug, Clone)]
pub struct CancelHandle(watch::Sender<Option<Stop>>);

/// The receiving side, cheap to clone; one per run. `None`: a token that never fires, which
/// costs nothing to make or to wait on (every model and tool call races against its token).
#[derive(Debug, Clone)]
pub struct Cancel(Option<watch::Receiver<Option<Stop>>>);

impl CancelHandle {
    pub fn new() -> (CancelHandle, Cancel) {
        let (tx, rx) = watch::channel(None);
        (CancelHandle(tx), Cancel(Some(rx)))
    }

    /// Stops every run holding a [`Cancel`] of this handle, giving `reason` (it ends
    /// `interrupted`).
    pub fn cancel(&self, reason: &str) {
        self.fire(reason, false);
    }

    /// Cancels every run holding a [`Cancel`] of this handle on request, giving `reason`: it
    /// ends with the status `cancelled`.
    pub fn cancel_run(&self, reason: &str) {
        self.fire(reason, true);
    }

    fn fire(&self, reason: &str, requested: bool) {
        self.0.send_if_modified(|r| {
            if r.is_some() {
                return false;
            }
            *r = Some(Stop { reason: reason.to_owned(), requested });
            true
        });
    }

    pub fn token(&self) -> Cancel {
        Cancel(Some(self.0.subscribe()))
    }
}

impl Cancel {
    /// A token that never fires.
    pub fn never() -> Cancel {
        Cancel(None)
    }

    /// The reason, once cancelled or stopped.
    pub fn reason(&self) -> Option<String> {
        self.0.as_ref().and_then(|rx| rx.borrow().as_ref().map(|s| s.reason.clone()))
    }

    /// The reason, once cancelled on request ([`CancelHandle::cancel_run`]).
    pub fn requested(&self) -> Option<String> {
        self.0.as_ref().and_then(|rx| rx.borrow().as_ref().filter(|s| s.requested).map(|s| s.reason.clone()))
    }

    /// `work`'s outcome, or the reason when the run is cancelled first (checked first at every
    /// wake-up). A token that never fires just awaits `work`: nothing to race.
    pub async fn race<T>(&self, work: impl std::future::Future<Output = T>) -> Result<T, Cancelled> {
        if self.0.is_none() {
            return Ok(work.await);
        }
        // Boxed: the caller's future stays the size of `work` (its own is often boxed itself).
        let cancelled = Box::pin(self.cancelled());
        tokio::select! {
            biased;
            reason = cancelled => Err(Cancelled { reason }),
            r = work => Ok(r),
        }
    }

    /// Resolves with the reason once cancelled; never resolves otherwise.
    pub async fn cancelled(&self) -> String {
        let Some(rx) = &self.0 else { return std::future::pending().await };
        let mut rx = rx.clone();
        let reason = rx.wait_for(Option::is_some).await.ok().and_then(|r| r.as_ref().map(|s| s.reason.clone()));
        match reason {
            Some(reason) => reason,
            // The handle is gone without firing: nothing can cancel any more.
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fires_once_with_the_first_reason() {
        let (handle, cancel) = CancelHandle::new();
        assert_eq!(cancel.reason(), None);
        handle.cancel("SIGTERM");
        handle.cancel("SIGINT");
        assert_eq!(cancel.cancelled().await, "SIGTERM");
        assert_eq!(handle.token().reason().as_deref(), Some("SIGTERM"));
        assert_eq!(cancel.requested(), None);
        let (asked, token) = CancelHandle::new();
        asked.cancel_run("the user left");
        asked.cancel("SIGTERM");
        assert_eq!((token.reason().as_deref(), token.requested().as_deref()), (Some("the user left"), Some("the user left")));
        let never = Cancel::never();
        assert!(tokio::time::timeout(std::time::Duration::from_millis(20), never.cancelled()).await.is_err());
    }
}
