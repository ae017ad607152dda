"""`skewprobe run`: one probe process, from startup to the last window written.

`runner` is the process itself, as uvicorn's server is: startup, the main loop, shutdown.
The engine (`engine`, timed by `_precise_timer`) sends every call at its intended time;
`_window_writer` writes windows to the store (and retries), `_inventory_task` keeps the pod
inventory and its snapshots, `_progress` the lines a run logs and its summary,
`_api_server` binds and serves the API, `_gc_tuning` tunes the collector (opt-in) and
`_malloc` returns freed arrays to the system.
"""

from probes.run.runner import ProbeRunner, Recorder, RunOptions, discovery_for

__all__ = ["ProbeRunner", "Recorder", "RunOptions", "discovery_for"]
