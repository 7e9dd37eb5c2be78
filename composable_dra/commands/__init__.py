"""The subcommands that belong to no component: ``qos-selector`` (``qos_selector``) and
``migrate-cohdi`` (``migrate_cohdi``, with ``cohdi`` and ``safe_yaml``). The table of every
subcommand is ``composable_dra_cli``."""
