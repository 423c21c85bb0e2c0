from rls.cli.entry import main

raise SystemExit(main())
