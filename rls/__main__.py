from rls.cli import main

raise SystemExit(main())
