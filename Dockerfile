# The image the Helm chart runs: `dra-gateway` with every component (webhook, allocator,
# node plugin). Build from the repository root:
#   docker build -t dra-gateway:0.1.0 .

# Stage 1: a wheelhouse of the project and its dependencies, so the runtime stage installs
# offline and carries no build leftovers. DRA_GATEWAY_PRODUCTION=1 leaves the development kit
# (simulator, demo, benchmarks) out of the project's wheel (setup.py). The dependencies are the versions CI tested
# (constraints.txt, the pins of the README's commands; tests/test_image.py keeps it so).
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY . .
RUN DRA_GATEWAY_PRODUCTION=1 pip wheel --constraint constraints.txt --wheel-dir /wheels . \
    && cp constraints.txt /wheels/

# Stage 2: the runtime.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels --constraint /wheels/constraints.txt \
       dra-gateway \
    && groupadd --system --gid 65532 dra-gateway \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin dra-gateway
# Numeric, so that runAsNonRoot can verify it without resolving a name. The node plugin's pod
# overrides it with root: it writes into the kubelet's directories.
USER 65532:65532
ENTRYPOINT ["dra-gateway"]
CMD ["--help"]
