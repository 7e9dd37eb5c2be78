"""The composable operator: attaches and detaches fabric devices for ComposableResources."""
