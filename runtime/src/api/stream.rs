//! `GET /v1/runs/{id}/events`: a run's events as Server-Sent Events, from the store and then
//! the live tail (or the run's shared store poller when another replica executes it), bounded
//! by the stream caps and the stall limit, ended cleanly at a shutdown.

use super::*;

/// A run's events as Server-Sent Events: from the start, or after `Last-Event-ID`; live until
/// the run ends or asks (or a shutdown's grace period is over: then a `: shutting down` comment
/// ends it). Each event's id is its `seq`. With `format=ui-message-stream`, the same events as
/// the Vercel AI SDK's UI message stream (docs/ui-message-stream.md).
#[utoipa::path(get, path = "/v1/runs/{run_id}/events", params(("run_id" = String, Path, description = RUN_ID_PARAM), EventsParams, ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this seq (0 to 9223372036854775807)")),
    responses((status = 200, description = "`text/event-stream`; `data` is the event JSON, `event` its type. With `format=ui-message-stream`: header `x-vercel-ai-ui-message-stream: v1`, `data` is a UI message chunk (`start`, `start-step`, `text-start`, `text-delta`, `text-end`, `data-fabric-*`, `finish-step`, `error`, `abort`, `finish`) or `[DONE]`, no `event`; the `id` of an event's last chunk is its `seq`, of the chunks before it `seq - 1`", content_type = "text/event-stream",
            headers(("x-vercel-ai-ui-message-stream" = String, description = "`v1`, with `format=ui-message-stream`"))), (status = 400, description = "A `Last-Event-ID` that is not a seq, a `format` that is neither `events` nor `ui-message-stream`, or a path that does not parse", body = ErrorBody), (status = 404, body = ErrorBody), (status = 429, description = "Too many event streams open, of this run (32) or in all (4096); see `Retry-After`", body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn run_events(
    State(state): State<AppState>,
    RunIdPath(run_id): RunIdPath,
    headers: HeaderMap,
    params: Result<Query<EventsParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let ui = query(params)?.format == EventsFormat::UiMessageStream;
    let run_id = run_id.as_str().to_owned();
    let after: u64 = match headers.get("last-event-id") {
        None => 0,
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse().ok())
            // A seq is an integer column of the store: past its range, no event is after it.
            .filter(|n| *n <= i64::MAX as u64)
            .ok_or_else(|| ApiError::new(ErrorCode::InvalidRequest, "`Last-Event-ID` must be the `seq` of an event (a whole number)"))?,
    };
    let store = state.inner.durable.store().clone();
    if store.get_run(&run_id).await.map_err(store_error)?.is_none() {
        return Err(no_run(&run_id));
    }
    let config = &state.inner.config;
    let slot = state.inner.stream_slots.take(&run_id, config.max_run_streams, config.max_event_streams).ok_or_else(|| {
        let mut e = ApiError::new(ErrorCode::TooManyStreams, "too many event streams are open (of this run, or in all); retry shortly");
        e.retry_after = Some(5);
        e
    })?;
    let (tx, rx) = tokio::sync::mpsc::channel::<SseEvent>(64);
    // The UI message stream reads the run from its start, silent up to `after`, so that a resume
    // opens again what was open there.
    let (out, after) = match ui {
        true => (Out { tx, stall: config.stream_stall, frames: Some(Box::new(ui_stream::UiStream::new(&run_id, after))) }, 0),
        false => (Out { tx, stall: config.stream_stall, frames: None }, after),
    };
    spawn_pump(&state, run_id, after, out, slot);
    let sse = Sse::new(until_closing(&state, rx)).keep_alive(KeepAlive::default());
    Ok(match ui {
        true => ([ui_stream::HEADER, ("x-accel-buffering", "no")], sse).into_response(),
        false => sse.into_response(),
    })
}

/// Sends a run's events after `after` through `out` in a task of its own, holding `slot`: from
/// the store and then the live tail (or the run's shared store poller when another replica
/// executes it), until the run ends or asks, or the client goes (the run's event stream and
/// the A2A adapter's streams).
pub(super) fn spawn_pump(state: &AppState, run_id: String, after: u64, mut out: Out, slot: follow::StreamSlot) {
    let store = state.inner.durable.store().clone();
    let follower = state.clone();
    // The stream's slot is given back when the client goes, whatever the task waits on then (a
    // live run's next event, a poller's next read): hyper drops the body, `rx` with it, as soon
    // as it reads the connection's end, and `closed` fires. Waiting only on sends held the slot
    // of a gone client for as long as its run made no event (issue 46).
    let gone = out.tx.clone();
    let stream = async move {
        let mut last = after;
        loop {
            // The live segment first, then the record: an event is in one or the other (a
            // segment leaves the registry only after its last commit).
            let live = follower.inner.live.get(&run_id);
            // Not executing here: the run's shared poller, joined before the store is read, so
            // that what is written meanwhile comes through it.
            let feed = live.is_none().then(|| follower.inner.feeds.follow(store.clone(), &run_id));
            let status = match store.get_run(&run_id).await {
                Ok(Some(run)) => run.status,
                _ => return,
            };
            let Ok(stored) = store.events_after(&run_id, last).await else { return };
            for e in stored {
                last = e.seq;
                if !out.send(e.seq, &e.kind, &e.body).await {
                    return;
                }
            }
            if let Some(live) = live {
                let mut ticks = live.subscribe();
                loop {
                    let (events, ended) = live.events_after(last);
                    for e in events {
                        last = e.seq;
                        if !out.send(e.seq, e.kind, &e.json).await {
                            return;
                        }
                    }
                    // Ended: every event of the segment was in that read.
                    if ended {
                        break;
                    }
                    let _ = ticks.changed().await;
                }
                // A segment that ended without recording its end (its lease was lost, its write
                // failed) streamed events the store does not hold; whoever continues the run
                // writes its own from the last recorded one, and the stream goes on from there
                // (those `seq`s come again, with what the run actually did).
                if let Ok(Some(run)) = store.get_run(&run_id).await
                    && run.status.is_pending()
                    && let Ok(next) = store.next_seq(&run_id).await
                {
                    last = last.min(next.saturating_sub(1));
                }
                continue;
            }
            // Not executing here: queued, or executed by another replica; followed through the
            // shared poller until it ends or asks, or until this process executes it.
            if !status.is_pending() {
                return;
            }
            let Some(mut feed) = feed else { continue };
            match follow_feed(&follower, &run_id, &mut feed, &mut last, &mut out, &*store).await {
                Followed::Ended => return,
                Followed::Again => continue,
            }
        }
    };
    tokio::spawn(async move {
        let _slot = slot;
        tokio::select! {
            () = stream => {}
            () = gone.closed() => {}
        }
    });
}

/// `GET /v1/runs/{id}/events?format=`: how the events are sent.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct EventsParams {
    /// `events` (the default): each event as it is. `ui-message-stream`: the Vercel AI SDK's UI
    /// message stream (docs/ui-message-stream.md), header `x-vercel-ai-ui-message-stream: v1`.
    #[serde(default)]
    #[param(inline)]
    pub format: EventsFormat,
}

/// The format of an event stream.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub(super) enum EventsFormat {
    #[default]
    Events,
    UiMessageStream,
}

/// Where a stream's events go: the body's channel, within the stall limit; each event as it
/// is, or translated (into the UI message stream, into A2A's stream responses).
pub(super) struct Out {
    pub tx: tokio::sync::mpsc::Sender<SseEvent>,
    pub stall: Duration,
    pub frames: Option<Box<dyn Frames>>,
}

/// A translation of a run's events into the frames of another stream.
pub(super) trait Frames: Send {
    /// The frames of one event (none for an event the stream does not show).
    fn push(&mut self, seq: u64, kind: &str, json: &str) -> Vec<SseEvent>;
    /// The stream is over: nothing more is sent.
    fn ended(&self) -> bool;
}

impl Frames for ui_stream::UiStream {
    fn push(&mut self, seq: u64, kind: &str, json: &str) -> Vec<SseEvent> {
        ui_stream::UiStream::push(self, seq, kind, json).into_iter().map(|f| SseEvent::default().id(f.id.to_string()).data(f.data)).collect()
    }

    fn ended(&self) -> bool {
        ui_stream::UiStream::ended(self)
    }
}

impl Out {
    /// Sends an event; false when the client went (or took nothing for the stall limit), or the
    /// UI message ended: the stream ends.
    pub async fn send(&mut self, seq: u64, kind: &str, json: &str) -> bool {
        let Some(frames) = &mut self.frames else {
            return send_within(&self.tx, SseEvent::default().id(seq.to_string()).event(kind).data(json), self.stall).await;
        };
        for frame in frames.push(seq, kind, json) {
            if !send_within(&self.tx, frame, self.stall).await {
                return false;
            }
        }
        !frames.ended()
    }
}

/// How following a run through its shared poller stopped.
pub(super) enum Followed {
    /// The run ended or asked and every event of it was sent; or the client went.
    Ended,
    /// Read the store again: the run executes here now, or this stream fell behind the poller,
    /// or the poller stopped (a store error).
    Again,
}

/// What became of one event handed on by a poller.
pub(super) enum Sent {
    /// Sent, or one this stream had already.
    Ok,
    /// Not the next `seq`: the events in between are read from the store.
    Gap,
    /// The client went.
    Gone,
}

/// Sends an event a poller handed on, if it is the next one (`seq` right after `last`).
pub(super) async fn send_next(e: &crate::store::StoredEvent, last: &mut u64, out: &mut Out) -> Sent {
    if e.seq > last.saturating_add(1) {
        return Sent::Gap;
    }
    send_after(e, last, out).await
}

/// Sends an event read from the store (the record: whatever its `seq`s), if it is after `last`.
pub(super) async fn send_after(e: &crate::store::StoredEvent, last: &mut u64, out: &mut Out) -> Sent {
    if e.seq <= *last {
        return Sent::Ok;
    }
    *last = e.seq;
    if out.send(e.seq, &e.kind, &e.body).await { Sent::Ok } else { Sent::Gone }
}

/// Hands an event to a stream's body; false when the client went, or took nothing for `stall`
/// (its connection open, its reading stopped: the stream ends, and its place is given back).
pub(super) async fn send_within(tx: &tokio::sync::mpsc::Sender<SseEvent>, event: SseEvent, stall: Duration) -> bool {
    matches!(tokio::time::timeout(stall, tx.send(event)).await, Ok(Ok(())))
}

/// Sends a run's events as its shared poller hands them on, each once and in order, until the
/// run ends or asks (then every event of it was sent).
pub(super) async fn follow_feed(
    state: &AppState,
    run_id: &str,
    feed: &mut follow::Follower,
    last: &mut u64,
    out: &mut Out,
    store: &dyn crate::store::RunStore,
) -> Followed {
    use tokio::sync::broadcast::error::{RecvError, TryRecvError};
    loop {
        tokio::select! {
            biased;
            _ = out.tx.closed() => return Followed::Ended,
            e = feed.events.recv() => match e {
                Ok(e) => match send_next(&e, last, out).await {
                    Sent::Ok => {}
                    Sent::Gone => return Followed::Ended,
                    // This stream joined between the poller's reads: the store has the rest.
                    Sent::Gap => {
                        let Ok(stored) = store.events_after(run_id, *last).await else { return Followed::Ended };
                        for e in stored {
                            if let Sent::Gone = send_after(&e, last, out).await {
                                return Followed::Ended;
                            }
                        }
                    }
                },
                Err(RecvError::Lagged(_) | RecvError::Closed) => return Followed::Again,
            },
            changed = feed.state.changed() => {
                if changed.is_err() {
                    return Followed::Again;
                }
                let now = *feed.state.borrow_and_update();
                if state.inner.live.get(run_id).is_some() {
                    return Followed::Again;
                }
                // What the poller handed on so far; then the store for what it handed on before
                // this stream joined it (or between its first read and this stream's own), so no
                // event waits for the next one to be seen.
                loop {
                    match feed.events.try_recv() {
                        Ok(e) => match send_next(&e, last, out).await {
                            Sent::Ok => {}
                            Sent::Gap => break,
                            Sent::Gone => return Followed::Ended,
                        },
                        Err(TryRecvError::Empty | TryRecvError::Closed) => break,
                        Err(TryRecvError::Lagged(_)) => return Followed::Again,
                    }
                }
                if *last < now.last {
                    let Ok(stored) = store.events_after(run_id, *last).await else { return Followed::Ended };
                    for e in stored {
                        if let Sent::Gone = send_after(&e, last, out).await {
                            return Followed::Ended;
                        }
                    }
                }
                // Ended or asked: every event of it was at most `now.last`, and is sent.
                if now.ended {
                    return Followed::Ended;
                }
            }
        }
    }
}

/// An event stream's events until the feeding task ends it, or until a shutdown's grace period
/// is over: then one last `: shutting down` comment (a whole SSE block, so a client sees a clean
/// end, not a chunk cut in the middle) and the end of the body.
pub(super) fn until_closing(state: &AppState, rx: tokio::sync::mpsc::Receiver<SseEvent>) -> impl Stream<Item = Result<SseEvent, Infallible>> + use<> {
    let closing = state.inner.closing.subscribe();
    futures_util::stream::unfold(Some((rx, closing)), |open| async move {
        let (mut rx, mut closing) = open?;
        let next = tokio::select! {
            biased;
            // Err: the state is gone, which is a shutdown too.
            _ = closing.wait_for(|c| *c) => None,
            e = rx.recv() => Some(e),
        };
        match next {
            None => Some((Ok(SseEvent::default().comment("shutting down")), None)),
            Some(e) => e.map(|e| (Ok(e), Some((rx, closing)))),
        }
    })
}
