"""`dra-gateway preflight`: what the gateway needs from a cluster, check by check, and what is
missing there.

It reads the cluster through the cluster port (`reading.py`, which writes nothing: the feature
gates are learnt by dry-run probe slices, as the components learn them, which store nothing),
judges what it read (`checks.py`, pure) and prints it (`render.py`). Each check has a severity:
ok, info, warning or error. Exit codes, as the other commands': 0 nothing worse than info; 1
the API failed; 2 bad input (the kubeconfig); 3 the worst is a warning; 4 an error (1 and 2
keep their meaning everywhere, so a warning cannot look like an unreachable API).
"""

from dra_gateway.preflight.checks import Check, Item, Severity, judge
from dra_gateway.preflight.command import register
from dra_gateway.preflight.reading import Facts, read_facts

__all__ = ["Check", "Facts", "Item", "Severity", "judge", "read_facts", "register"]
