"""`python -m targets.fleet`: the local fleet's command line (`targets.fleet.Fleet`), run until
SIGTERM/SIGINT, optionally rolling its pods from one proxy version to another.

The fleet is a package so that this command is its `__main__`: it imports the fleet, and
nothing imports it back."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import signal
import time
from collections.abc import Sequence

from probes._parsing import parse_duration
from probes.errors import BadInput
from targets.fleet import ORDERS, Fleet, SidecarFactory
from targets.meshview import EmulatedMesh
from targets.profile import ProfileSet, load_profiles
from targets.relay_config import load_relay
from targets.server import exit_with, run_command

__all__ = ["main", "run"]

def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m targets.fleet",
        description="Run N reference-target pods on loopback, optionally rolling them from "
                    "one proxy version to another. Runs until SIGTERM/SIGINT.",
    )
    parser.add_argument("--pods", type=int, default=12, help="number of pods (default 12)")
    parser.add_argument("--from", dest="from_version", required=True, help="initial version")
    parser.add_argument("--to", dest="to_version", help="roll out to this version")
    parser.add_argument("--rollout-after", default="10s", help="start the rollout after this")
    parser.add_argument("--interval", default="4s", help="time between restart batches")
    parser.add_argument("--batch", type=int, default=1, help="pods restarted at once")
    parser.add_argument("--order", choices=ORDERS, default="ordinal", help="restart order")
    parser.add_argument("--restarts", type=int, help="restart at most this many pods, then hold")
    parser.add_argument("--endpoints-file", help="where to publish the endpoint list (JSON)")
    parser.add_argument("--profiles", help="fault profile YAML (default: no faults)")
    parser.add_argument("--base-host", default="127.0.0.2", help="address of pod 0")
    parser.add_argument("--http-port", type=int, default=18080)
    parser.add_argument("--grpc-port", type=int, default=19090)
    parser.add_argument("--no-grpc", action="store_true", help="HTTP only (big fleets)")
    parser.add_argument("--namespace", default="demo")
    parser.add_argument("--service", default="checkout")
    parser.add_argument("--drain", default="2s", help="drain time of a restarting pod")
    parser.add_argument("--drain-notice", default="1.5s",
                        help="a restarting pod serves this long, unpublished, before closing")
    parser.add_argument("--seed", type=int, help="seed for fault decisions and random order")
    parser.add_argument("--quiet", action="store_true", help="do not print rollout events")
    parser.add_argument("--sidecar", choices=("emulated", "haproxy"), default="emulated",
                        help="emulated (Python, --profiles) or a real HAProxy per pod")
    parser.add_argument("--haproxy-profiles", help="HAProxy settings per version (default: "
                        "targets/examples/haproxy-profiles.yaml)")
    parser.add_argument("--haproxy-dir", help="keep HAProxy configs and logs here "
                        "(default: a temporary directory, removed at exit)")
    parser.add_argument("--relay", help="relay allowlist YAML: every pod is a relay pod whose "
                        "outbound side is its version's (profile retries, an endpoint view of "
                        "the emulated control plane; with --sidecar haproxy a real outbound "
                        "HAProxy per version, its server list set from that view)")
    parser.add_argument("--control-plane", help="the emulated control plane's version, for "
                        "--relay (default: --from)")
    return parser.parse_args(argv)


def _durations(args: argparse.Namespace) -> dict[str, float]:
    out = {}
    for name in ("rollout_after", "interval", "drain", "drain_notice"):
        try:
            out[name] = parse_duration(getattr(args, name))
        except ValueError as exc:
            raise BadInput(f"--{name.replace('_', '-')}: {exc}") from None
    return out


async def _run(args: argparse.Namespace) -> None:
    durations = _durations(args)
    profiles = load_profiles(args.profiles) if args.profiles else None
    _raise_fd_limit()
    async with contextlib.AsyncExitStack() as stack:
        sidecar = None
        if args.sidecar == "haproxy":
            from targets.haproxy import HaproxySidecars  # this mode only

            sidecar = await stack.enter_async_context(await HaproxySidecars.for_fleet(
                args.haproxy_profiles, workdir=args.haproxy_dir,
                versions=(args.from_version, args.to_version),
                drain_s=durations["drain"], notice_s=durations["drain_notice"]))
            print(f"fleet: HAProxy sidecars ({sidecar.binary}), configs and logs in "
                  f"{sidecar.workdir}", flush=True)
        await _run_fleet(args, durations, profiles, sidecar)


async def _run_fleet(
    args: argparse.Namespace, durations: dict[str, float], profiles: ProfileSet | None,
    sidecar: SidecarFactory | None,
) -> None:
    relay = load_relay(args.relay) if args.relay else None
    fleet = Fleet(
        pods=args.pods, version=args.from_version, profiles=profiles,
        base_host=args.base_host, http_port=args.http_port,
        grpc_port=None if args.no_grpc else args.grpc_port,
        namespace=args.namespace, service=args.service, endpoints_file=args.endpoints_file,
        seed=args.seed, drain_s=durations["drain"], notice_s=durations["drain_notice"],
        sidecar=sidecar, relay=relay,
        mesh=EmulatedMesh(args.control_plane) if relay and args.control_plane else None,
    )
    if args.to_version is not None:
        fleet.profile(args.to_version)  # fail on an unknown version before starting anything
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks: list[asyncio.Task[None]] = []
    try:
        await fleet.start()
        first = fleet.pods[0]
        print(f"fleet: {args.pods} pods of {args.service} on {first.host}.. "
              f"http={first.http_port} grpc={first.grpc_port or 'off'} "
              f"version {args.from_version}", flush=True)
        for version, proxy in sorted(fleet.outbounds.items()):
            print(f"fleet: outbound HAProxy of {version} callers on {proxy.address}", flush=True)
        if not args.quiet:
            tasks.append(asyncio.create_task(_print_events(fleet)))
        if args.to_version is not None:
            tasks.append(asyncio.create_task(_rollout_later(fleet, args, durations, stop)))
        await stop.wait()
        await fleet.stop(0.0)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _rollout_later(
    fleet: Fleet, args: argparse.Namespace, durations: dict[str, float], stop: asyncio.Event
) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), durations["rollout_after"])
        return
    await fleet.rollout(args.to_version, interval_s=durations["interval"],
                        batch_size=args.batch, order=args.order, seed=args.seed,
                        limit=args.restarts)


async def _print_events(fleet: Fleet) -> None:
    async for event in fleet.events():
        stamp = time.strftime("%H:%M:%S", time.localtime(event.at))
        versions = fleet.version_counts()
        counts = " ".join(f"{v}={n}" for v, n in sorted(versions.items()))
        print(f"{stamp} {event.kind} {event.pod or '-'} "
              f"{event.from_version or ''}->{event.to_version or ''}  [{counts}]", flush=True)


def _raise_fd_limit() -> None:
    """A fleet of thousands of pods needs a listener and connections per pod."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: Sequence[str] | None = None) -> int:
    return run_command("targets.fleet", _run(_args(argv)))


def run() -> None:
    """`python -m targets.fleet`."""
    exit_with(main)


if __name__ == "__main__":
    run()
