"""Huawei Ascend: the one `npu-smi` parser and the one device model every agent uses.

`npusmi` reads what npu-smi prints (the `info` table, `-t topo`, `-t health`, `-m`,
`-t info-vnpu`, the `set` answers) and raises `NpuSmiError` on anything else; `devices` names
the devices discovery publishes (ResourceSlices are the contract: the health monitor and the
partition manager use the same names) and holds the vNPU counter model.
"""
