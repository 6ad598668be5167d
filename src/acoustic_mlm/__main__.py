from acoustic_mlm.cli import main

raise SystemExit(main())
