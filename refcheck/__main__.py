"""``python -m refcheck``: the ``refcheck`` command line."""
import sys

from refcheck.cli import main

sys.exit(main())
