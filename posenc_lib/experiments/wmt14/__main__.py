"""``python -m posenc_lib.experiments.wmt14``: see :mod:`posenc_lib.experiments.wmt14.cli`."""
import sys

from .cli import main

sys.exit(main())
