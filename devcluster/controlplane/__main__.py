"""`python -m devcluster.controlplane [MINOR ...|all]`: build the real control plane
(what `make k8s` runs); see `build.main`."""

import sys

from devcluster.controlplane.build import main

sys.exit(main())
