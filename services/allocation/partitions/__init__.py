"""The allocation agent's partitions: `by_backend.build()` combines every vendor's manager.

The seam itself (`Partition`, `PartitionManager`) is `shared.vendors.parts.partitions`.
"""
