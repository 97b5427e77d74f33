//! `fabric serve`: the HTTP API over the runtime facade, with the run store, structured logs,
//! a bearer token, a graceful shutdown on SIGTERM/SIGINT, and a catalogue reload on SIGHUP.
//!
//! The checks of the settings, the logs and the signals are here; serving, the drain and the
//! handover are the library's ([`fabric::api::serve`]), which this turns the first signal into
//! the shutdown of (a second one exits at once).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use fabric::api::{ApiConfig, AppState};
use fabric::config::Settings;
use fabric::runtime::{BuildError, Durable};
use fabric::store::RunStore;

use crate::term::say;

/// Installs the log subscriber: `FABRIC_LOG` filters, `FABRIC_LOG_FORMAT` picks JSON or text.
fn init_logs(settings: &Settings) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_new(&settings.service.log_filter)
        .map_err(|e| format!("FABRIC_LOG: {e}"))?
        // sqlx warns about an unknown connect parameter with its value, which may be a secret.
        .add_directive("sqlx::postgres::options=error".parse().map_err(|e| format!("log filter: {e}"))?);
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false);
    let installed = if settings.service.log_json { builder.json().flatten_event(true).try_init() } else { builder.try_init() };
    installed.map_err(|e| format!("cannot install the log subscriber: {e}"))
}

/// Serves until a signal; `build` makes the runtime over the settings and the opened store.
pub async fn serve(
    listen: Option<&str>,
    no_auth: bool,
    build: impl FnOnce(Settings, Arc<dyn RunStore>) -> Result<Durable, BuildError>,
) -> std::io::Result<ExitCode> {
    let fail = |msg: String| {
        say(format_args!("fabric serve: {msg}"));
        Ok(ExitCode::from(2))
    };
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => return fail(format!("bad configuration: {e}")),
    };
    if let Err(e) = init_logs(&settings) {
        return fail(e);
    }
    let token = settings.service.api_token.clone();
    if token.is_none() && !no_auth {
        return fail(
            "FABRIC_API_TOKEN is not set: every endpoint but /healthz and /readyz needs a bearer token (or start with --no-auth, loopback only)".into(),
        );
    }
    if token.is_some() && no_auth {
        return fail("--no-auth and FABRIC_API_TOKEN contradict each other: unset the token, or drop --no-auth".into());
    }
    let default_listen = if no_auth { "127.0.0.1:8080" } else { "0.0.0.0:8080" };
    let listen = listen.unwrap_or(default_listen);
    // A host name (`localhost:8080`) is resolved; the first address is used.
    let addr: SocketAddr = match tokio::net::lookup_host(listen).await.map(|mut a| a.next()) {
        Ok(Some(a)) => a,
        Ok(None) => return fail(format!("--listen {listen}: no address")),
        Err(e) => return fail(format!("--listen {listen}: {e}")),
    };
    if token.is_none() && !addr.ip().is_loopback() {
        return fail(format!("--no-auth serves loopback addresses only; {addr} is not one"));
    }
    // A short token can be guessed by anyone who reaches the port; on loopback only this
    // machine's users can, so a short one (`change-me` in the README) is only worth a warning.
    if let Some(t) = &token
        && t.chars().count() < MIN_TOKEN_CHARS
    {
        if !addr.ip().is_loopback() {
            return fail(format!(
                "FABRIC_API_TOKEN is shorter than {MIN_TOKEN_CHARS} characters, too short for {addr}, which is not a loopback address: use a long random token (e.g. `openssl rand -hex 32`), or listen on loopback"
            ));
        }
        tracing::warn!(
            min_chars = MIN_TOKEN_CHARS,
            "FABRIC_API_TOKEN is shorter than 32 characters: accepted on a loopback address only; use a long random token (e.g. `openssl rand -hex 32`)"
        );
    }
    let store = match fabric::store::open(&settings.service.database_url).await {
        Ok(s) => s,
        // The error names the store (its URL without credentials or query string).
        Err(e) => return fail(format!("run store: {e}")),
    };
    let config = ApiConfig {
        token,
        max_in_flight: settings.service.max_runs_in_flight,
        wait_max: settings.service.wait_max,
        max_queued: settings.service.max_queued_runs,
        claim_poll: settings.service.claim_poll,
        body_timeout: settings.service.body_timeout,
        shutdown_grace: settings.service.shutdown_grace,
        ..ApiConfig::default()
    };
    let runtime = match build(settings, store) {
        Ok(r) => Arc::new(r),
        Err(e) => return fail(e.to_string()),
    };
    for w in runtime.runtime().warnings() {
        tracing::warn!(warning = %w, "configuration");
    }
    let ready = runtime.runtime().catalogue().routes().filter(|r| matches!(r, fabric::catalogue::RouteEntry::Ready(_))).count();
    tracing::info!(holder = runtime.holder().owner, lease_s = runtime.holder().lease.as_secs(), "claiming runs as this holder");
    let state = AppState::new(runtime, config);
    // This process's share of the fleet's work (leases renewed, queued and orphaned runs
    // claimed, cancels, retention, webhooks, the model limits), every loop owned by the replica.
    let replica = fabric::replica::Replica::start(state.clone());
    let listener = match listen_on(addr) {
        Ok(l) => l,
        Err(e) => return fail(format!("cannot listen on {addr}: {e}")),
    };
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => return fail(format!("cannot install the signal handlers: {e}")),
    };
    let local = listener.local_addr()?;
    tracing::info!(addr = %local, routes_ready = ready, catalogue_version = %state.runtime().version(), "listening");
    // The address on stdout, so scripts and tests that asked for port 0 learn the port.
    {
        use std::io::Write;
        let mut out = std::io::stdout();
        writeln!(out, "http://{local}")?;
        out.flush()?;
    }
    let reloads = state.clone();
    let shutdown = async move {
        // SIGHUP reloads the catalogue (the replica's catalogue loop does it); the others stop.
        let signal = signals
            .next_stop(|| {
                tracing::info!(signal = "SIGHUP", "reloading the catalogue");
                reloads.ask_reload();
            })
            .await;
        tracing::info!(signal, "shutting down: no new requests; running runs get up to the grace period");
        // A second signal stops the process at once, at any point of the shutdown (the drain,
        // the last commits, the spans' flush): this task lives as long as the runtime does.
        tokio::spawn(async move {
            let again = signals.next_stop(|| tracing::info!(signal = "SIGHUP", "shutting down: no reload")).await;
            tracing::warn!(signal = again, "second signal: stopping at once");
            std::process::exit(if again == "SIGINT" { 130 } else { 143 });
        });
    };
    fabric::api::serve(listener, state, shutdown).await;
    // After the drain (the leases were renewed until the runs finished or were handed over).
    replica.stop().await;
    Ok(ExitCode::SUCCESS)
}

/// The listen backlog of the HTTP listener: room for a burst of 1,000-odd clients connecting at
/// once (tokio's `bind` listens with std's 128, which drops their SYNs: each dropped one waits
/// out a 1 s retransmission). The kernel caps it at `net.core.somaxconn` (docs/operations.md).
const LISTEN_BACKLOG: i32 = 4096;

/// The HTTP listener on `addr`: bound as std binds one (`SO_REUSEADDR`, so a restart need not
/// wait out the old sockets' TIME_WAIT), with a backlog of [`LISTEN_BACKLOG`].
fn listen_on(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    socket.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(socket.into())
}

/// The shortest `FABRIC_API_TOKEN` accepted on an address that is not loopback (32 characters:
/// 128 bits and more from hex or base64, beyond guessing over the network).
const MIN_TOKEN_CHARS: usize = 32;

/// The signals of the server: SIGTERM and SIGINT stop it (drained), SIGHUP reloads the
/// catalogue (its default action would kill the process at once). Installed before the address
/// is printed: a signal sent as soon as the server says it listens must find the handlers in
/// place.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())?, hup: signal(SignalKind::hangup())? })
    }

    /// The next signal that stops the server (SIGTERM or SIGINT), calling `on_hup` at each
    /// SIGHUP before it.
    async fn next_stop(&mut self, mut on_hup: impl FnMut()) -> &'static str {
        loop {
            match self.next().await {
                "SIGHUP" => on_hup(),
                stop => return stop,
            }
        }
    }

    /// The next one of them.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
            _ = self.hup.recv() => "SIGHUP",
        }
    }
}
