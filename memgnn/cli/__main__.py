"""`python -m memgnn.cli ...` is `memgnn ...`."""

import sys

from memgnn.cli import main

sys.exit(main())
