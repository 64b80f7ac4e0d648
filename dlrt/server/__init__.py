"""The HTTP server: NDJSON `/generate`, OpenAI-compatible endpoints, one request at a time."""
