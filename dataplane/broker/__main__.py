"""`python -m dataplane.broker --config broker.json`: run one broker process."""

import sys

from dataplane.broker.process import main

if __name__ == "__main__":
    sys.exit(main())
