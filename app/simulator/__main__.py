import sys

from app.simulator import main

sys.exit(main())
