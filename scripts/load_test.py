#!/usr/bin/env python
"""Load test of `foxhunt ensemble serve`: 8 concurrent clients on loopback, every answer checked
against the in-process replay (see foxhunt.ensemble.loadtest).

    python scripts/load_test.py asset=es                       # starts a server on a free port
    python scripts/load_test.py --url http://127.0.0.1:8080 --clients 8 --bars 300 asset=es
"""

import sys

from foxhunt.ensemble.loadtest import main

if __name__ == "__main__":
    sys.exit(main())
