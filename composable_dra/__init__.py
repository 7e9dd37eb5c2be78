"""composable-dra: the library the suite's components share; it imports none of them.

- ``k8s``: the Kubernetes API as the components use it: the client (``kube``), watches
  (``informer``), retries, leader election, conditions, resource slices, wakes;
- ``fabric``: fabric managers (Redfish, Fsas) behind one backend protocol;
- ``lending``: the remote-GPU lending rules and lease API client the plugin, the scaler
  and the donor share;
- ``model``: the suite's own names and objects (GpuConfig, the sizing rule);
- ``process``: what every component process has: logging, the metrics endpoint, the
  leader-elected controllers' run loop;
- ``serving``: the limits every network server holds to;
- ``commands``: the library's own subcommands (``qos-selector``, ``migrate-cohdi``).

The ``composable-dra`` command itself (``composable_dra_cli``) sits above the components.
"""

__version__ = "0.1.0"
