"""Translation of legacy GPU requests into DRA claims, driven by declarative rules. Pure: no I/O."""
