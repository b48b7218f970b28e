"""Serve one baseline: the apps under the uvicorn options `webhook-inbox serve` uses
(service/cli.py), the floor on its own protocol."""

from __future__ import annotations

import argparse

import uvicorn

from bench.baselines import floor, naive, noop

APPS = {"noop": noop.create_app, "naive": naive.create_app}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.baselines")
    parser.add_argument("app", choices=sorted([*APPS, "floor"]))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    if args.app == "floor":
        floor.run(args.host, args.port)
        return
    # Keep in step with service/cli.py `serve`: default loop and http (uvloop and httptools
    # from uvicorn[standard]), no access log, same keep-alive.
    uvicorn.run(
        APPS[args.app](),
        host=args.host,
        port=args.port,
        log_config=None,
        access_log=False,
        timeout_keep_alive=5,
        timeout_graceful_shutdown=30,
    )


if __name__ == "__main__":
    main()
