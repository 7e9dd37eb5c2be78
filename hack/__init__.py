"""Developer tooling: the local control plane, the kubelet emulator, demos, benchmarks."""
