"""The DRA driver: the kubelet plugin (one per node) and the pool publisher."""
