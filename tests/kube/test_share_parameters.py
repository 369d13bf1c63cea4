"""Which GpuShareConfig applies to a request: one merge for the planner and the node plugin."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gateway.kube import names
from dra_gateway.kube.models import config_applies, share_parameters


def _config(requests: list[str] | None = None, *, driver: str = names.DRIVER,
            **params: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        config["requests"] = requests
    return config


def test_a_config_without_requests_applies_to_every_request() -> None:
    assert config_applies(None, "gpu")
    assert config_applies([], "gpu/large")


def test_a_config_for_a_request_covers_its_first_available_results() -> None:
    assert config_applies(["gpu"], "gpu/large")
    assert config_applies(["gpu/large"], "gpu/large")
    assert not config_applies(["gpu/small"], "gpu/large")
    assert not config_applies(["other"], "gpu")


def test_later_configs_win_key_by_key() -> None:
    configs = [_config(["gpu"], memory=8, enforcement="none"),
               _config(None, cores=30, enforcement="hami-core")]
    assert share_parameters(configs, "gpu") == {"memory": 8, "cores": 30,
                                                "enforcement": "hami-core"}


def test_configs_of_other_drivers_and_other_requests_are_ignored() -> None:
    configs = [_config(["gpu"], memory=8), _config(["gpu"], driver="example.com", memory=1),
               _config(["other"], cores=5), {"requests": ["gpu"]}]
    assert share_parameters(configs, "gpu/large") == {"memory": 8}


def test_no_applicable_config_is_an_empty_document() -> None:
    assert share_parameters([], "gpu") == {}


def test_parameters_that_are_not_an_object_are_refused_naming_the_request() -> None:
    configs = [{"opaque": {"driver": names.DRIVER, "parameters": ["memory"]}}]
    with pytest.raises(ValueError, match=r"^config for request gpu: parameters must be a JSON "
                                         r"object$"):
        share_parameters(configs, "gpu")
