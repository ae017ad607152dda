"""`skewprobe run`: one probe process, from startup to the last window written.

`runner` is the process itself, as uvicorn's server is: startup, the main loop, shutdown.
The engine (`engine`, timed by `_precise_timer`) sends every call at its intended time; the
rest have a job each: `_recorder` (each result to its window and /metrics), `_window_writer`
(windows to the store, retried), `_events` (overload and stream-lifetime events, written with
the next window), `_verdict_route` (the API's and the gauges' verdicts, judged in a worker
process), `_verdict_gauges` (the skewprobe_verdict gauges), `_health` (/healthz),
`_cost_line` (what the paths will cost, logged once), `_signals` (SIGTERM and SIGINT),
`_inventory_task` (the pod inventory and its snapshots), `_progress` (the lines a run logs
and its summary), `_api_server` (binding and serving the API), `_gc_tuning` (the collector,
opt-in), `_malloc` (freed arrays returned to the system).
"""

from probes.run.runner import ProbeRunner, Recorder, RunOptions, discovery_for

__all__ = ["ProbeRunner", "Recorder", "RunOptions", "discovery_for"]
