"""The CSI gRPC edge: servicers validate, lock, call one service and build the reply."""
