"""The DRA front: the kubelet's DRAPlugin and health services, prepare and unprepare."""
