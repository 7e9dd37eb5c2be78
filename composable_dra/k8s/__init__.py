"""The Kubernetes API as every component uses it (docs/architecture.md, Rules for the
Kubernetes API).

``kube`` is the client (plain dicts, bounded JSON via ``kube_json``); ``informer`` the one
way to watch, caching read-only objects (``frozen``, ``kept``); ``retry`` the one retry
policy; ``leader`` leader election; ``conditions``, ``timestamps`` and ``quantity`` the
API's formats; ``resource_slices`` and ``wake`` what the DRA publishers share.
"""
