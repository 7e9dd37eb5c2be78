"""The pool publisher: one cluster-level Deployment that publishes each fabric
zone's free GPUs as a ResourceSlice pool the scheduler can allocate from."""
