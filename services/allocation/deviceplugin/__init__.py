"""The device-plugin front: the kubelet device plugin API v1beta1, one server per resource."""
