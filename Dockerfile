# syntax=docker/dockerfile:1
# kvroute's image: `kvroute router`, `kvroute render` and `kvroute sim-engine` (the ENTRYPOINT
# is `kvroute`; the chart's container args start with the subcommand). Build from the repo root:
#   docker build -t kvroute:0.1.0 .
# It runs as a non-root user with a read-only root filesystem: what kvroute writes goes to /tmp,
# /var/lib/kvroute (the router's state directory) and /var/cache/kvroute (Hugging Face cache),
# which the chart mounts as emptyDir volumes. Models: without --model the embedded Qwen3
# tokenizer serves; otherwise mount a model directory (the chart's model.volume, at /models) or
# give a Hugging Face id (tokenizer and config files only, fetched into the cache).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# What setuptools builds from: pyproject.toml, its readme, and every package it lists
# (tests/test_image.py checks this list against pyproject.toml).
COPY pyproject.toml README.md ./
COPY scripts/install.sh scripts/
COPY wire wire
COPY render render
COPY serving serving
COPY output output
COPY radix radix
COPY router router
COPY sim sim
COPY discovery discovery
COPY devtools devtools
COPY kvroute kvroute
# The project's own install step, as ./dev runs it, without -e and without the test extra.
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN bash scripts/install.sh /opt/kvroute .

FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 kvroute \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
        --shell /usr/sbin/nologin kvroute \
    && mkdir -p /var/lib/kvroute /var/cache/kvroute \
    && chown 10001:10001 /var/lib/kvroute /var/cache/kvroute
# The virtualenv's interpreter links to the base image's, the same path in both stages.
COPY --from=build /opt/kvroute /opt/kvroute
ENV PATH=/opt/kvroute/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TOKENIZERS_PARALLELISM=false \
    HOME=/tmp \
    XDG_STATE_HOME=/var/lib \
    HF_HOME=/var/cache/kvroute/huggingface
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000 8100
ENTRYPOINT ["kvroute"]
CMD ["--help"]
