"""aotid's compile worker: run by the daemon, never on the request path."""
