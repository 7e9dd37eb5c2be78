"""Workloads a pod runs on a lent GPU (``python -m remote_gpu.workloads.<name>``)."""
