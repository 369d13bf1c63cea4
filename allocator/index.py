"""Which pods use which claims, kept from the informers' events for the allocator controller.

Two relations, each kept in both directions:

- by name: the claims a pod names in `spec.resourceClaims` or its claim statuses, and where
  each pod uid lives (namespace, name), so that a claim's change can wake its pods;
- by claim: the pods that own a claim (controller reference) or are in its `reservedFor`, so
  that a pod's end can queue the claims it held even when the pod never named them.

Plain bookkeeping on the event loop: it must not read the API, the informers' stores or the
planner state, and it takes no decisions.
"""

from __future__ import annotations

from collections.abc import Iterable

from dra_gateway.allocator.work import ClaimKey
from dra_gateway.kube import objects
from dra_gateway.kube.objects import RawObject


class ClaimIndex:
    def __init__(self) -> None:
        self._pod_location: dict[str, tuple[str, str]] = {}  # pod uid -> (namespace, name)
        self._named_by: dict[ClaimKey, set[str]] = {}  # claim -> uids of pods naming it
        self._names_of: dict[str, set[ClaimKey]] = {}  # pod uid -> claims it names
        self._held_by: dict[ClaimKey, set[str]] = {}  # claim -> uids of owner and reserved pods
        self._holds: dict[str, set[ClaimKey]] = {}  # pod uid -> claims it owns or reserves

    # Pods ----------------------------------------------------------------------------------

    def set_pod(self, pod: RawObject) -> None:
        """Record where a pod lives and the claims it names (replacing what it named before)."""
        uid = objects.uid(pod)
        ns, name = objects.namespace_name(pod)
        self._pod_location[uid] = (ns, name)
        refs = {ClaimKey(ns, claim) for claim in objects.claim_names_of(pod)}
        before = self._names_of.get(uid, set())
        if refs == before:
            return
        self._unlink(self._named_by, uid, before - refs)
        for ref in refs - before:
            self._named_by.setdefault(ref, set()).add(uid)
        self._names_of[uid] = refs

    def remove_pod(self, uid: str) -> None:
        """Forget a deleted pod's location and names; its holds go with the claims' changes."""
        self._pod_location.pop(uid, None)
        self._unlink(self._named_by, uid, self._names_of.pop(uid, set()))

    def pod_location(self, uid: str) -> tuple[str, str] | None:
        """(namespace, name) of a pod seen alive, or None."""
        return self._pod_location.get(uid)

    def claims_of(self, pod_uid: str) -> set[ClaimKey]:
        """The claims a pod names, owns or is reserved in."""
        return self._names_of.get(pod_uid, set()) | self._holds.get(pod_uid, set())

    # Claims --------------------------------------------------------------------------------

    def set_claim(self, claim: RawObject) -> None:
        """Record the pods that own a claim or are in its reservedFor (replacing the old ones)."""
        key = ClaimKey(*objects.namespace_name(claim))
        self.remove_claim(key)
        pods = objects.owner_and_reserved(claim)
        if pods:
            self._held_by[key] = pods
            for uid in pods:
                self._holds.setdefault(uid, set()).add(key)

    def remove_claim(self, key: ClaimKey) -> None:
        for uid in self._held_by.pop(key, set()):
            keys = self._holds.get(uid)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._holds[uid]

    def users_of(self, claim: RawObject) -> set[str]:
        """Uids of the pods that name, own or reserve a claim (as the object says now)."""
        key = ClaimKey(*objects.namespace_name(claim))
        return set(self._named_by.get(key, set())) | objects.owner_and_reserved(claim)

    @staticmethod
    def _unlink(index: dict[ClaimKey, set[str]], uid: str, keys: Iterable[ClaimKey]) -> None:
        for key in keys:
            users = index.get(key)
            if users is not None:
                users.discard(uid)
                if not users:
                    del index[key]


__all__ = ["ClaimIndex"]
