"""Prints how many generated cases each differential parity test compared (CI shows it)."""

import sys


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
