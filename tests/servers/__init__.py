"""Small real servers for client tests: each one produces one kind of wire behaviour.

They run in the test's own event loop on a loopback address and a free port, and are closed
by the test (async context managers), so no socket or task outlives its test.
"""
