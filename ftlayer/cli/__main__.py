"""``python -m ftlayer.cli``: the ``ftlayer`` command."""

import sys

from ftlayer.cli import main

sys.exit(main())
