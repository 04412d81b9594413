"""`python -m rayslice.recovery`: the controller service (see `rayslice.recovery.controller`)."""

import sys

from rayslice.recovery.controller import main

sys.exit(main())
