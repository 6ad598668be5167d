"""`python -m acoustic_mlm.config --write | --check`: the configuration's JSON schema from its dataclasses
(acoustic_mlm.config.schema)."""

import sys

from acoustic_mlm.config.schema import main

sys.exit(main())
