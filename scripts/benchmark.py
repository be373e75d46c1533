#!/usr/bin/env python
"""foxhunt's benchmark against its peers and the limit (see foxhunt.bench and conf/bench/default.yaml).

    python scripts/benchmark.py            # the full run: outputs/bench/benchmark.{md,json}
    python scripts/benchmark.py --quick    # every section, briefly
    python scripts/benchmark.py --sections rl,latency --set threads=[1]

The peers (Stable-Baselines3, pytorch-forecasting) come with `pip install -e '.[bench]'`; a
section whose peer is missing is skipped with a note.
"""

import sys

from foxhunt.bench.run import main

if __name__ == "__main__":
    sys.exit(main())
