"""Resource names that look like typos: a name under a vendor domain the rules read, that no rule
reads (`nvidia.com/gpumemory`, `nvidia.com/gpu-typo`), or one close to a name a rule reads.

Such a name passes translation silently: the container keeps it, no node offers it, and the pod
waits for ever. `translate` records each one (`UnknownResource`) with its warning, the closest
name a rule reads as a did-you-mean; the webhook returns the warning to whoever created the pod
(kubectl prints it as "Warning: ..."), `dra-gateway translate` prints it and `--explain` gives
the same reason. This module is the one home of that message, kept within the 120 characters
Kubernetes advises for an admission warning, on one line whatever the pod's text holds.

The vendor domains come from the loaded rules (`RuleSet.vendor_domains`), never from a list
here: an administrator's rule for another vendor brings its domain along. Pure; the verdict
per name is remembered on the rule set, so the admission path pays for the search once.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Final

from dra_gateway.translator.errors import quote
from dra_gateway.translator.rules import RuleSet

__all__ = ["WARNING_LIMIT", "UnknownResource", "misspelt"]

# What Kubernetes advises for one admission warning (longer ones may be cut, past 256 always).
WARNING_LIMIT: Final = 120
# How close a name outside the rules' domains must be to a known one to be taken for a typo
# of it (`nvidia.con/gpu`); inside a domain every name is warned about, and the closest known
# one suggested where it is this close (the shared domain already makes names look alike).
_ANY_DOMAIN_CUTOFF: Final = 0.85
_SUGGESTION_CUTOFF: Final = 0.7
_SPELLINGS_KEPT: Final = 1024


@dataclass(frozen=True, slots=True)
class UnknownResource:
    """A name a container asks for that looks like a typo: no rule reads it; `suggestion` is
    the closest name a rule reads, "" when none is close."""

    container: str
    resource: str
    suggestion: str

    @property
    def reason(self) -> str:
        """Why the name stays in the container, and what was probably meant."""
        if self.suggestion:
            return f"no dra-gateway rule reads it; did you mean {self.suggestion}?"
        return "no dra-gateway rule reads it; the pod waits for a node offering it"

    @property
    def warning(self) -> str:
        """The warning of the plan, the webhook and `dra-gateway translate`: one line of at
        most `WARNING_LIMIT` characters, the did-you-mean kept whole."""
        container, resource, reason = quote(self.container), _one_line(self.resource), self.reason
        text = f"container {container}: {resource}: {reason}"
        if len(text) > WARNING_LIMIT:
            # The pod's own text gives way, cut in its middle: the reason is what helps.
            room = WARNING_LIMIT - len(text) + len(container) + len(resource)
            mine = min(len(container), max(room // 3, room - len(resource)))
            text = (f"container {_shortened(container, mine)}: "
                    f"{_shortened(resource, room - mine)}: {reason}")
        return text if len(text) <= WARNING_LIMIT else text[:WARNING_LIMIT - 3] + "..."


def misspelt(resource: object, rules: RuleSet) -> str | None:
    """None when `resource` does not look like a typo (a name some enabled rule reads is not
    asked about); else the closest name an enabled rule reads, "" when none is close."""
    if not isinstance(resource, str) or "/" not in resource:
        return None  # cpu, memory, hugepages-2Mi: no vendor's
    spellings = rules.spellings
    if resource in spellings:
        return spellings[resource]
    if rules.is_legacy(resource) or (rules.disabled_resources and rules.disabled_rule(resource)):
        return None  # read by a rule (a disabled one's warning says so itself)
    known = sorted(rules.legacy_resource_names())
    inside = resource.split("/", 1)[0] in rules.vendor_domains
    close = difflib.get_close_matches(
        resource, known, n=1, cutoff=_SUGGESTION_CUTOFF if inside else _ANY_DOMAIN_CUTOFF)
    verdict = close[0] if close else ("" if inside else None)
    if len(spellings) >= _SPELLINGS_KEPT:
        spellings.clear()  # names repeat as shapes do; a full reset keeps the bound
    spellings[resource] = verdict
    return verdict


def _one_line(text: str) -> str:
    """`text` as it can stand in a warning: escaped where it holds what is not printable."""
    return text if text.isprintable() else json.dumps(text)[1:-1]


def _shortened(text: str, length: int) -> str:
    """`text` in at most `length` characters (at least 9), "..." standing for its middle."""
    if len(text) <= length:
        return text
    keep = max(length - 3, 6)
    return text[:keep - keep // 2] + "..." + text[len(text) - keep // 2:]
