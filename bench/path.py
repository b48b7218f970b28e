"""The HTTP process's own work a delivery, in process: what bench/ingest's cells cannot show on
a shared machine, where one cell's rate moves by a quarter from one minute to the next.

.venv/bin/python -m bench.path                  # CPU a delivery, three alternating runs
.venv/bin/python -m bench.path --instructions   # instructions a delivery, under callgrind
.venv/bin/python -m bench.path --instructions --by-library   # split by the library that ran them
.venv/bin/python -m bench.path --instructions --by-function  # and by the C function that ran them

Each delivery takes the path a plain delivery takes in `serve`'s HTTP process: the bytes of
a request, as wrk sends them, into the httptools protocol (`BoundedHttpToolsProtocol`), the
direct ingest, the source's verification, the group commit's batch (its rows encoded as for
PostgreSQL), the delivery's log line (INFO, JSON, to /dev/null) and metrics, and the answer
written. Left out, and the same for every source: the sockets (a transport that hands on
each answer and keeps nothing) and the database (a connection whose `fetch` answers every row
inserted), so neither the kernel nor PostgreSQL is counted. One piece of PostgreSQL's work is
counted instead: that `fetch` parses the batch's rows to answer them, about 11 µs for 16 rows
(0.7 µs a delivery, alike for every source). Connections send one request at a time, like
wrk's; each round, every connection sends its request again and the round ends when all are
answered, so a batch holds a request from each.

`baseline-A` is bench/ingest's baseline A served the same way: its FastAPI app under uvicorn's
own httptools protocol, with the bytes of a `generic` delivery.

Instructions (valgrind's callgrind, the difference between two run lengths, under one fixed
PYTHONHASHSEED) are repeatable for the same code whatever else the machine is doing: the way
to compare two versions of the path. CPU seconds are what the instructions cost here and now.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import uvloop

from bench.load import BODY_TEMPLATE, standard_webhooks_signature
from bench.systems import SOURCES_TOML

SOURCES = ("generic", "standard-webhooks", "baseline-A")
# Baseline A as bench/ingest serves it: its FastAPI app under uvicorn's own httptools
# protocol, with the request a `generic` delivery is, and nothing to record.
BASELINE_A = "baseline-A"
KEY = b"bench-path-key-0123456789"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.path",
        description="The HTTP process's own CPU (or instructions) a delivery, in process: "
        "protocol, verification, group-commit encoding, log line and answer, with no socket "
        "and no database.",
    )
    parser.add_argument("--rounds", type=int, default=2000, help="rounds a run (2000)")
    parser.add_argument(
        "--connections", type=int, default=16, help="requests a round, one a connection (16)"
    )
    parser.add_argument("--runs", type=int, default=3, help="alternating runs a source (3)")
    parser.add_argument(
        "--sources", default=",".join(SOURCES), help=f"comma-separated ({', '.join(SOURCES)})"
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions a delivery with valgrind's callgrind instead (slow: about two "
        "minutes a source)",
    )
    parser.add_argument(
        "--by-library",
        action="store_true",
        help="with --instructions: also split each source's instructions a delivery by the "
        "library (shared object) that ran them, a column a source",
    )
    parser.add_argument(
        "--by-function",
        action="store_true",
        help="with --instructions: also split them by the function that ran them (its own "
        "instructions; the interpreter's C functions, not Python ones), the 30 largest",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for option, given in (("--by-library", args.by_library), ("--by-function", args.by_function)):
        if given and not args.instructions:
            parser.error(f"{option} counts instructions: give --instructions too")
    args.sources = args.sources.split(",")
    unknown = [s for s in args.sources if s not in SOURCES]
    if unknown:
        parser.error(f"unknown source {', '.join(unknown)}: choose from {', '.join(SOURCES)}")
    return args


class NoDatabase:
    """The flusher's connection: every row of a batch answered as newly inserted."""

    def __init__(self) -> None:
        self.next_id = 1

    def is_closed(self) -> bool:
        return False

    def terminate(self) -> None:
        pass

    async def fetch(self, query: str, document: str, *args: Any) -> list[dict[str, Any]]:
        rows = orjson.loads(document)
        first, self.next_id = self.next_id, self.next_id + len(rows)
        await asyncio.sleep(0)  # as a real round trip, the answers come on a later turn
        return [
            {"id": first + n, "source": r[0], "message_id": r[1], "inserted": True}
            for n, r in enumerate(rows)
        ]


class KeptTransport(asyncio.Transport):
    """A connection's socket: hands each answer written to `answered`, and keeps nothing."""

    def __init__(self, answered: Callable[[bytes], None]) -> None:
        super().__init__()
        self.answered = answered
        self.protocol: asyncio.BaseProtocol | None = None
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.answered(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.protocol is not None
        return self.protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        peers = {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8000)}
        return peers.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def request_bytes(source: str, n: int) -> bytes:
    """Request n to `source`, signed, with every header bench/ingest's wrk script sends."""
    msg_id = f"path-{n}"
    body = BODY_TEMPLATE.replace("{id}", msg_id)
    now = int(time.time())
    signature = standard_webhooks_signature(KEY, msg_id, now, body)
    return (
        f"POST /webhooks/{source} HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
        f"Content-Type: application/json\r\nX-Message-Id: {msg_id}\r\n"
        f"webhook-id: {msg_id}\r\nwebhook-timestamp: {now}\r\n"
        f"webhook-signature: {signature}\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode()


async def run_source(source: str, rounds: int, connections: int) -> float:
    """CPU seconds a delivery over `rounds` rounds, after two rounds of warm-up."""
    if source == BASELINE_A:
        return await run_baseline_a(rounds, connections)
    from uvicorn.config import Config

    from service.api.http_protocol import BoundedHttpToolsProtocol
    from service.app import create_app
    from service.core.collector import settle_collector
    from service.serve import uvicorn_options
    from service.startup import load

    settings, inbox, _ = load(role="http")
    app = create_app(settings, inbox)
    settle_collector()  # as the HTTP process does once its app is built
    async with app.router.lifespan_context(app):
        committer = app.state.inbox.committer
        database = NoDatabase()

        async def connect() -> NoDatabase:
            return database

        committer._connect = connect
        config = Config(app, **uvicorn_options(settings))
        return await run_protocol(config, BoundedHttpToolsProtocol, source, rounds, connections)


async def run_baseline_a(rounds: int, connections: int) -> float:
    from uvicorn.config import Config
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from bench.baselines import noop

    # The options bench/baselines gives it.
    config = Config(noop.create_app(), log_config=None, access_log=False, timeout_keep_alive=5)
    return await run_protocol(config, HttpToolsProtocol, "generic", rounds, connections)


async def run_protocol(
    config: Any, protocol_class: Any, source: str, rounds: int, connections: int
) -> float:
    """Serve `rounds` rounds of `connections` requests to `source` through `protocol_class`."""
    from uvicorn.server import ServerState

    config.load()
    server_state = ServerState()
    loop = asyncio.get_running_loop()
    waiting = 0
    all_answered = asyncio.Event()
    refused: list[bytes] = []

    def answered(data: bytes) -> None:
        nonlocal waiting
        if not data.startswith(b"HTTP/"):  # uvicorn's own protocol writes the body apart
            return
        if not data.startswith(b"HTTP/1.1 200 "):
            refused.append(data)
            all_answered.set()
            return
        waiting -= 1
        if waiting == 0:
            all_answered.set()

    protocols = []
    for _ in range(connections):
        transport = KeptTransport(answered)
        protocol = protocol_class(config, server_state, {}, loop)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        protocols.append(protocol)
    # Each connection sends the same request every round: made once, so that making them
    # is not counted, and the database stand-in inserts whatever it is given.
    requests = [request_bytes(source, n) for n in range(connections)]

    async def one_round() -> None:
        nonlocal waiting
        waiting = connections
        all_answered.clear()
        for protocol, request in zip(protocols, requests, strict=True):
            protocol.data_received(request)
        await all_answered.wait()
        if refused:
            raise SystemExit(f"{source}: a delivery was not accepted: {refused[0][:400]!r}")

    # One deadline for the whole run: a delivery that is never answered fails it.
    async with asyncio.timeout(600):
        for _ in range(2):
            await one_round()
        started = time.process_time()
        for _ in range(rounds):
            await one_round()
        seconds = time.process_time() - started
    for protocol in protocols:
        protocol.transport.close()
        protocol.connection_lost(None)
    return seconds / (rounds * connections)


def configure(work: Path) -> None:
    secret = "whsec_" + base64.b64encode(KEY).decode()
    (work / "sources.toml").write_text(SOURCES_TOML.format(secret=secret))
    os.environ.update(
        INBOX_CONFIG=str(work / "sources.toml"),
        INBOX_DATA_DIR=str(work / "data"),
        INBOX_ADMIN_TOKENS="bench-path-admin-token-000000000000",
        INBOX_LOG_LEVEL="INFO",
        # Never connected to: the flusher's connection is replaced, and nothing else asks.
        DATABASE_URL="postgresql+asyncpg://bench@127.0.0.1:1/none",
    )


def child(args: argparse.Namespace) -> None:
    """One source's run, its log lines to /dev/null and its figure (or why it failed) on the
    first line of stdout."""
    (source,) = args.sources
    with tempfile.TemporaryDirectory(prefix="bench-path-") as tmp:
        configure(Path(tmp))
        stdout = os.dup(1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        try:
            seconds = uvloop.run(run_source(source, args.rounds, args.connections))
        except SystemExit as refused:  # stderr is /dev/null by now: say why on stdout
            os.write(stdout, f"{refused}\n".encode())
            raise SystemExit(1) from None
        os.write(stdout, f"{seconds}\n".encode())


def run_child(
    source: str,
    rounds: int,
    connections: int,
    valgrind: str | None,
    profile: Path | None = None,
) -> str:
    """One child run; under callgrind when `valgrind` is given, its profile kept in `profile`."""
    command = [sys.executable, "-m", "bench.path", "--child", "--sources", source]
    command += ["--rounds", str(rounds), "--connections", str(connections)]
    env = None
    if valgrind is not None:
        out = "/dev/null" if profile is None else str(profile)
        command = [valgrind, "--tool=callgrind", f"--callgrind-out-file={out}", *command]
        # One hash seed for every counted run: with a random one, str hashes and so the dict
        # and set probes differ from run to run, and runs of the same code differed by up to
        # 16,000 instructions a delivery; with this one, by at most 550 in four runs.
        env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"bench.path child failed ({source}):\n{done.stdout}\n{done.stderr}")
    return done.stdout + done.stderr


def by_library(profile: Path) -> dict[str, int]:
    """A callgrind profile's instructions by the shared object that ran them (self cost)."""
    return self_costs(profile, "ob")


def by_function(profile: Path) -> dict[str, int]:
    """A callgrind profile's instructions by the function that ran them (self cost): a
    library's own functions, and the interpreter's C functions, since callgrind cannot see
    into the Python code the interpreter runs."""
    return self_costs(profile, "fn")


def self_costs(profile: Path, unit: str) -> dict[str, int]:
    """A callgrind profile's instructions by object (`unit` "ob") or function ("fn").

    Read from callgrind's own format: a cost line counts for the object or function it is in
    (`ob=`, `fn=`), except the line after `calls=`, which is the callee's inclusive cost.
    Names are given once, and then referred to by their number, `(n)`, by the callee lines
    (`cob=`, `cfn=`) as well.
    """
    own, callee = f"{unit}=", f"c{unit}="
    names: dict[str, str] = {}
    counts: dict[str, int] = {}
    current = "?"
    after_call = False
    with profile.open() as lines:
        for line in lines:
            if after_call:
                after_call = False
            elif line[:1].isdigit() or line[:1] in "+-*":
                counts[current] = counts.get(current, 0) + int(line.split()[-1])
            elif line.startswith((own, callee)):
                number, _, name = line.partition("=")[2].strip().partition(" ")
                if name:
                    names[number] = name
                if line.startswith(own):
                    current = names.get(number, number)
            elif line.startswith("calls="):
                after_call = True
    return counts


def instructions(
    source: str, args: argparse.Namespace, valgrind: str
) -> tuple[float, dict[str, float], dict[str, float]]:
    """Instructions a delivery, and (with --by-library, --by-function) their split by library
    and by function: two runs of different lengths, so start-up cancels out."""
    counts = []
    profiles: list[Path] = []
    connections: int = args.connections
    extra: int = max(args.rounds // 40, 20)
    short, long = 10, 10 + extra
    deliveries = (long - short) * connections
    split = args.by_library or args.by_function
    with tempfile.TemporaryDirectory(prefix="bench-path-callgrind-") as tmp:
        for rounds in (short, long):
            profile = Path(tmp) / f"{rounds}.out" if split else None
            output = run_child(source, rounds, connections, valgrind, profile)
            found = re.search(r"Collected : (\d+)", output)
            if found is None:
                raise SystemExit(f"no instruction count in valgrind's output:\n{output}")
            counts.append(int(found[1]))
            if profile is not None:
                profiles.append(profile)
        libraries: dict[str, float] = {}
        functions: dict[str, float] = {}
        if args.by_library:
            libraries = per_delivery(by_library(profiles[0]), by_library(profiles[1]), deliveries)
        if args.by_function:
            before, after = by_function(profiles[0]), by_function(profiles[1])
            functions = per_delivery(before, after, deliveries, by_file=False)
    return (counts[1] - counts[0]) / deliveries, libraries, functions


def per_delivery(
    before: dict[str, int], after: dict[str, int], deliveries: int, *, by_file: bool = True
) -> dict[str, float]:
    """Each name's instructions a delivery, between a short run's profile and a longer one's;
    with `by_file`, by file name: two objects of one name (in two packages) add up."""
    split: dict[str, float] = {}
    for name in before.keys() | after.keys():
        short_name = Path(name).name if by_file else name
        count = (after.get(name, 0) - before.get(name, 0)) / deliveries
        split[short_name] = split.get(short_name, 0.0) + count
    return split


def print_split(splits: dict[str, dict[str, float]], heading: str, shown: int) -> None:
    """The split by library or function, a column a source, the largest first; the rest
    summed."""
    sources = list(splits)
    names = sorted(
        {name for split in splits.values() for name in split},
        key=lambda name: -max(abs(split.get(name, 0.0)) for split in splits.values()),
    )
    print(f"\n{heading:44s}" + "".join(f"{source:>19s}" for source in sources))
    for name in names[:shown]:
        cells = "".join(f"{splits[source].get(name, 0.0):19,.0f}" for source in sources)
        print(f"{name[:44]:44s}{cells}")
    rest = "".join(
        f"{sum(splits[source].get(name, 0.0) for name in names[shown:]):19,.0f}"
        for source in sources
    )
    print(f"{'(the others)':44s}{rest}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child(args)
        return
    if args.instructions:
        valgrind = shutil.which("valgrind")
        if valgrind is None:
            raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
        libraries: dict[str, dict[str, float]] = {}
        functions: dict[str, dict[str, float]] = {}
        for source in args.sources:
            count, libraries[source], functions[source] = instructions(source, args, valgrind)
            print(f"{source:18s} {count:9.0f} instructions a delivery", flush=True)
        if args.by_library:
            print_split(libraries, "library", shown=10)
        if args.by_function:
            print_split(functions, "function (self)", shown=30)
        return
    for run in range(args.runs):
        for source in args.sources if run % 2 == 0 else reversed(args.sources):
            output = run_child(source, args.rounds, args.connections, None)
            seconds = float(output.splitlines()[0])
            print(f"{source:18s} {seconds * 1e6:6.1f} us of CPU a delivery", flush=True)


if __name__ == "__main__":
    main()
