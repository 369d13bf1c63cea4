"""Package discovery, the one part of the build pyproject.toml cannot say: the production
build (the image's: `DRA_GATEWAY_PRODUCTION=1 pip wheel .`) leaves the development kit
(`dra_gateway.devkit`: the simulator, the demo, the benches, the real control plane and node)
out, while every other install, editable or not, keeps it for `dra-gateway demo` and the tests.
The components live in the top-level folders; src/dra_gateway links them into one import
namespace, so nothing generic such as `webhook` lands in site-packages."""

import os

from setuptools import find_namespace_packages, setup

DEVKIT = ["dra_gateway.devkit", "dra_gateway.devkit.*"]
production = os.environ.get("DRA_GATEWAY_PRODUCTION") == "1"

setup(packages=find_namespace_packages("src", exclude=DEVKIT if production else []),
      package_dir={"": "src"})
