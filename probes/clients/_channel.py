"""grpc.aio channels as the probe opens them: the options of a held stream's channel.

Channel options, and why:

* `grpc.enable_retries=0`. gRPC transparently re-sends an RPC the server provably did not
  see (stream above a GOAWAY's last-stream-id, REFUSED_STREAM), which is correct but makes
  connection churn invisible. With retries off those RPCs fail UNAVAILABLE with
  "GOAWAY received…" or "Received RST_STREAM with error code 7" (grpc core's chttp2
  transport), so what the probe reports is what one attempt did; no configured retry
  policy applies either.
* a local subchannel pool, so each path's channel owns its connection and closing it closes
  the connection (the global pool would share it across paths).
* reconnect backoff 100 ms to 1 s instead of 1 s to 120 s, so an endpoint that refused
  once (a restarting pod) is tried again at the probe's pace, not minutes later. The
  minimum (`grpc.min_reconnect_backoff_ms`) is left alone: grpc core also uses it as the
  connect timeout (20 s), and the RPC deadline should be what ends a hanging connect, as
  DEADLINE_EXCEEDED with "no connection yet" in the detail.
* 4 MiB receive limit (gRPC's default, made explicit): a bigger answer is
  RESOURCE_EXHAUSTED with bounded memory.
* no channelz: grpc core keeps a channelz node (and its trace) per channel and
  subchannel for the channelz service, which the probe never serves. Off, each channel
  costs ~3 KiB less: 8 MiB at 2,400 held streams (BENCHMARKS.md, "Memory").
"""

from __future__ import annotations

from probes.clients._base import USER_AGENT
from probes.spec import GrpcSpec

# gRPC's default receive limit, made explicit; the unary prober keeps the same one.
MAX_RECEIVE_BYTES = 4 << 20


def channel_options(spec: GrpcSpec) -> list[tuple[str, str | int]]:
    """The options of a grpc.aio channel for a path with this gRPC spec (see above)."""
    options: list[tuple[str, str | int]] = [
        ("grpc.enable_retries", 0),
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
        ("grpc.primary_user_agent", USER_AGENT),
        ("grpc.enable_channelz", 0),
    ]
    if spec.tls is not None and spec.tls.server_name:
        options.append(("grpc.ssl_target_name_override", spec.tls.server_name))
    return options
