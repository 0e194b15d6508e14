"""VFIO passthrough facts and rules shared by the discovery and allocation agents (docs/vfio.md).

`pci`: what sysfs says about a PCI function and its IOMMU group, and the one viability rule
both agents apply. `kernel_sim`: the kernel's reaction to the sysfs writes that bind a function
to `vfio-pci` and back, over a plain directory tree (the sim backend's and the tests' kernel).
"""
