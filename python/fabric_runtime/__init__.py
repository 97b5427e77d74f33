"""Fabric Runtime embedded in Python.

The runtime itself is Rust (``fabric_runtime._native``); this package adds only what Python
needs around it: an ``async`` run that does not block the event loop, and an ``async`` stream of
a run's events.

    from fabric_runtime import Runtime
    rt = Runtime("routes", "prompt-packs", llm_stub=True)
    result = rt.run("support-triage", {"ticket": "I was charged twice"})
    print(result["status"], result["output"])

    for event in rt.stream("support-triage", {"ticket": "I was charged twice"}):
        if event["type"] == "run.llm.delta":
            print(event["text"], end="", flush=True)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from . import _native
from ._native import CancelToken, ConfigError, FabricError, RunStream, StartError, ValidationError, parse_model, validate

__all__ = ["Runtime", "CancelToken", "RunStream", "validate", "parse_model", "FabricError", "ConfigError", "StartError", "ValidationError", "__version__"]
__version__: str = _native.__version__


class Runtime(_native.Runtime):
    """A catalogue of routes with its prompt packs and settings (see ``fabric_runtime._native``)."""

    async def run_async(
        self, route_id: str, goal: dict[str, Any], *, prefetch: list[str] | None = None, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """``run`` on a worker thread: the event loop goes on while the run executes. Cancelling
        the awaiting task (``wait_for``, ``TaskGroup``) interrupts the run itself."""
        token = CancelToken()
        try:
            return await asyncio.to_thread(self.run, route_id, goal, prefetch=prefetch, cancel=token, idempotency_key=idempotency_key)
        except asyncio.CancelledError:
            token.cancel("cancelled")
            raise

    async def stream_async(
        self, route_id: str, goal: dict[str, Any], *, prefetch: list[str] | None = None, cancel: CancelToken | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """``stream`` for asyncio: each event is awaited on a worker thread, so the event loop
        goes on while the run executes. Leaving the ``async for`` early (``break``, an
        exception, the task cancelled) closes the stream, which cancels the run."""
        stream = self.stream(route_id, goal, prefetch=prefetch, cancel=cancel)
        try:
            while True:
                event = await asyncio.to_thread(next, stream, None)
                if event is None:
                    return
                yield event
        finally:
            stream.close()
