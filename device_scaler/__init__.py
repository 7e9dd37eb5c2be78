"""The Dynamic Device Scaler: turns pool allocations into ComposableResources."""
