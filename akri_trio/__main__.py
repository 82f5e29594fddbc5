"""`python -m akri_trio` is `akri-trio`."""

import sys

from akri_trio.cli import main

sys.exit(main())
