"""Software-defined fallback: lend a donor node's GPU over the network as functional offload.

A pod names a function from the donor's allow-list and sends arrays; a worker process per
lease runs it and sends arrays back. See ``protocol`` for the wire format, ``donor`` for
the server, ``client`` for :class:`RemoteGPU`.
"""

try:
    import numpy  # noqa: F401  (every part of the service moves numpy arrays)
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(
        "the remote GPU service needs numpy: install the 'remote' extra "
        "(pip install 'composable-dra[remote]')",
        name="numpy",
    ) from exc
