"""The kubelet's gRPC APIs (DRAPlugin v1 and v1beta1, plugin registration, pod resources v1),
generated from the hand-written .proto files next to this file by `generate.py`; nothing here is
edited by hand."""
