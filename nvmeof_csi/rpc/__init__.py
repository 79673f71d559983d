"""The gRPC edge every server shares (CSI and the target agent): interceptor with the one error boundary,
redaction and log context; server lifecycle (sockets, mutual TLS, graceful stop); endpoints; all locks."""
