"""`python -m rls.demo`: the same as `rls demo`."""

import sys

from rls.demo.cli import main

sys.exit(main(sys.argv[1:]))
