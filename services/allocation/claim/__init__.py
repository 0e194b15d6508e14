"""A claim as this node knows it: its allocation as read from the API (`claims`, with the bounds
of `echo`, `nesting` and `node_selector`), its opaque configuration (`opaque`, decoded by
`config_schema`), and the checkpointed record of its preparation (`checkpoint`)."""
