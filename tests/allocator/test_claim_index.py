"""Which pods use which claims: the allocator's index, kept from pod and claim events."""

from __future__ import annotations

from typing import Any

from dra_gateway.allocator.index import ClaimIndex
from dra_gateway.allocator.work import ClaimKey


def _pod(uid: str, *claims: str, name: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name or f"pod-{uid}", "namespace": "ns", "uid": uid},
            "spec": {"resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims]}}


def _claim(name: str, *, owner: str | None = None, reserved: tuple[str, ...] = ()
           ) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"claim-{name}"}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": f"pod-{owner}",
                                    "uid": owner, "controller": True}]
    return {"metadata": meta, "status": {"reservedFor": [
        {"resource": "pods", "name": f"pod-{u}", "uid": u} for u in reserved]}}


def test_a_pod_is_found_by_uid_and_as_a_user_of_the_claims_it_names() -> None:
    index = ClaimIndex()
    index.set_pod(_pod("u1", "a", "b"))
    assert index.pod_location("u1") == ("ns", "pod-u1")
    assert index.users_of(_claim("a")) == {"u1"}
    assert index.claims_of("u1") == {ClaimKey("ns", "a"), ClaimKey("ns", "b")}


def test_a_pod_that_names_other_claims_stops_using_the_old_ones() -> None:
    index = ClaimIndex()
    index.set_pod(_pod("u1", "a"))
    index.set_pod(_pod("u1", "b"))
    assert index.users_of(_claim("a")) == set()
    assert index.claims_of("u1") == {ClaimKey("ns", "b")}


def test_a_removed_pod_is_forgotten_but_claims_still_name_their_holders() -> None:
    index = ClaimIndex()
    index.set_pod(_pod("u1", "a"))
    index.set_claim(_claim("b", owner="u1"))
    index.remove_pod("u1")
    assert index.pod_location("u1") is None
    assert index.users_of(_claim("a")) == set()
    # The claim's owner reference outlives the pod until the claim itself changes.
    assert index.claims_of("u1") == {ClaimKey("ns", "b")}


def test_owners_and_reserved_pods_hold_a_claim_they_never_named() -> None:
    index = ClaimIndex()
    index.set_claim(_claim("c", owner="u1", reserved=("u2",)))
    assert index.claims_of("u1") == index.claims_of("u2") == {ClaimKey("ns", "c")}
    assert index.users_of(_claim("c", owner="u1", reserved=("u2",))) == {"u1", "u2"}


def test_a_claims_new_holders_replace_the_old_and_removal_clears_them() -> None:
    index = ClaimIndex()
    index.set_claim(_claim("c", reserved=("u1",)))
    index.set_claim(_claim("c", reserved=("u2",)))
    assert index.claims_of("u1") == set()
    assert index.claims_of("u2") == {ClaimKey("ns", "c")}
    index.remove_claim(ClaimKey("ns", "c"))
    assert index.claims_of("u2") == set()


def test_users_of_a_claim_join_the_pods_naming_it_with_its_owner_and_reservations() -> None:
    index = ClaimIndex()
    index.set_pod(_pod("u1", "c"))
    # users_of reads owner and reservedFor from the object given, not from the index.
    assert index.users_of(_claim("c", owner="u3")) == {"u1", "u3"}
