"""What every component process has: one logging setup (``logs``), the metrics endpoint
(``metrics``), and the leader-elected controllers' run loop (``component``)."""
