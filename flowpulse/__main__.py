import sys

from flowpulse.cli import main

sys.exit(main())
