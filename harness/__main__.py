"""`python -m harness`: the same as the `harness` command."""

import sys

from harness.cli import main

sys.exit(main())
