//! [`serve`]: the service on a listener until a shutdown future resolves, then the drain.
//!
//! Shaped like mini-redis's `server::run`: the caller binds the listener (port 0 in tests) and
//! provides the shutdown as a future, so the service is driven without signals. Turning
//! SIGTERM, SIGINT or SIGHUP into that future, and a second signal into an exit, is the binary's
//! (`fabric serve`): the library handles no signals and ends no process.

use std::future::Future;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use super::{AppState, router};

/// How long a client may take to send a request's headers: past it the connection is closed
/// (a slow client holding sockets open, slowloris). axum::serve has no such timeout.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What a stopping server gives, past the grace period, to the interrupted runs' last commits
/// and to the connections still open, before it closes them.
const AFTER_GRACE: Duration = Duration::from_secs(15);

/// Serves `state`'s [`router`] on `listener` (HTTP/1.1, the headers of a request within
/// 10 s) until `shutdown` resolves; then accepts nothing more and drains
/// ([`AppState::drain`], over the configured `shutdown_grace`): runs in flight get the grace
/// period, those still executing at its end are handed over, and event streams end. Open
/// connections finish their request in flight, and are closed at the latest 15 s after the
/// grace period, since a client that never finishes its request must not keep a stopping server
/// alive. Returns when the server has stopped.
pub async fn serve(listener: TcpListener, state: AppState, shutdown: impl Future<Output = ()>) {
    let grace = state.inner.config.shutdown_grace;
    let (drained_tx, drained_rx) = tokio::sync::oneshot::channel();
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let drain_state = state.clone();
    let stop = async move {
        shutdown.await;
        let _ = stopping_tx.send(());
        // Apart from the connections' shutdown: the streams they carry end only with the drain.
        tokio::spawn(async move {
            let handed = drain_state.drain(grace).await;
            if handed > 0 {
                tracing::warn!(
                    runs = handed,
                    "runs still executing at the end of the grace period are handed over: another replica (or the next start) continues them from their journal"
                );
            }
            let _ = drained_tx.send(());
        });
    };
    let deadline = async move {
        if stopping_rx.await.is_ok() {
            tokio::time::sleep(grace + AFTER_GRACE).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let connections = accept_until(listener, router(state), stop).await;
    tokio::select! {
        _ = connections.shutdown() => {}
        _ = deadline => tracing::warn!("connections still open at the shutdown deadline were closed"),
    }
    let _ = tokio::time::timeout(AFTER_GRACE, drained_rx).await;
    tracing::info!("stopped");
}

/// Serves HTTP/1.1 connections until `stop` resolves; the connections still open are returned,
/// to be shut down gracefully (each finishes its request in flight).
async fn accept_until(listener: TcpListener, app: axum::Router, stop: impl Future<Output = ()>) -> GracefulShutdown {
    let connections = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, mostly: wait a little rather than spin.
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => return connections,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .serve_connection(TokioIo::new(stream), service);
        let connection = connections.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection");
            }
        });
    }
}
