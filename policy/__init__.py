"""Quota and sharing policies (`GPUQuota`, `GPUSharingPolicy`): models and pure evaluation.

The webhook asks `check_admission` what can never be admitted; the allocator, authoritative,
asks the `QuotaLedger` and `card_refusal` before it places anything; `report` reads the same
ledger. This package imports only the core's models, quantities and CEL: no cluster port, no
asyncio, no I/O.
"""
