"""The kubelet's DRA resource health protocol (k8s.io/kubelet pkg/apis/dra-health)."""
