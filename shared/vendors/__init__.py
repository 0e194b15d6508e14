"""One package per vendor, each holding its device model and every agent's part of it.

`sim`, `nvidia` and `ascend` each export one `VENDOR` (`parts.vendor.Vendor`) bundling the
discovery backend, the health monitor, the partition manager, the CDI edits and rules and the
device-plugin names; `registry` maps backend names to them; `parts` holds the neutral seams
both the vendor packages and the agents import. Nothing here imports `services`.
"""
