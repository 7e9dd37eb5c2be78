"""The limits every network server of the suite holds to, written once.

A peer that connects and sends nothing, or half a request, or thousands of connections,
costs each server a bounded number of descriptors for a bounded time, and cannot stop it
serving others (docs/architecture.md, Servers under load):

- ``limits``: the bounds (connections per peer and per process, header and body
  deadlines, body size) and the process's connection budget;
- ``accept``: an accept loop that holds the budget and survives accept failures;
- ``http``: aiohttp applications served behind those bounds;
- ``throttle``: logs that a flood cannot turn into a flood of log lines.
"""
