"""`skewprobe run`: one probe process, from startup to the last window written.

`runner` is the process itself, as uvicorn's server is: startup, the main loop, shutdown
(SIGTERM and SIGINT stop it). The engine (`engine`; its seams, the prober and the sink, in
`seams`; its schedules on one timer in `_schedule`, timed by `_precise_timer`) sends every
call at its intended time; the rest have a job each: `_recording` (each result to its window
and /metrics; the overload and stream-lifetime events written with the next window),
`_window_writer` (windows to the store, retried), `_verdict_publish` (the API's and the
gauges' verdicts, judged in a worker process), `_status` (the cost line, the progress lines,
the summary and /healthz), `_inventory_task` (the pod inventory and its snapshots),
`_api_server` (binding and serving the API; who may read it: its token and TLS), `_memory`
(the collector, opt-in, and freed arrays returned to the system).
"""

from probes.run._api_server import TOKEN_ENV, resolve_access
from probes.run.runner import ProbeRunner, Recorder, RunOptions, discovery_for

__all__ = ["TOKEN_ENV", "ProbeRunner", "Recorder", "RunOptions", "discovery_for", "resolve_access"]
