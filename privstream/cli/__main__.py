"""``python -m privstream.cli``: the console script."""

import sys

from privstream.cli.commands import main

sys.exit(main())
