"""The node plugin: GPU discovery, ResourceSlice publishing, the kubelet's DRA gRPC API, CDI."""
