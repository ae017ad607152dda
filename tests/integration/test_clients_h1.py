"""The HTTP/1.1 transport (`probes.clients._h1`) where HTTP/1.1's framing is subtle: HEAD,
bodies that end with the connection, informational answers, chunks, bytes after an answer,
`Connection: close`, cancelled calls and idle expiry. Real loopback servers
(tests/servers/hostile.py); the hostile and outcome-class cases are in test_clients_http.py
and test_hostile_http.py."""

from __future__ import annotations

import asyncio

import pytest

from probes.clients import HttpProber
from probes.clients._h1 import H1Client, H1Settings, _Connection, frame_request
from probes.errors import BadInput
from probes.spec import HttpSpec, PathSpec
from probes.types import Outcome
from tests.servers.engine import endpoint_at, engine_call


def http_path(target: str, *, method: str = "GET", timeout_s: float = 2.0, **spec) -> PathSpec:
    return PathSpec(
        name="p", rate_per_s=1.0, timeout_s=timeout_s,
        http=HttpSpec(path=target, method=method, **spec),
        cohort_header="x-proxy-version",
    )


def h1_client(port: int, target: str, *, keepalive_s: float = 15.0) -> H1Client:
    """The transport alone, GET `target`, 1 s budgets."""
    settings = H1Settings(connect_budget_s=1.0, read_budget_s=1.0, keepalive_s=keepalive_s,
                          body_limit=1 << 20, wanted=frozenset())
    request = frame_request("GET", target, "x", [], None)
    return H1Client("127.0.0.1", port, request, settings, ssl_context=None)


async def calls(path: PathSpec, port: int, targets: int = 2):
    prober = HttpProber(path)
    try:
        return [(await engine_call(prober, endpoint_at(port), 2.0, f"r{i}"))[0]
                for i in range(targets)]
    finally:
        await prober.aclose()


async def test_a_head_answer_ends_at_its_headers_and_keeps_the_connection(hostile):
    # The answer says Content-Length: 6 and sends no body, as HEAD's answers do; a parser
    # that waited for the 6 bytes would time out, one that kept its state would misread the
    # next answer.
    first, second = await calls(http_path("/status/200", method="HEAD"), hostile.port)
    assert (first.outcome, first.status) == (second.outcome, second.status) == (Outcome.OK, 200)
    assert hostile.connections == 1
    assert hostile.request_ids == ["r0", "r1"]


async def test_a_head_answer_with_connection_close_is_not_kept(hostile):
    first, second = await calls(
        http_path("/status/200?connection=close", method="HEAD"), hostile.port)
    assert first.outcome == second.outcome == Outcome.OK
    assert hostile.connections == 2


async def test_a_body_that_runs_to_the_close_is_complete_on_a_clean_close(hostile):
    first, second = await calls(http_path("/eof/5000?x-proxy-version=1.21.0"), hostile.port)
    assert (first.outcome, first.detail, first.cohort_hint) == (Outcome.OK, "", "1.21.0")
    assert second.outcome == Outcome.OK
    assert hostile.connections == 2  # the close ended the first answer and its connection


async def test_a_body_that_runs_to_the_close_cut_by_a_reset_is_a_reset(hostile):
    [outcome] = await calls(http_path("/eofreset/5000"), hostile.port, 1)
    assert (outcome.outcome, outcome.status) == (Outcome.RESET, 200)
    assert outcome.detail.startswith("body: ")
    assert "reset" in outcome.detail.lower()


async def test_an_informational_answer_is_skipped_for_the_final_one(hostile):
    first, second = await calls(http_path("/early?x-proxy-version=1.21.0"), hostile.port)
    assert (first.outcome, first.status, first.cohort_hint) == (Outcome.OK, 200, "1.21.0")
    assert second.outcome == Outcome.OK
    assert hostile.connections == 1


async def test_a_chunked_body_is_read_to_its_end_and_the_connection_kept(hostile):
    first, second = await calls(http_path("/chunked/10000"), hostile.port)
    assert first.outcome == second.outcome == Outcome.OK
    assert first.detail == ""
    assert hostile.connections == 1


async def test_bytes_after_an_answer_retire_its_connection(hostile):
    # The stray bytes would otherwise be read as the start of the next call's answer.
    first, second = await calls(http_path("/extra"), hostile.port)
    assert first.outcome == second.outcome == Outcome.OK
    assert hostile.connections == 2


async def test_connection_close_in_an_answer_is_honoured(hostile):
    first, second = await calls(http_path("/status/200?connection=close"), hostile.port)
    assert first.outcome == second.outcome == Outcome.OK
    assert hostile.connections == 2


async def test_a_call_cut_by_the_deadline_does_not_leave_its_connection_in_the_pool(hostile):
    # Reused, the connection would hand the next call the cut call's late answer.
    prober = HttpProber(http_path("/sleep/300", timeout_s=5.0))
    try:
        cut, _ = await engine_call(prober, endpoint_at(hostile.port), 0.1)
        # A timeout, not ok: the prober never read the answer, so the connection still owes it.
        assert cut.outcome == Outcome.TIMEOUT
        # ... and it is closed, not left open: the server, done sleeping, sees the end.
        await asyncio.wait_for(hostile.wait_open_connections(0), 2.0)
        after, took = await engine_call(prober, endpoint_at(hostile.port), 2.0)
        assert after.outcome == Outcome.OK and took >= 0.3
    finally:
        await prober.aclose()
    assert hostile.connections == 2


@pytest.mark.parametrize(
    "headers",
    [{"x-a": "b\r\nx-evil: 1"}, {"x-a\nb": "c"}, {"x a": "b"}, {"x-a": "snowman ☃"}],
)
def test_a_header_that_cannot_be_framed_is_bad_input(headers):
    with pytest.raises(BadInput, match="path p: http: "):
        HttpProber(http_path("/", headers=headers))


def test_the_request_is_framed_once_with_its_host_and_body():
    head, tail = frame_request(
        "POST", "/api?a=1", "10.0.0.1:8080", [("user-agent", "t"), ("x-b", "c")], b"{}"
    )
    assert head + b"id-1" + tail == (
        b"POST /api?a=1 HTTP/1.1\r\nHost: 10.0.0.1:8080\r\nuser-agent: t\r\nx-b: c\r\n"
        b"Content-Length: 2\r\nx-request-id: id-1\r\n\r\n{}"
    )
    head, _ = frame_request("GET", "/", "a", [("Host", "svc.example")], None)
    assert head.count(b"Host:") == 1 and b"Host: svc.example" in head


async def test_an_idle_connection_past_its_keepalive_is_not_reused(hostile):
    client = h1_client(hostile.port, "/status/200", keepalive_s=0.1)
    try:
        assert (await client.request("a")).status == 200
        assert (await client.request("b")).status == 200
        assert hostile.connections == 1
        await asyncio.sleep(0.2)
        assert (await client.request("c")).status == 200
        assert hostile.connections == 2
    finally:
        await client.aclose()
    await asyncio.wait_for(hostile.wait_open_connections(0), 2.0)


async def test_connections_opened_by_overlapping_calls_are_not_kept(hostile):
    # Three calls at once need three connections; afterwards one is kept, so slow spells
    # do not pile up idle connections on the callee.
    client = h1_client(hostile.port, "/sleep/100")
    try:
        answers = await asyncio.gather(*(client.request(f"r{i}") for i in range(3)))
        assert [a.status for a in answers] == [200] * 3
        assert hostile.connections == 3
        await asyncio.wait_for(hostile.wait_open_connections(1), 2.0)
        assert (await client.request("again")).status == 200
        assert hostile.connections == 3  # the kept one was reused
    finally:
        await client.aclose()


async def test_a_call_cancelled_after_its_answer_arrived_closes_its_connection(
    hostile, monkeypatch
):
    # The deadline can cancel a call whose answer is in but whose task has not resumed
    # yet; its connection must be closed, not left open outside the pool (found at 2,400
    # endpoints: thousands of such connections filled the callee's maxconn).
    client = h1_client(hostile.port, "/status/200")
    finish = _Connection._finish
    task: asyncio.Task | None = None

    def finish_then_cancel(self, **kwargs):
        finish(self, **kwargs)
        assert task is not None
        task.cancel()

    monkeypatch.setattr(_Connection, "_finish", finish_then_cancel)
    try:
        task = asyncio.create_task(client.request("cut"))
        with pytest.raises(asyncio.CancelledError):
            await task
        monkeypatch.undo()
        await asyncio.wait_for(hostile.wait_open_connections(0), 2.0)
        assert (await client.request("next")).status == 200
        assert hostile.connections == 2
    finally:
        await client.aclose()
