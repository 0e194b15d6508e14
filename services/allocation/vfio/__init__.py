"""Devices prepared for virtual machines through VFIO (docs/vfio.md).

A claim whose DeviceConfig says `passthrough: vfio` (from the claim or its DeviceClass) gets
each device's PCI functions bound to `vfio-pci` instead of container edits of its vendor:
`plan` decides what the claim needs (pure: the functions, the IOMMU group, the CDI edits that
hand only `/dev/vfio/vfio` and `/dev/vfio/<group>` to the VM's launcher), `binder` moves the
functions between drivers through the `sysfs` seam, recording each function's original driver
in the `ledger` before its first write, so that a crash at any step is undone or finished at
the next start and unprepare binds the original driver back.
"""
