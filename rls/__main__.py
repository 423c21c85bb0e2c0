from rls.entry import main

raise SystemExit(main())
