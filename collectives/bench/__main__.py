"""``python -m collectives.bench``: the bench's command line (``--help`` lists the flags)."""
import sys

from .cli import main

sys.exit(main())
