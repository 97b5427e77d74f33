//! `Runtime.stream`: a run's events, as they happen, to a Python iterator. The run executes on
//! the runtime's threads; its events cross a channel as JSON lines; `__next__` waits for the
//! next one with the GIL released, looking at Python's signals every 100 ms. A stream closed
//! before the run's end (`close()`, a `with` block left, or the iterator dropped: a `for` loop
//! left with `break`) cancels the run.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fabric::cancel::CancelHandle;
use fabric::events::{Event, EventSink};
use pyo3::prelude::*;
use serde_json::Value;

use crate::{FabricError, StartError, error, from_json};

/// What the run sends the iterator: its events, then how it ended.
#[derive(Debug)]
enum Sent {
    Event(String),
    /// The result object of `fabric run` (no `events`: they were streamed), or why the run did
    /// not start: (reason class, message).
    Done(Result<Value, (&'static str, String)>),
}

/// The events of a run into the channel, each as its JSON line.
struct ChannelSink(Mutex<Sender<Sent>>);

impl EventSink for ChannelSink {
    fn emit(&self, e: &Event) {
        let mut line = Vec::with_capacity(256);
        e.write_json_line(&mut line);
        let line = String::from_utf8(line).unwrap_or_default();
        // The iterator gone (closed): the run is being cancelled, its last events go nowhere.
        let _ = self.0.lock().unwrap_or_else(PoisonError::into_inner).send(Sent::Event(line));
    }
}

/// The reason a run is cancelled with when its stream is closed before its end.
const CLOSED: &str = "the stream was closed";

/// A run's events as it goes (`Runtime.stream`): an iterator of dicts, ending after the run's
/// last event (`run.completed`, `run.failed`, `run.cancelled` or `run.awaiting_input`).
#[pyclass(module = "fabric_runtime._native")]
#[derive(Debug)]
pub struct RunStream {
    events: Mutex<Receiver<Sent>>,
    handle: CancelHandle,
    /// The result once the run ended; the stream is over then.
    result: Mutex<Option<Value>>,
    /// The runtime's threads, kept while the stream lives (its `Runtime` may be gone).
    tokio: Option<Arc<tokio::runtime::Runtime>>,
}

impl RunStream {
    /// Starts `run` on `tokio` with a sink into the stream; `handle` cancels it.
    pub fn start<F>(tokio: Arc<tokio::runtime::Runtime>, handle: CancelHandle, run: impl FnOnce(Arc<dyn EventSink>) -> F) -> RunStream
    where
        F: Future<Output = Result<Value, (&'static str, String)>> + Send + 'static,
    {
        let (tx, rx) = channel();
        let done = tx.clone();
        let run = run(Arc::new(ChannelSink(Mutex::new(tx))));
        tokio.spawn(async move {
            let _ = done.send(Sent::Done(run.await));
        });
        RunStream { events: Mutex::new(rx), handle, result: Mutex::new(None), tokio: Some(tokio) }
    }

    fn ended(&self) -> bool {
        self.result.lock().unwrap_or_else(PoisonError::into_inner).is_some()
    }
}

impl Drop for RunStream {
    fn drop(&mut self) {
        if !self.ended() {
            self.handle.cancel_run(CLOSED);
        }
        crate::shut_down(self.tokio.take());
    }
}

#[pymethods]
impl RunStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next event, waiting for it with the GIL released; `StopIteration` after the last.
    /// Ctrl-C (on the main thread) interrupts the run and raises `KeyboardInterrupt`.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        if self.ended() {
            return Ok(None);
        }
        loop {
            let got = py.detach(|| self.events.lock().unwrap_or_else(PoisonError::into_inner).recv_timeout(Duration::from_millis(100)));
            match got {
                Ok(Sent::Event(line)) => return from_json(py, &line).map(Some),
                Ok(Sent::Done(Ok(result))) => {
                    *self.result.lock().unwrap_or_else(PoisonError::into_inner) = Some(result);
                    return Ok(None);
                }
                Ok(Sent::Done(Err((class, message)))) => {
                    *self.result.lock().unwrap_or_else(PoisonError::into_inner) = Some(Value::Null);
                    return Err(error::<StartError>(py, class, message));
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(e) = py.check_signals() {
                        self.handle.cancel("KeyboardInterrupt");
                        return Err(e);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return Err(error::<FabricError>(py, "runtime", "the runtime was shut down during the run".into())),
            }
        }
    }

    /// Cancels the run unless it ended (status `cancelled`, reason `the stream was closed`); the
    /// events it still sends can be read on. Harmless after the end.
    fn close(&self) {
        if !self.ended() {
            self.handle.cancel_run(CLOSED);
        }
    }

    /// The result object of `fabric run` once the run ended (without `events`), else `None`.
    #[getter]
    fn result<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        match &*self.result.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(r) if !r.is_null() => from_json(py, &r.to_string()).map(Some),
            _ => Ok(None),
        }
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __exit__(&self, _kind: Option<&Bound<'_, PyAny>>, _value: Option<&Bound<'_, PyAny>>, _tb: Option<&Bound<'_, PyAny>>) {
        self.close();
    }
}
