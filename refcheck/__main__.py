"""``python -m refcheck``: the ``refcheck`` command line."""
import sys

from refcheck.commands.cli import main

sys.exit(main())
