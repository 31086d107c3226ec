"""The reference server's CLI on a clock a test moves: ``python -m tests.support.clocked_server``.

python -m tests.support.clocked_server --clock-offset-file PATH [clienttools-server flags]

The server's time (TTL, ledger times, the server_time tool) runs ahead of the
wall clock by the seconds written in PATH, re-read on every reading, so a test
can make "an hour later" happen to a server process it may also kill. Timers
(tool timeouts, pings) keep real time. Only tests use this; the production CLI
has no such hook.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clienttools_server.__main__ import config_from_args, serve
from tests.support.clock import OffsetClock


def main(argv: list[str]) -> None:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--clock-offset-file", type=Path, required=True)
    args, rest = own.parse_known_args(argv)
    config = config_from_args(rest)
    serve(config, clock=OffsetClock(args.clock_offset_file))


if __name__ == "__main__":
    main(sys.argv[1:])
