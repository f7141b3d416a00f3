"""Wire types: what clients send (requests, items, tools) and what we send back (Response, events)."""
