"""Prints how many generated cases each differential parity test compared (CI shows it)."""

import contextlib
import sys
import threading
import time


def pytest_terminal_summary(terminalreporter):
    for module in list(sys.modules.values()):
        counts = getattr(module, "PARITY_COUNTS", None)
        if isinstance(counts, dict):
            for name, n in sorted(counts.items()):
                terminalreporter.write_line(f"parity: {n} {name} cases compared with the Python reference")


def pytest_configure(config):
    # A process started in the background by a shell without job control inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler; the Ctrl-C tests need
    # Python's own handler whatever started them.
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def ticking(every=0.005):
    """A thread counting while the block runs: the list of its ticks (it grows only while the
    GIL is free)."""
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(every)

    t = threading.Thread(target=tick)
    t.start()
    try:
        yield ticks
    finally:
        stop.set()
        t.join()


@contextlib.asynccontextmanager
async def ticking_async(every=0.005):
    """A task counting while the block runs: the list of its ticks (it grows only while the event
    loop is free)."""
    import asyncio

    ticks = []

    async def tick():
        while True:
            ticks.append(1)
            await asyncio.sleep(every)

    ticker = asyncio.create_task(tick())
    try:
        yield ticks
    finally:
        ticker.cancel()
