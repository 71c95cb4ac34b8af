"""``python -m primeruns`` is the ``primeruns`` command."""

import sys

from primeruns.cli import main

sys.exit(main())
