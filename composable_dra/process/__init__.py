"""What every component process has: one logging setup (``logs``), the metrics endpoint
(``metrics``), flags defaulted from the environment (``flags``), few malloc arenas
(``arenas``), and the leader-elected controllers' run loop (``component``)."""
