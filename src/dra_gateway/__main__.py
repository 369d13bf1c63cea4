from dra_gateway.cli import main

raise SystemExit(main())
