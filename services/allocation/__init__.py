"""The allocation agent: the kubelet-facing side of the driver, one package per concept.

`dra` (the DRA kubelet plugin) and `deviceplugin` (the device plugin API) are its two fronts, one
per node; both use `kubelet` (sockets, servers, request guards), `node_view` (the node's
inventory and device health, from the bus) and `cdi` (spec files and allowlisted container
edits). `partitions` makes MIG devices and vNPUs at prepare time for the DRA front; `vfio`, `mps`
and `status` serve it too. `claim` (the claim, its opaque config, the checkpoint) is what all of
them share.
"""
