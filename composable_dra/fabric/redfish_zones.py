"""The `redfish-zones` backend: composition by updating a system's list of resource blocks.

Some fabric managers do not offer the ComputerSystem.AddResourceBlock and
RemoveResourceBlock actions. They compose by PATCHing ``Links.ResourceBlocks`` of the
composed ComputerSystem with the complete new list; ResourceZones say which blocks may
join which system. Reads are the same as the `redfish-composition` backend's.

A PATCH replaces the whole list, so two writers could undo each other's change. Every
PATCH therefore carries the ETag of the system it was computed from (If-Match): when the
system changed in between, the fabric answers 412 and nothing is applied; the operator
re-reads and decides again.
"""

from __future__ import annotations

from composable_dra.fabric.backend import Operation
from composable_dra.fabric.errors import BusyError, OperationFailedError
from composable_dra.fabric.redfish import (
    ROOT,
    RedfishCompositionBackend,
    block_uri,
    error_for,
)


def new_block_list(current: list[str], device_id: str, add: bool) -> list[str] | None:
    """The system's block list after the change, or None when there is nothing to change."""
    uri = block_uri(device_id)
    present = uri in current
    if add == present:
        return None
    return [*current, uri] if add else [u for u in current if u != uri]


class RedfishZonesBackend(RedfishCompositionBackend):
    def _change(self, action: str, device_id: str, host_id: str) -> Operation | None:
        system_uri = f"{ROOT}/Systems/{host_id}"
        status, system, headers = self._call("GET", system_uri)
        if status != 200 or not isinstance(system, dict):
            raise error_for(status, system, headers, f"GET {system_uri}")
        etag = headers.get("etag")
        if not etag:
            # Without an ETag a lost race would silently drop another writer's block.
            raise OperationFailedError(f"{system_uri} has no ETag; refusing an unguarded PATCH")
        links = system.get("Links", {}).get("ResourceBlocks", [])
        current = [str(ref.get("@odata.id", "")) for ref in links]
        wanted = new_block_list(current, device_id, add=action == "AddResourceBlock")
        if wanted is None:
            return None  # already as asked
        status, payload, answered = self._call(
            "PATCH",
            system_uri,
            {"Links": {"ResourceBlocks": [{"@odata.id": uri} for uri in wanted]}},
            {"If-Match": etag},
        )
        if status == 412:
            raise BusyError(f"{system_uri} changed while {action} was prepared", retry_after=0.2)
        return self._accepted(status, payload, answered, f"{action} {device_id} on {host_id}")
