"""The DRA driver's kubelet plugin, one per node: it publishes the node's devices as
ResourceSlices and prepares claims over the kubelet's gRPC (the pool publisher, which
publishes the fabric's free GPUs, is the package ``pool_publisher``)."""
