"""NVIDIA's device model, shared by every agent (pure): MIG geometry and device naming.

`mig`: GPU-instance profiles, placements, the instances and MIG devices NVML reports, and the
H100-80GB profile table the sim imitates. `naming`: the names discovery gives GPUs and MIG
devices (which the partition manager, the CDI edits and the health monitor read back), MIG
UUIDs, and the numbering of the MIG capability device nodes.
"""
