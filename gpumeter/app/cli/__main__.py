"""`python -m gpumeter.app.cli`: the same as the `gpumeter` console script."""

import sys

from gpumeter.app.cli import main

sys.exit(main())
