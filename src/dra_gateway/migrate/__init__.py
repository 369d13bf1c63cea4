"""`dra-gateway migrate`: moving a live cluster from legacy GPU stacks to the gateway.

`plan` reads a cluster (live, or from manifest files) and says what every namespace, workload,
node and quota becomes and the steps in order; `quotas` writes the GPUQuotas equivalent to the
ResourceQuotas on legacy GPU names; `node` cuts one node over and says what it still waits for.
One module per idea: `dumps` and `live` read, `rules` loads the rules in force, `plan` and
`quotas` decide, `node` judges and labels nodes, `render` draws, `commands` wires the command
line. Only `commands` is imported at start-up, and it imports the rest when a command runs.
"""

from dra_gateway.migrate.commands import register

__all__ = ["register"]
