"""Reading a gRPC stream to its end in a test, bounded."""

from __future__ import annotations

import math
import time
from typing import Any


async def read_to_the_end(stream: Any, *, interval_s: float, opened_at: float) -> None:
    """Read a Subscribe stream whose server was stopped until it ends (the caller expects the
    error that ends it). Bounded by what the server can have sent: one message per
    `interval_s` since `opened_at` (time.monotonic()); a stream still going past that (or
    one at EOF, which `read()` returns again and again) fails the test instead of hanging it."""
    most = math.ceil((time.monotonic() - opened_at) / interval_s) + 1
    for _ in range(most):
        await stream.read()
    raise AssertionError(f"the stream did not end after {most} reads, all its server can have "
                         f"sent at one message per {interval_s * 1000:g} ms")
