"""``python -m edge_contracts.conformance``: run the conformance fixtures."""

from edge_contracts.conformance import main

raise SystemExit(main())
