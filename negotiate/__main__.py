import sys

from negotiate.cli import main

sys.exit(main())
