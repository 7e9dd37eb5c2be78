"""How a client reaches a fabric manager: whose certificates it trusts, how long one call
may take, how many connections it keeps open. One definition for the Redfish and Fsas
backends and the plugin's Redfish device source, so that they decide TLS alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import certifi

# Connections kept open to one fabric: requests' default; a caller making concurrent
# calls (the operator: one per I/O thread) passes its own count.
DEFAULT_CONNECTIONS = 10


@dataclass(frozen=True)
class Connection:
    ca_file: str | None = None  # the Fabric's CA bundle; None: the certifi bundle
    insecure_skip_tls_verify: bool = False  # the Fabric's spec: labs only
    timeout: float = 15.0  # seconds, one call and its answer
    connections: int = DEFAULT_CONNECTIONS

    def ca_bundle(self) -> str | None:
        """The CA bundle to verify the manager's certificate with; None only when told
        not to verify. Always a file otherwise: the DMTF client skips verification unless
        given one, and a requests session's own trust loses to ``REQUESTS_CA_BUNDLE``."""
        if self.insecure_skip_tls_verify:
            return None
        return self.ca_file or certifi.where()


DEFAULT = Connection()
