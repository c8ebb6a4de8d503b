import sys

from thunderplug.commands.cli import main

sys.exit(main())
