import sys

from thunderplug.cli import main

sys.exit(main())
