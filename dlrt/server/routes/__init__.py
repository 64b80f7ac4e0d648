"""The route handlers, one module per endpoint family; each reads the `ServerState` from the
request."""
