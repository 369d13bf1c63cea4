"""The core every component builds on: names, quantities, models, Kubernetes CEL, the cluster port.

Nothing here imports a component; components import from here.
"""
