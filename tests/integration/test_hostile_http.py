"""Hostile HTTP targets, one real server each on loopback: every case gets its exact outcome
class, within the path's timeout, and none holds up calls to a healthy endpoint.

Servers: tests/servers/hostile.py (HTTP/1.1, optionally TLS), tests/servers/h2raw.py (raw
HTTP/2), tests/servers/h2drain.py (a well-behaved h2c server). The engine-level suite (all
of these at once next to a healthy target) is tests/integration/test_engine_hostile.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from probes.clients import BODY_LIMIT, HttpProber
from probes.spec import HttpSpec, PathSpec, TlsSpec
from probes.types import CallOutcome, Endpoint, Outcome
from tests.reference import OWN, Clients
from tests.servers.engine import call_once, endpoint_at, engine_call, stuck_beside_healthy
from tests.servers.hostile import HostileServer
from tests.servers.memory import PeakRss
from tests.servers.tls import SERVER_NAME, Cert, make_cert

# A name under the reserved .invalid TLD (RFC 6761) never resolves.
UNRESOLVABLE = "nohost.invalid"
# A deadline far from every answer here: a call that waited for it would be classed a timeout
# and take 30 s, so half of it tells a reaction from the deadline however loaded the machine.
FAR_DEADLINE_S = 30.0


def path(
    target: str = "/status/200",
    *,
    version: str = "1.1",
    timeout_s: float = 1.0,
    method: str = "GET",
    scheme: str = "http",
    tls: TlsSpec | None = None,
) -> PathSpec:
    return PathSpec(
        name="p",
        rate_per_s=1.0,
        timeout_s=timeout_s,
        http=HttpSpec(path=target, version=version, method=method, scheme=scheme, tls=tls),
    )


at = endpoint_at


async def one_call(
    spec: PathSpec, endpoint: Endpoint, on: Clients = OWN
) -> tuple[CallOutcome, float]:
    return await call_once(on.build(spec), endpoint, spec.timeout_s)


@pytest.fixture
def cert(tmp_path: Path) -> Cert:
    return make_cert(tmp_path)


# --- slowloris: header bytes dripped, never finished ----------------------------------------


async def test_slowloris_headers_time_out_and_do_not_hold_up_other_calls(
    version, hostile, raw, h2c
):
    # Each dripped byte restarts a per-read timeout; only the deadline on the whole call
    # ends it. Meanwhile the same prober keeps answering a healthy endpoint at once.
    slow, healthy = (hostile, hostile) if version.number == "1.1" else (raw, h2c)
    target = "/slowheaders" if version.number == "1.1" else "/x.Y/slowheaders"
    timeout_s = 0.6
    # The healthy calls' timeout is a hang guard: on a loaded machine a healthy answer may
    # take longer than the stuck call's deadline, and is still an answer.
    healthy_guard_s = 10.0
    prober = version.clients.build(path(target, version=version.number, timeout_s=timeout_s))
    good = version.clients.build(path("/status/200", version=version.number,
                                      timeout_s=healthy_guard_s))
    (outcome, took), answers = await stuck_beside_healthy(
        prober, at(slow.port), good, at(healthy.port, name="pod-1"), healthy_guard_s,
        stuck_timeout_s=timeout_s)
    assert (outcome.outcome, outcome.detail) == (Outcome.TIMEOUT, "engine deadline")
    assert took >= timeout_s
    # Held up until the stuck call ended, the loop would get one answer: more came meanwhile.
    assert len(answers) >= 2
    assert {a.outcome for a, _ in answers} == {Outcome.OK}


# --- bodies ----------------------------------------------------------------------------------


async def test_endless_and_huge_bodies_are_cut_with_bounded_memory(hostile):
    # Ten calls at a time, fifty times over, into bodies that never end or are 50 MB:
    # each is read and discarded in chunks up to BODY_LIMIT, so the process's peak RSS
    # (servers included) grows by a few MiB of buffers; one 50 MB body held whole would
    # break the bound.
    prober = HttpProber(path("/endless", timeout_s=2.0))
    big = HttpProber(path(f"/big/{50 * 1024 * 1024}", timeout_s=2.0))
    outcomes = []
    try:
        with PeakRss() as rss:
            for _ in range(50):
                batch = [engine_call(prober, at(hostile.port), 2.0) for _ in range(5)]
                batch += [engine_call(big, at(hostile.port, name="pod-1"), 2.0) for _ in range(5)]
                outcomes += await asyncio.gather(*batch)
    finally:
        await prober.aclose()
        await big.aclose()
    for outcome, _ in outcomes:
        assert outcome.outcome == Outcome.OK  # the 2 s deadline would have been a timeout
        read = int(outcome.detail.removeprefix("body truncated at ").removesuffix(" bytes"))
        assert BODY_LIMIT <= read <= 2 * BODY_LIMIT  # it stopped at the limit
    assert rss.growth_mib < 32, rss.growth_mib


# --- resets in the middle of a body ---------------------------------------------------------


async def test_http1_reset_mid_body_is_a_reset_after_the_status(hostile):
    outcome, took = await one_call(
        path("/resetbody/16384", timeout_s=FAR_DEADLINE_S), at(hostile.port))
    assert (outcome.outcome, outcome.status) == (Outcome.RESET, 200)
    assert outcome.detail.startswith("body: ")
    assert "reset" in outcome.detail.lower()
    assert took < FAR_DEADLINE_S / 2  # the reset ended it, not the deadline


async def test_http2_reset_mid_body_is_a_reset_after_the_status(raw, h2_client):
    # Headers and three DATA frames, then the TCP connection is reset.
    outcome, _ = await one_call(path("/x.Y/tcprst-3", version="2"), at(raw.port), on=h2_client)
    assert (outcome.outcome, outcome.status) == (Outcome.RESET, 200)
    assert "ConnectionResetError" in outcome.detail


# --- malformed HTTP/2 -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        # h2 would wait for all 16 MiB of the announced frame: the probe stops at its header.
        ("badframe", "exceeds the max frame size"),
        ("badhpack", "header block"),
    ],
)
async def test_malformed_http2_after_the_headers_is_a_protocol_error(raw, mode, says, h2_client):
    outcome, took = await one_call(
        path(f"/x.Y/{mode}", version="2", timeout_s=FAR_DEADLINE_S), at(raw.port), on=h2_client)
    assert (outcome.outcome, outcome.status) == (Outcome.PROTOCOL_ERROR, 200)
    assert says in outcome.detail
    assert took < FAR_DEADLINE_S / 2  # the answer's frames (after 0.2 s), not the deadline


async def test_idle_http2_connection_closed_without_goaway_is_never_a_failure(raw, h2_client):
    # The server answers, then drops the idle connection without GOAWAY (a restart). httpcore
    # only finds out by sending the next request on it: a GET is re-sent once on a fresh
    # connection and counted as churn; a POST, which the server may have seen, is a reset.
    # The probe's own client reads every connection, sees the close at once and sends the
    # next request on a fresh connection: nothing lost, nothing re-sent.
    raw.after_s = 0.05
    lean = h2_client.name != "httpcore"
    expected = (("GET", Outcome.OK, 0), ("POST", Outcome.OK, 0)) if lean else (
        ("GET", Outcome.OK, 1), ("POST", Outcome.RESET, 0))
    for method, outcome_class, churn in expected:
        prober = h2_client.build(path("/x.Y/idleclose", version="2", method=method))
        try:
            first, _ = await engine_call(prober, at(raw.port), 1.0)
            await asyncio.sleep(4 * raw.after_s)  # the server has closed it by now
            second, _ = await engine_call(prober, at(raw.port), 1.0)
        finally:
            await prober.aclose()
        assert first.outcome == Outcome.OK
        assert (second.outcome, second.churn) == (outcome_class, churn), second
        assert lean or "closed without GOAWAY" in second.detail


# --- TLS where there is none, and none where there is TLS -------------------------------------


async def test_tls_on_a_plaintext_port_is_a_tls_error(version, hostile, cert):
    # The server answers a ClientHello with a plaintext 400, as nginx does.
    tls = TlsSpec(ca=str(cert.cert), server_name=SERVER_NAME)
    outcome, _ = await one_call(
        path(version=version.number, scheme="https", tls=tls), at(hostile.port), on=version.clients
    )
    assert outcome.outcome == Outcome.TLS_ERROR
    assert "WRONG_VERSION_NUMBER" in outcome.detail


async def test_plaintext_on_a_tls_port_is_a_reset(version, cert):
    # The server's TLS stack drops a connection that opens with a plaintext request; over
    # plaintext the client cannot know TLS was expected: the connection closed unanswered.
    async with HostileServer(ssl_context=cert.server_context()) as server:
        outcome, _ = await one_call(
            path(version=version.number), at(server.port), on=version.clients
        )
    assert outcome.outcome == Outcome.RESET
    assert "disconnected" in outcome.detail.lower()


# --- DNS -------------------------------------------------------------------------------------


async def test_a_name_that_does_not_resolve_is_a_dns_error_at_once(version):
    outcome, took = await one_call(
        path(version=version.number, timeout_s=FAR_DEADLINE_S), at(80, UNRESOLVABLE),
        on=version.clients)
    assert outcome.outcome == Outcome.DNS_ERROR, outcome
    assert took < FAR_DEADLINE_S / 2  # the lookup failed; it was not the deadline
