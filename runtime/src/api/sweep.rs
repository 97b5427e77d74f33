//! The retention sweeper of a replica (`FABRIC_RUN_RETENTION`, `FABRIC_AWAITING_RETENTION`):
//! every [`sweep_every`] it cancels the runs that awaited the user too long (reason `expired`)
//! and deletes the ended runs past the retention, in short batches ([`Durable::prune`]); the
//! store lets one replica sweep at a time. Nothing runs when neither is set.

use std::time::Duration;

use super::AppState;

/// How often a replica sweeps: a tenth of the shortest retention, from 1 s to a minute.
pub fn sweep_every(retentions: &[Duration]) -> Duration {
    let shortest = retentions.iter().min().copied().unwrap_or(Duration::from_secs(60));
    (shortest / 10).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

impl AppState {
    /// For ever, while a retention is set: one sweep every [`sweep_every`].
    pub async fn sweep(self) {
        let runtime = self.inner.durable.clone();
        let service = &runtime.runtime().settings().service;
        let (ended, awaiting) = (service.run_retention, service.awaiting_retention);
        let set: Vec<Duration> = [ended, awaiting].into_iter().flatten().collect();
        if set.is_empty() {
            return;
        }
        let mut tick = tokio::time::interval(sweep_every(&set));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.inner.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            if let Some(age) = awaiting {
                match runtime.expire_awaiting(age, self.inner.metrics.clone()).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(runs = n, "retention: cancelled runs that awaited the user past FABRIC_AWAITING_RETENTION (reason `expired`)"),
                    Err(e) => tracing::error!(error = %e, "retention: expiring awaiting runs"),
                }
            }
            if let Some(age) = ended {
                match runtime.prune(age, false).await {
                    Ok(0) => {}
                    Ok(n) => {
                        self.inner.metrics.pruned(n);
                        tracing::info!(runs = n, "retention: deleted ended runs past FABRIC_RUN_RETENTION");
                    }
                    Err(e) => tracing::error!(error = %e, "retention: deleting ended runs"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_every_tenth_of_the_shortest_retention_within_a_second_and_a_minute() {
        let s = Duration::from_secs;
        assert_eq!(sweep_every(&[s(2)]), s(1));
        assert_eq!(sweep_every(&[s(300), s(86_400)]), s(30));
        assert_eq!(sweep_every(&[s(30 * 86_400)]), s(60));
    }
}
