"""``python -m composable_dra_cli``: the `composable-dra` command."""

import sys

from composable_dra_cli import main

sys.exit(main())
