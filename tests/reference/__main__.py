"""`skewprobe` with library references in place of the probe's own clients, for the
benchmarks (`capacity.py --client`, `fidelity.py --http2-client/--grpc-client`):

    python -m tests.reference [--http2 lean|httpcore] [--grpc lean|grpcio] run --config ...

The product picks its probers with `build_prober`; this makes the references' registry its
default before the CLI is imported, so the rest of the run is the product unchanged.
"""

from __future__ import annotations

import sys

from probes.clients import _registry
from tests.reference import GRPC_CLIENTS, HTTP2_CLIENTS, clients

_USAGE = (f"usage: python -m tests.reference [--http2 {'|'.join(HTTP2_CLIENTS)}] "
          f"[--grpc {'|'.join(GRPC_CLIENTS)}] SKEWPROBE-ARGS...")


def main(argv: list[str]) -> int:
    picked: dict[str, str] = {}
    while argv[:1] in (["--http2"], ["--grpc"]) and len(argv) > 1:
        picked[argv[0].removeprefix("--")] = argv[1]
        argv = argv[2:]
    try:
        registry = clients(**picked).probers
    except KeyError as exc:
        print(f"tests.reference: no such client {exc}; {_USAGE}", file=sys.stderr)
        return 2
    _registry.build_prober.__defaults__ = (registry,)
    from probes.cli import main as skewprobe

    return skewprobe(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
