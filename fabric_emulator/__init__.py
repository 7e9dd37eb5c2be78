"""The mocked fabric: a stateful, standard-conformant Redfish composition service.

Modules: ``topology`` (hosts, zones, GPU blocks; file format), ``state`` (the composition
and its rules, pure), ``resources`` (Redfish payloads, pure), ``messages`` (registry
messages), ``auth`` (sessions, Basic), ``tasks`` (async changes), ``faults`` (fault
rules), ``persistence`` (state file), ``server`` (aiohttp app, admin API), ``main`` (the
``composable-dra fabric-emulator`` subcommand), ``testing`` (run it as a subprocess).
"""
