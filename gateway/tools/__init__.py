"""Tools the gateway runs itself (issue 30): the MCP client and the per-tenant cache of servers'
tool lists. The turn's tool loop (``gateway/turn``) calls them; nothing here knows of turns."""
