import os
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Callable

__version__: str

class FabricError(Exception):
    """Every error of the runtime."""

    reason_class: str

class ConfigError(FabricError):
    """The runtime could not be built: bad settings, an unusable stub directory, a tool that is not callable."""

class StartError(FabricError):
    """A run could not start (unknown route, wrong fleet, broken route, ...); nothing ran."""

class ValidationError(FabricError):
    """A reply a stage would refuse: ``reason_class`` is ``invalid_json`` or ``schema_validation``."""

class Runtime:
    def __init__(
        self,
        catalogue: str | os.PathLike[str] | list[str | os.PathLike[str]] | tuple[str | os.PathLike[str], ...] = "routes",
        prompt_packs: str | os.PathLike[str] | list[str | os.PathLike[str]] | tuple[str | os.PathLike[str], ...] = "prompt-packs",
        *,
        stub_dir: str | os.PathLike[str] | None = None,
        tools: dict[str, Callable[..., Any]] | None = None,
        store: str | None = None,
        **settings: Any,
    ) -> None:
        """Loads the catalogue. ``catalogue`` and ``prompt_packs`` are layered directories, later
        ones adding definitions to earlier ones: a list (or tuple) of paths, or a ``str`` written
        ``"a:b"`` as ``--catalogue`` takes it (an ``os.PathLike`` is one directory). A directory
        that does not exist raises ``ConfigError`` naming it. ``settings`` are ``FABRIC_*`` settings in lower case without the
        prefix (``llm_stub=True``, ``llm_stub_latency_ms=50``) or any variable by its own name
        (``OLLAMA_MODEL="ollama:qwen"``); the process environment fills in the rest, as for
        ``fabric``. ``tools`` maps catalogue capabilities without ``invoke`` to Python callables
        (sync or async), called with the arguments as keywords, returning a JSON value. A setting
        that is not one raises ``ConfigError``. ``store`` is a run store URL
        (``sqlite://runs.db``, ``postgres://...``), needed by ``idempotency_key``."""
    def evaluate(
        self,
        dataset: str | os.PathLike[str] | dict[str, Any] | list[Any],
        evaluators: list[dict[str, Any]] | None = None,
        *,
        repeat: int = 1,
        concurrency: int = 4,
    ) -> dict[str, Any]:
        """Runs every case of ``dataset`` (a path, or the dataset as a dict or list: ours,
        pydantic_evals' or LangSmith's) as an experiment recorded in ``store``, graded by its
        evaluators and ``evaluators`` (ours, as dicts); returns the report (docs/evals.md). A
        dataset that does not fit the catalogue raises ``StartError`` (``invalid_dataset``)
        with every problem located, before any model call; without ``store``, ``no_store``."""
    def run(
        self,
        route_id: str,
        goal: dict[str, Any],
        *,
        prefetch: list[str] | None = None,
        cancel: CancelToken | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Runs a route to its end with the GIL released; the result object of ``fabric run``,
        with its ``events``. Ctrl-C (on the main thread) interrupts it (``interrupted``);
        ``cancel`` cancels it (status ``cancelled``). With ``idempotency_key`` (1 to 255 visible
        ASCII characters; needs ``store``) the run is recorded in the store, once per key: a later
        call with the same key and arguments, from this or any process of the store, runs nothing
        and returns that run once it ended or asked (``idempotent_replayed`` true); other
        arguments raise ``StartError`` (``idempotency_key_reused``). Raises ``StartError`` when the
        run cannot start (``invalid_goal`` for a goal that is not a JSON object)."""
    def stream(
        self,
        route_id: str,
        goal: dict[str, Any],
        *,
        prefetch: list[str] | None = None,
        cancel: CancelToken | None = None,
    ) -> RunStream:
        """Starts a run and returns its events as they happen (``RunStream``, an iterator of the
        dicts ``run`` returns in ``events``, ``run.llm.delta`` included: a run streamed is
        watched, so its streaming stages send their text), ending after the run's last event.
        Arguments as ``run``'s; no ``idempotency_key`` (a run recorded once per key may have
        ended before: ``run`` gives its stored events). Raises ``StartError`` when the route
        cannot run. Closing the stream before the end (``close()``, leaving ``with``, or
        dropping it: ``break`` out of the ``for`` loop) cancels the run (status ``cancelled``,
        reason ``the stream was closed``); with ``cancel`` given, through that token."""
    def create_schedule(
        self,
        route_id: str,
        goal: dict[str, Any],
        cron: str,
        *,
        timezone: str | None = None,
        overlap: str | None = None,
        catchup: str | None = None,
        catchup_window: str | None = None,
        max_catchup_runs: int | None = None,
        model_profile: str | None = None,
        session_id: str | None = None,
        webhook_url: str | None = None,
        paused: bool = False,
    ) -> dict[str, Any]:
        """Stores a schedule on the run store (`store=`); a `fabric serve` on it fires the route on
        the cron expression once per fire time. StartError (`invalid_schedule`, `no_store`, a
        route's reason class) when refused."""
    def schedules(self) -> list[dict[str, Any]]:
        """The schedules of the run store, by id, each with its `next_fires`."""
    def schedule_fires(self, schedule_id: str, limit: int = 50) -> list[dict[str, Any]]:
        """A schedule's fire records, newest first."""
    def routes(self) -> list[str]:
        """The routes that can run here."""
    @property
    def catalogue_version(self) -> str:
        """The catalogue version runs start on: the SHA-256 (64 hex digits) of the route files,
        prompt packs and, with the stub, its scripts; the same files give the same version
        wherever they are read, and a run recorded in a store keeps it."""

class RunStream(Iterator[dict[str, Any]]):
    """A run's events as they happen (``Runtime.stream``). ``next`` waits with the GIL released;
    Ctrl-C (on the main thread) interrupts the run and raises ``KeyboardInterrupt``. Events are
    kept for the reader however slowly it reads (a run never waits for its stream)."""

    def __iter__(self) -> RunStream: ...
    def __next__(self) -> dict[str, Any]: ...
    def close(self) -> None:
        """Cancels the run unless it ended; harmless after the end."""
    @property
    def result(self) -> dict[str, Any] | None:
        """The result object of ``fabric run`` (without ``events``) once the run ended, else ``None``."""
    def __enter__(self) -> RunStream: ...
    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None: ...

class CancelToken:
    """Cancels the run it is given to: the run ends with the status ``cancelled`` (reason class
    ``cancelled``, a last ``run.cancelled`` event with the reason), its call in flight aborted,
    keeping what it did. Thread-safe; the first reason stays."""

    def __init__(self) -> None: ...
    def cancel(self, reason: str = "cancelled") -> None: ...

def validate(schema: dict[str, Any], raw: str) -> str:
    """What a stage with ``schema`` makes of the reply ``raw``: the slot value, or
    ``ValidationError``."""

def parse_model(s: str) -> tuple[str, str] | None:
    """A model string as LangChain's ``init_chat_model`` reads it: ``(provider, model)``, or
    ``None`` when no provider can be told."""
