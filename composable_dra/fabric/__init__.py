"""Fabric access shared by the operator and the pool publisher.

`backend` is the seam (the `FabricBackend` protocol, typed errors, inventory
records); `redfish` and `redfish_zones` are its Redfish implementations;
`registry` turns the cluster's Fabric resources into backends.
"""
