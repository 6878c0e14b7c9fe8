from relu2.cli import main

raise SystemExit(main())
