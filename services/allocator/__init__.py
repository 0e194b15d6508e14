"""The structured allocator: kube-scheduler's DRA allocation of ResourceClaims, modelled in Python.

Pure: slices, classes, claims and DeviceTaintRules in as JSON, allocations and explanations out.
Imported by `dractl explain` and the devcluster; the node agents never import it.
"""
