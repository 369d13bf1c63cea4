"""dra-gateway: legacy GPU requests to Kubernetes DRA, with sharing, packing and quotas."""

__version__ = "0.1.0"
