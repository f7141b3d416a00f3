"""Loopback stand-ins for web search services (issue 32): no test reaches the internet."""
