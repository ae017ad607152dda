"""A flood of `GET /verdict` requests from a process of its own (`python -m
tests.servers.api_flood URL CLIENTS PER_CLIENT [QUERY]`): the flood's client work stays off
the event loop of the probe it floods. Prints the status codes answered, as JSON."""

from __future__ import annotations

import asyncio
import json
import sys

import httpx

# A hang guard per request, not a timing: a paced API answers a few hundred in seconds.
REQUEST_TIMEOUT_S = 120.0


async def flood(url: str, clients: int, per_client: int, query: str) -> list[int]:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        async def one_client() -> list[int]:
            return [(await client.get(f"{url}?{query}")).status_code for _ in range(per_client)]

        answers = await asyncio.gather(*(one_client() for _ in range(clients)))
    return [code for codes in answers for code in codes]


async def run_flood(url: str, clients: int, per_client: int, query: str = "") -> list[int]:
    """Run the flood in its own process and wait for it (from a test's event loop)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.servers.api_flood", url, str(clients), str(per_client),
        query, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), REQUEST_TIMEOUT_S * per_client)
    assert proc.returncode == 0, err.decode()[-2000:]
    codes: list[int] = json.loads(out)
    return codes


if __name__ == "__main__":
    url, clients, per_client, *query = sys.argv[1:]
    print(json.dumps(asyncio.run(flood(url, int(clients), int(per_client), "".join(query)))))
