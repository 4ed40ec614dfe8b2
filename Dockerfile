# syntax=docker/dockerfile:1
# Multi-stage image.  Targets:
#   gateway  — slim serving runtime: ONNX Runtime, faiss, LightGBM, FastAPI; no torch (the default target)
#   trainer  — adds torch; exports the encoder, builds and publishes index versions, runs `trainer serve`
# Build arguments:
#   ACCELERATOR=cpu|gpu   gpu replaces onnxruntime and faiss-cpu by onnxruntime-gpu (with the CUDA and cuDNN
#                         wheels of its cuda,cudnn extras) and faiss-gpu-cu12 (the gpu extra of pyproject.toml;
#                         both share a module name with the CPU build, so the CPU one is uninstalled first),
#                         and installs the CUDA build of torch in the trainer; the host needs the NVIDIA
#                         driver and container toolkit (`docker run --gpus all`, compose `gpus: all`)
#   TORCH_VERSION         pinned torch (an unpinned one pulls a multi-GB build)
#   TORCH_INDEX_CPU / TORCH_INDEX_GPU   wheel indexes of the CPU and CUDA torch builds
# Build:  docker build --target gateway -t adawidth-gateway .
#         docker build --target trainer -t adawidth-trainer .
#         docker build --target gateway --build-arg ACCELERATOR=gpu -t adawidth-gateway:gpu .
# Lint:   hadolint Dockerfile   (CI: tests/integration/test_deploy_files.py, rules in .hadolint.yaml)

ARG PYTHON_VERSION=3.11

# ---------------------------------------------------------------------------------------------- base
FROM python:${PYTHON_VERSION}-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ADAWIDTH_HOME=/var/lib/adawidth HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# libgomp1: faiss and LightGBM (OpenMP); curl: health checks; gcc, libc6-dev: `pip install .` compiles the
# pruning kernel (adawidth/_levelscan.c, setup.py).  Versions follow the base image's Debian release (security
# updates included), so they are not pinned here.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 curl gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/adawidth adawidth \
 && mkdir -p /var/lib/adawidth \
 && chown adawidth /var/lib/adawidth
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY adawidth ./adawidth
COPY engine ./engine
COPY adawidth_client ./adawidth_client
COPY service ./service
COPY trainer ./trainer

# ---------------------------------------------------------------------------------------------- trainer
FROM base AS trainer
ARG ACCELERATOR=cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_CPU=https://download.pytorch.org/whl/cpu
ARG TORCH_INDEX_GPU=https://download.pytorch.org/whl/cu126
# torch first and pinned, then the project with its training extra (its torch pin is then satisfied);
# `.` is this project, whose dependencies are bounded in pyproject.toml
# hadolint ignore=DL3013
RUN if [ "${ACCELERATOR}" = "gpu" ]; then index="${TORCH_INDEX_GPU}"; else index="${TORCH_INDEX_CPU}"; fi \
 && pip install "torch==${TORCH_VERSION}" --index-url "${index}" \
 && pip install '.[train]' \
 && pip install '.[scale]' \
 && if [ "${ACCELERATOR}" = "gpu" ]; then \
      pip uninstall -y onnxruntime faiss-cpu \
      && pip install 'onnxruntime-gpu[cuda,cudnn]>=1.20' 'faiss-gpu-cu12>=1.8'; \
    fi
COPY data ./data
COPY bench ./bench
USER 10001
VOLUME ["/var/lib/adawidth"]
EXPOSE 9109
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s \
  CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:9109/metrics"]
ENTRYPOINT ["python", "-m", "trainer"]
CMD ["build", "--dataset", "data/scifact"]

# ---------------------------------------------------------------------------------------------- gateway
FROM base AS gateway
ARG ACCELERATOR=cpu
# hadolint ignore=DL3013
RUN pip install '.[milvus]' \
 && if [ "${ACCELERATOR}" = "gpu" ]; then \
      pip uninstall -y onnxruntime faiss-cpu \
      && pip install 'onnxruntime-gpu[cuda,cudnn]>=1.20' 'faiss-gpu-cu12>=1.8'; \
    fi
USER 10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s \
  CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:8000/readyz"]
ENTRYPOINT ["python", "-m", "service", "--host", "0.0.0.0", "--port", "8000"]
