"""respgate's service layer: transports (HTTP/SSE, WebSocket), wire types, the turn pipeline."""
