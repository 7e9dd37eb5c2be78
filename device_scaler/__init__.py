"""The Dynamic Device Scaler: ComposableResources for pool allocations, release, idle scale-down."""
