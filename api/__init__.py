"""API definitions: the kubelet gRPC contracts and the suite's custom resources."""
