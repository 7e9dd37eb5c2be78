// Wrapper module: builds the CNI loopback plugin from source through the Go module
// proxy; the CRI plugin reports the network ready only with a CNI config in place.
module composable-dra.local/hack/node/cni

go 1.26.0

tool github.com/containernetworking/plugins/plugins/main/loopback

require (
	github.com/containernetworking/cni v1.3.0 // indirect
	github.com/containernetworking/plugins v1.9.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/vishvananda/netlink v1.3.1 // indirect
	github.com/vishvananda/netns v0.0.5 // indirect
	golang.org/x/sys v0.35.0 // indirect
)
