"""Sessions: what outlives one request or one connection — background responses and WebSocket resume.

A floor between the transports and the turn: ``gateway.transport`` imports this room; this room
imports ``gateway.turn``, ``gateway.wire``, ``gateway.base``, ``cache`` and ``billing``, and never
the transport (the turn task it runs a background response in is handed in by the app).

- ``background_machine``: the sans-I/O core — a background response's lifecycle as a table
  (queued -> running -> ended; cancel here or from another replica, a lost lease, the shutdown;
  a dead owner's lease claimed and reaped), what a cancel does, what a replay from ``N`` answers;
- ``background``: this replica's background responses (accept, start, end, cancel, shutdown);
- ``background_turn``: one of them as it runs (its events logged once, its end);
- ``replicas``: the Redis side (leases' heartbeat, cancel watch, reaper);
- ``replay``: a stream resumed after ``N``, as events each transport frames;
- ``resumable``: closed WebSocket connections' ``store=false`` lane states, kept for a reconnect.
"""
