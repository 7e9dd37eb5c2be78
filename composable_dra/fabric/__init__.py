"""Fabric managers behind one seam, for the operator, the pool publisher, the scaler's
pool slots and the plugin's Redfish device source.

- ``backend``: the seam (the ``FabricBackend`` protocol, inventory records); ``errors``:
  the typed errors a backend raises; ``registry`` turns the cluster's Fabric resources
  into backends;
- ``redfish`` and ``redfish_zones``: the Redfish implementations; ``members`` reads a
  (paged) Redfish collection;
- ``fsas`` and ``fsas_answers``: the Fsas fabric manager's backend and its answers;
  ``slots``: pool slots for a fabric that picks the device at attach;
- ``connection``: how every client of a fabric manager connects (TLS trust, time limit,
  pool size);
- ``http_answer``, ``http_deadline``, ``retry_after`` and ``bounded_json``: a fabric's
  HTTP answers read within bounds (``bounded_json`` also serves the fabric emulator).
"""
