"""The transports: HTTP routes (JSON and SSE), the WebSocket endpoint and its sans-I/O lane machine.

Thin adapters around the turn pipeline: they parse frames and bodies, authenticate, pick a lane and
frame the pipeline's events. Nothing here decides what the model sees.
"""
