"""Structured logs for the webhook: the core's JSON lines (`dra_gateway.kube.logs`).

Fields passed with `extra=` (`uid`, `namespace`, `pod`, `configmap`, ...) become keys of the
object, so an operator can follow one admission request by its UID. Admission answers are not
logged at INFO on the hot path (it would cost more than the answer); refusals and failures are.
This module only names the formatter the webhook uses; it decides nothing about what is logged.
"""

from dra_gateway.kube.logs import JsonFormatter, configure

__all__ = ["JsonFormatter", "configure"]
