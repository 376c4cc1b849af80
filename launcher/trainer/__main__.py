import sys

from launcher.trainer import main

sys.exit(main())
