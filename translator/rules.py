"""Translation rules: the public face of the rules model, its loader and the compiled rule set.

A rules document (`apiVersion: dra-gateway.io/v1alpha1`, `kind: TranslationRules`) lists rules
that say which legacy container resources they translate, how to compute the DRA device request
from them with CEL, and which device class serves it. The work is split by idea:

- `documents.py`: the document as typed models, for loading only;
- `errors.py`: `RulesError` and the collector of problems with their field paths;
- `compiling.py`: one rule compiled to CEL programs and dry-run at load;
- `ruleset.py`: `CompiledRule` and `RuleSet`, the structures the admission hot path reads;
- `selectors.py`: device selectors rendered safely from pod text;
- `loading.py`: files, folders and ConfigMap data to a `RuleSet`, overrides applied.

This module only re-exports their public names, so that callers import from one place; it must
not grow code of its own.
"""

from __future__ import annotations

from dra_gateway.translator.documents import (
    BASE_VARIABLES,
    UNITS,
    ExtendedResourceNames,
    OverrideSpec,
    RulesDocument,
    RuleSpec,
)
from dra_gateway.translator.errors import RulesError, format_path
from dra_gateway.translator.loading import (
    Source,
    builtin_sources,
    config_map_label,
    config_map_sources,
    load_rules,
)
from dra_gateway.translator.ruleset import CompiledRule, CompiledSelector, RuleSet
from dra_gateway.translator.selectors import render_selector, selector_values

__all__ = [
    "BASE_VARIABLES",
    "UNITS",
    "CompiledRule",
    "CompiledSelector",
    "ExtendedResourceNames",
    "OverrideSpec",
    "RuleSet",
    "RuleSpec",
    "RulesDocument",
    "RulesError",
    "Source",
    "builtin_sources",
    "config_map_label",
    "config_map_sources",
    "format_path",
    "load_rules",
    "render_selector",
    "selector_values",
]
