"""Device sources: static (a file), redfish (the fabric manager), nvml (the GPUs' driver)."""
