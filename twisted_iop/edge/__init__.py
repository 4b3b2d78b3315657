"""The Edge agent: control-plane connector, node server, pool, commands."""
