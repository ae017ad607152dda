# One image for both sides of the wire:
#   the probe (outside the mesh):   ENTRYPOINT skewprobe      e.g. `run --config /etc/skewprobe/probe.yaml`
#   the reference target (inside):  command ["python", "-m", "targets.server"] --http ... --grpc ...
# The Helm charts (charts/skewprobe, charts/skewprobe-target) run it as UID 10001 with a
# read-only root filesystem; the only writable paths are the mounted store and /tmp.
#
#   docker build -t skewprobe:0.1.0 .

ARG PYTHON_IMAGE=python:3.11-slim

# --- build: install the package and its dependencies into a venv ---------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/skewprobe
WORKDIR /src
# Only what the wheel is built from (pyproject's readme is part of the metadata).
COPY pyproject.toml README.md ./
COPY probes ./probes
COPY targets ./targets
# A regular (non-editable) install: the venv holds the code, /src is left behind. pip
# byte-compiles the modules here, since the running container cannot write .pyc files.
RUN /opt/skewprobe/bin/pip install . \
 && /opt/skewprobe/bin/skewprobe validate --schema >/dev/null \
 && /opt/skewprobe/bin/python -c "import targets.server"

# --- runtime -----------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="skewprobe" \
      org.opencontainers.image.description="Caller-side canary probe for service-mesh upgrades, and its reference target" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed numeric UID/GID, so Kubernetes' runAsNonRoot can verify it without a passwd lookup.
RUN groupadd --system --gid 10001 skewprobe \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
      --home-dir /var/lib/skewprobe --shell /usr/sbin/nologin skewprobe \
 && mkdir -p /var/lib/skewprobe \
 && chown 10001:10001 /var/lib/skewprobe
COPY --from=build /opt/skewprobe /opt/skewprobe
ENV PATH=/opt/skewprobe/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /var/lib/skewprobe
USER 10001:10001
# The probe's API (/metrics, /verdict, /gate, /healthz); the target listens on 8080 and 9090.
EXPOSE 9464 8080 9090
ENTRYPOINT ["skewprobe"]
CMD ["--help"]
