"""`dractl explain`: why a claim fits a node or not, and what would make it fit.

Reads ResourceSlices, DeviceClasses, ResourceClaims and DeviceTaintRules from the API server
(kubeconfig), takes the claim by name or the claims a manifest stands for (`-f`: a
ResourceClaim, ResourceClaimTemplate or Pod), and runs the product allocator on every node or
one. Exit 0 when every claim fits somewhere, 1 when one does not (or `--node` names a node
without devices), 2 on bad input (unknown class, malformed CEL, a claim only of other drivers,
a manifest it cannot read, an adminAccess claim the API server would refuse because its
namespace lacks the `resource.kubernetes.io/admin-access: "true"` label). Documents of other
kinds in a manifest (a Namespace, a DaemonSet) are skipped with a note on stderr.
"""

from __future__ import annotations

import argparse
from typing import TextIO

from services.dractl.subcommands import Subcommands
from shared.config import KubeSettings, add_arguments
from shared.kube import resources

__all__ = ["NAME", "NAMESPACES", "register", "run"]

NAME = "explain"
NAMESPACES = resources.ResourceType("", "v1", "namespaces", "Namespace", False)
"""Where a claim's admin access is allowed (its namespace's label)."""


def register(subcommands: Subcommands) -> None:
    """The global flags (`-o table|wide|json|yaml` among them) may follow the subcommand."""
    text = "why a claim fits a node or not, and what would make it fit"
    parser = subcommands.add(NAME, summary=text, description=text)
    parser.add_argument("claim", nargs="?", help="a ResourceClaim name (or use -f)")
    parser.add_argument("-n", "--namespace", default="default")
    parser.add_argument(
        "-f", "--filename", help="a ResourceClaim, template or Pod manifest; - for stdin"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--node", help="explain this node only")
    where.add_argument("--all-nodes", action="store_true", help="every node (the default)")
    add_arguments(parser, KubeSettings)


async def run(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """The subcommand (reads the API server, not the bus): the explanations on `out` (stdout),
    errors on `err` (stderr), where they become exit code 2."""
    # Here, not at the top: the allocator, CEL and the Kubernetes client load only for explain.
    from services.dractl import explain_command

    return await explain_command.run(args, out=out, err=err)
