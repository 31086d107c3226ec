"""``clienttools-server token``: print one signed token for a server started with ``--secret``.

    $ clienttools-server token --secret "$SECRET" --principal alice --session desk --ttl 3600
    ct1.eyJleHAiOjE3...

stdout gets the token and nothing else (so ``TOKEN=$(clienttools-server token ...)``
works); a bad flag is one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from .wire.auth import MAX_ID, check_secret, mint_token


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (no usage block): ``PROG: error: MESSAGE``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _id(what: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if not 0 < len(text) <= MAX_ID:
            raise argparse.ArgumentTypeError(f"{what} must be 1 to {MAX_ID} characters")
        return text

    return parse


def secret_type(text: str) -> str:
    """argparse's type for a ``--secret``: long enough to sign with."""
    try:
        return check_secret(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ttl(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, not {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="clienttools-server token",
        description="Print a signed token that a server started with the same --secret "
        "accepts: '?token=TOKEN' on the WebSocket, 'Authorization: Bearer TOKEN' on HTTP.",
    )
    p.add_argument("--secret", required=True, type=secret_type, help="the server's --secret")
    p.add_argument(
        "--principal", required=True, type=_id("the principal"), help="who the token is for"
    )
    p.add_argument(
        "--session",
        type=_id("the session"),
        help="good for this session only (default: any session the principal owns or is "
        "the first to use)",
    )
    p.add_argument(
        "--operator",
        action="store_true",
        help="an operator: may see and settle every session's executions",
    )
    p.add_argument(
        "--ttl",
        required=True,
        type=_ttl,
        metavar="SECONDS",
        help="the token expires this many seconds from now",
    )
    return p


def token_command(argv: Sequence[str]) -> int:
    """Print the token the flags ask for; the exit status (argparse exits 2 on a bad flag)."""
    args = parser().parse_args(argv)
    token = mint_token(
        args.secret, args.principal, session=args.session, operator=args.operator, ttl=args.ttl
    )
    sys.stdout.write(token + "\n")
    return 0
