import sys

from labkernels.cli import main

sys.exit(main())
