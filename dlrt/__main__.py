"""`python -m dlrt ...` is `dlrt ...`."""

from dlrt.entrypoints.cli import main

raise SystemExit(main())
