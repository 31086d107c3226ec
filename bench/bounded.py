"""Progress on stderr and an overall time limit, shared by every benchmark's entry point.

    parser = bounded.Parser(prog="python -m bench.example", description="...")
    parser.add_time_limit(default=600)
    args = parser.parse_args(argv)          # a bad flag: one line on stderr, exit 2

    def body(budget: bounded.Budget) -> int:
        done: list[float] = []
        budget.partial = lambda: f"{len(done)} of 10 rounds: {done}\\n"
        for i in range(10):
            budget.step("round", i + 1, 10)   # "python -m bench.example [3.2 s] round 2/10"
            done.append(measure())
        sys.stdout.write(report(done))
        return 0

    sys.exit(bounded.run(parser.prog, args.time_limit, body))

A benchmark that runs past its limit is cut: `step()` raises `Cut` at the next
step once the limit is reached (so every step must itself end, with timeouts of
its own: `budget.timeout(cap)` gives what is left of the limit, at most `cap`),
and a watchdog thread ends the process `GRACE_S` later if a step does not come
back. Either way what was measured so far (`budget.partial()`) goes to stdout,
one line on stderr says it was cut, every process the benchmark started is
ended, and the exit status is `EXIT_CUT`.

Nested benchmarks (`python -m bench` runs the others) share the one budget that
`run()` set up: `current()` returns it, or an unlimited one outside `run()`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

#: Exit status of a benchmark cut by its time limit (as coreutils `timeout`).
EXIT_CUT = 124
#: Exit status of a benchmark that failed (a server that did not start, a wrong result).
EXIT_FAILED = 1
#: How long after the limit a step that does not return is waited for.
GRACE_S = 20.0


class Cut(Exception):
    """The time limit was reached: raised at the next step, caught by `run()`."""


class Failed(Exception):
    """A benchmark that cannot go on, for a reason one line says (no traceback)."""


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag or value is one line on stderr (and exit 2), no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def add_time_limit(self, default: float | None) -> None:
        """`--time-limit SECONDS`; `default=None` on a sub-command leaves the main one's."""
        self.add_argument(
            "--time-limit",
            type=positive_float,
            default=argparse.SUPPRESS if default is None else default,
            metavar="SECONDS",
            help="stop after this long, print what was measured and exit "
            f"{EXIT_CUT}" + ("" if default is None else f" (default {default:g})"),
        )


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


class Budget:
    """The clock of one benchmark run: progress lines, the limit, and what it has so far."""

    def __init__(self, prog: str, limit_s: float | None) -> None:
        self.prog = prog
        self.limit_s = limit_s
        self.started = time.monotonic()
        #: Renders what was measured so far; printed to stdout when the run is cut.
        self.partial: Callable[[], str] | None = None
        self.last_step = "starting"
        #: Set by the watchdog: what the main thread raises from here on is the cut's doing.
        self.hard_cut = threading.Event()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        """Seconds left of the limit (infinite without one; 0 once past it)."""
        if self.limit_s is None:
            return float("inf")
        return max(0.0, self.limit_s - self.elapsed())

    def timeout(self, cap: float) -> float:
        """A timeout for one step: what is left of the limit plus the grace, at most `cap`."""
        return max(1.0, min(cap, self.left() + GRACE_S))

    def say(self, message: str) -> None:
        """One progress line on stderr, with the time since the start."""
        sys.stderr.write(f"{self.prog} [{self.elapsed():.1f} s] {message}\n")
        sys.stderr.flush()

    def step(self, what: str, done: int | None = None, total: int | None = None) -> None:
        """Say what comes next ("what n/N"); raise `Cut` if the limit has been reached."""
        counted = f" {done}/{total}" if done is not None and total is not None else ""
        self.last_step = f"{what.strip()}{counted}"
        if self.limit_s is not None and self.elapsed() >= self.limit_s:
            raise Cut(self.last_step)
        self.say(self.last_step)

    def check(self) -> None:
        """Raise `Cut` if the limit has been reached (for loops that print nothing)."""
        if self.limit_s is not None and self.elapsed() >= self.limit_s:
            raise Cut(self.last_step)

    def cut_message(self) -> str:
        return (
            f"{self.prog}: cut by --time-limit {self.limit_s:g} s after {self.elapsed():.1f} s, "
            f"at: {self.last_step}; what is above is partial\n"
        )


_current: Budget | None = None


def current() -> Budget:
    """The budget of the running benchmark (an unlimited, quiet one outside `run()`)."""
    return _current if _current is not None else Budget("bench", None)


def run(prog: str, limit_s: float | None, body: Callable[[Budget], int]) -> int:
    """Run `body` under a budget of `limit_s`; the exit status (cut: `EXIT_CUT`)."""
    global _current
    budget = Budget(prog, limit_s)
    _current = budget
    # Stopped from outside: unwind, so the servers and databases it started go too.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    watchdog = None
    if limit_s is not None:
        watchdog = threading.Timer(limit_s + GRACE_S, _hard_cut, (budget,))
        watchdog.daemon = True
        watchdog.start()
    try:
        return body(budget)
    except Cut:
        _write_partial(budget)
        sys.stderr.write(budget.cut_message())
        return EXIT_CUT
    except Failed as exc:
        sys.stderr.write(f"{prog}: {exc}\n")
        return EXIT_FAILED
    except Exception as exc:
        if budget.hard_cut.is_set():  # the watchdog ended the step's processes and says so
            time.sleep(GRACE_S)  # while it ends this one
            return EXIT_CUT
        # A step's own timeout, shortened to what was left of the limit (`timeout()`),
        # ran out: that is the limit, not a failure of the step.
        if budget.left() > 0 or "Timeout" not in type(exc).__name__:
            raise
        _write_partial(budget)
        sys.stderr.write(budget.cut_message())
        return EXIT_CUT
    except KeyboardInterrupt:
        _write_partial(budget)
        sys.stderr.write(f"{prog}: interrupted after {budget.elapsed():.1f} s\n")
        return 130
    finally:
        if watchdog is not None:
            watchdog.cancel()
        signal.signal(signal.SIGTERM, previous)
        _current = None


def _write_partial(budget: Budget) -> None:
    if budget.partial is None:
        return
    try:
        sys.stdout.write(budget.partial())
        sys.stdout.flush()
    except Exception as exc:  # what was measured may be half-written: say so, keep the cut
        sys.stderr.write(f"{budget.prog}: the partial results could not be shown: {exc!r}\n")


def _hard_cut(budget: Budget) -> None:
    """The watchdog: a step did not return within the grace; end everything from here."""
    budget.hard_cut.set()
    _write_partial(budget)
    sys.stderr.write(budget.cut_message().rstrip("\n") + " (a step did not return)\n")
    sys.stderr.flush()
    for pid in reversed(descendants(os.getpid())):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    time.sleep(0.5)
    for pid in descendants(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    os._exit(EXIT_CUT)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children first, then theirs), from /proc."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: list[int] = []
    queue = [pid]
    while queue:
        children = parents.get(queue.pop(0), [])
        found += children
        queue += children
    return found
