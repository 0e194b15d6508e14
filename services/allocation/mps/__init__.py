"""MPS for shared NVIDIA GPUs: one control daemon per claim that shares a GPU.

`limits` plans (pure) which of a claim's GPUs its daemon serves and the limits it sets,
`layout` says where its pipe and log directories live and how they reach the containers,
`daemons` starts, adopts and stops the daemons (`nvidia-cuda-mps-control`).
"""
