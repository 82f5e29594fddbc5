"""`python -m akri_trio_dev cluster up|down|status|env|node`: the development tools' command line.

The demo and the image builder are modules of their own (`python -m akri_trio_dev.demo`,
`python -m akri_trio_dev.cluster.image`).
"""

import sys

from akri_trio_dev.cli import main

sys.exit(main())
