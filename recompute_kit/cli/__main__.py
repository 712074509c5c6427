"""`python -m recompute_kit.cli`."""

import sys

from .parser import main

sys.exit(main())
