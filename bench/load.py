"""Load generation with wrk: signed request files, one wrk run, and what it acknowledged."""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import shutil
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

LUA_SCRIPT = Path(__file__).with_name("ingest.lua")

# About the size of a small real event; {id} is replaced by the message id.
BODY_TEMPLATE = json.dumps(
    {
        "id": "{id}",
        "type": "invoice.paid",
        "created": 1764460800,
        "data": {
            "object": {
                "customer": "cus_bench_0001",
                "amount_paid": 4200,
                "currency": "eur",
                "lines": [{"sku": f"sku_{n}", "quantity": n, "amount": 700 * n} for n in (1, 2)],
                "metadata": {"order": "ord_bench_0001", "channel": "web"},
            }
        },
    }
)


# How a cell picks its ids: the chance that a request repeats an earlier one of its thread.
MODES = {"unique": 0.0, "dup50": 0.5}


def ensure_wrk() -> str:
    """The wrk binary, installing the Debian package first when it is missing."""
    found = shutil.which("wrk")
    if found:
        return found
    if not shutil.which("apt-get"):
        raise SystemExit("wrk is not installed and apt-get is not available: install wrk")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print("installing wrk (apt-get install -y wrk)", flush=True)
    if subprocess.run([*sudo, "apt-get", "install", "-y", "wrk"], env=env).returncode != 0:
        subprocess.run([*sudo, "apt-get", "update"], env=env, check=True)
        subprocess.run([*sudo, "apt-get", "install", "-y", "wrk"], env=env, check=True)
    found = shutil.which("wrk")
    if not found:
        raise SystemExit("apt-get install wrk did not put wrk on PATH")
    return found


def standard_webhooks_signature(key: bytes, msg_id: str, timestamp: int, body: str) -> str:
    """`v1,<base64 HMAC-SHA256 of id.timestamp.body>`, written here from the spec on purpose
    rather than imported from the service under test."""
    digest = hmac.new(key, f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def write_requests(
    prefix: Path, tag: str, per_thread: int, threads: int, key: bytes, body: str = BODY_TEMPLATE
) -> tuple[Path, Path]:
    """Request files `prefix0..N` (fresh timestamps: call just before the run) and the body
    template (`body`, with `{id}` once); every message id is unique and starts with `tag`."""
    template = prefix.with_name(prefix.name + "body.json")
    template.write_text(body)
    head, tail = body.split("{id}")
    now = int(time.time())
    for t in range(threads):
        lines = []
        for n in range(per_thread):
            msg_id = f"{tag}-t{t}-{n}"
            sig = standard_webhooks_signature(key, msg_id, now, head + msg_id + tail)
            lines.append(f"{msg_id}\t{now}\t{sig}\n")
        Path(f"{prefix}{t}").write_text("".join(lines))
    return prefix, template


@dataclass
class LoadResult:
    """One wrk run: throughput, latency, failures, and what the receiver acknowledged."""

    requests: int
    duration_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    non_2xx: int
    socket_errors: int
    wrapped: int
    acked: int
    logged: int  # 2xx answers naming a message id
    outcomes: Counter[str] = field(default_factory=Counter)
    acked_ids: set[str] = field(default_factory=set)
    accepted_twice: list[str] = field(default_factory=list)
    log_complete: bool = True
    # wrk's own CPU seconds while it loaded the server (from its threads' end of init): the
    # client's share of a machine whose cores it shares with the server.
    client_cpu_s: float = 0.0

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0

    @property
    def client_cpu_us_per_request(self) -> float:
        return self.client_cpu_s / max(self.requests, 1) * 1e6

    def summary(self) -> dict[str, object]:
        return {
            "rps": round(self.rps, 1),
            "requests": self.requests,
            "duration_s": round(self.duration_s, 3),
            "p50_ms": self.p50_ms,
            "p90_ms": self.p90_ms,
            "p99_ms": self.p99_ms,
            "max_ms": self.max_ms,
            "non_2xx": self.non_2xx,
            "socket_errors": self.socket_errors,
            "wrapped": self.wrapped,
            "acked": self.acked,
            "logged": self.logged,
            "outcomes": dict(self.outcomes),
            "accepted_twice": len(self.accepted_twice),
            "ack_log_complete": self.log_complete,
            "wrk_cpu_us_per_request": round(self.client_cpu_us_per_request, 1),
        }


def run_wrk(
    wrk: str,
    url: str,
    *,
    connections: int,
    threads: int,
    duration: float,
    requests: Path,
    body_template: Path,
    dup_fraction: float,
    ack_log: Path,
) -> LoadResult:
    path = "/" + url.split("/", 3)[3]
    command = [
        wrk,
        f"-t{threads}",
        f"-c{connections}",
        f"-d{round(duration)}s",
        "--timeout",
        "10s",
        "-s",
        str(LUA_SCRIPT),
        url,
        "--",
        str(requests),
        path,
        str(dup_fraction),
        str(ack_log),
        str(body_template),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=duration + 120)
    line = next((x for x in done.stdout.splitlines() if x.startswith("BENCH_RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    raw = json.loads(line.removeprefix("BENCH_RESULT "))
    result = LoadResult(
        requests=raw["requests"],
        duration_s=raw["duration_us"] / 1e6,
        p50_ms=raw["p50_us"] / 1000,
        p90_ms=raw["p90_us"] / 1000,
        p99_ms=raw["p99_us"] / 1000,
        max_ms=raw["max_us"] / 1000,
        non_2xx=raw["non_2xx"],
        socket_errors=sum(raw[k] for k in ("connect_errors", "read_errors", "write_errors"))
        + raw["timeouts"],
        wrapped=raw["wrapped"],
        acked=raw["acked"],
        logged=0,
        client_cpu_s=raw["cpu_us"] / 1e6,
    )
    read_acks(result, [Path(f"{ack_log}{t}") for t in range(threads)])
    return result


def run_cell_load(
    wrk: str,
    url: str,
    args: argparse.Namespace,
    connections: int,
    mode: str,
    requests: Path,
    body_template: Path,
    ack_log: Path,
) -> LoadResult:
    """A cell's load as bench/ingest and its --profile run it: `args.threads` wrk threads for
    `args.duration` seconds, repeating earlier requests as id `mode` says."""
    return run_wrk(
        wrk,
        url,
        connections=connections,
        threads=args.threads,
        duration=args.duration,
        requests=requests,
        body_template=body_template,
        dup_fraction=MODES[mode],
        ack_log=ack_log,
    )


def read_acks(result: LoadResult, logs: list[Path]) -> None:
    """Read wrk's logs of 2xx answers (each body on a line of its own) into `result`, then
    delete them: the outcome and message id each answer named, the ids `accepted` more than
    once, and whether the logs hold all `result.acked` answers wrk counted (the evidence for the
    stored-ids check). An answer that is not a JSON object naming a message id is counted as
    a line but not as `logged`, so a service that answered so fails the check."""
    accepted: Counter[str] = Counter()
    lines = 0
    for log in logs:
        for entry in log.read_bytes().splitlines():
            lines += 1
            try:
                answer = json.loads(entry)
            except ValueError:  # not one JSON document: it names no message, and fails the check
                continue
            msg_id = answer.get("message_id") if isinstance(answer, dict) else None
            if msg_id is None:  # a baseline's fixed answer names no message
                continue
            outcome = answer.get("status", "?")
            result.logged += 1
            result.outcomes[outcome] += 1
            result.acked_ids.add(msg_id)
            if outcome == "accepted":
                accepted[msg_id] += 1
        log.unlink()
    result.log_complete = lines == result.acked
    result.accepted_twice = sorted(k for k, n in accepted.items() if n > 1)
