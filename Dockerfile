# syntax=docker/dockerfile:1
# Multi-stage image.  Targets:
#   trainer  — torch (CPU build), exports the encoder and builds index versions
#   gateway  — slim serving runtime: ONNX Runtime, faiss, LightGBM; no torch
# Build:  docker build --target gateway -t adawidth-gateway .
#         docker build --target trainer -t adawidth-trainer .

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ADAWIDTH_HOME=/var/lib/adawidth
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 curl && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY adawidth ./adawidth
COPY service ./service
COPY trainer ./trainer

FROM base AS trainer
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && pip install '.[train]'
COPY data ./data
COPY bench ./bench
VOLUME ["/var/lib/adawidth"]
ENTRYPOINT ["python", "-m", "trainer"]
CMD ["build", "--dataset", "data/scifact"]

FROM base AS gateway
RUN pip install .
RUN useradd --system --uid 10001 adawidth
USER adawidth
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s CMD curl -fsS http://127.0.0.1:8000/readyz || exit 1
ENTRYPOINT ["python", "-m", "service", "--host", "0.0.0.0", "--port", "8000"]
