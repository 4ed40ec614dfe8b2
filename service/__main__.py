"""Run the gateway: ``python -m service`` (settings from ``ADAWIDTH_*`` env vars and flags)."""

from __future__ import annotations

import os

# one BLAS thread per request: the gateway's matrix work is a few small products per query, and a
# multi-threaded BLAS fights the encoder for cores.  Set before numpy, faiss or ONNX Runtime load.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402

import faiss  # noqa: E402
import uvicorn  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from service.app import create_app  # noqa: E402
from service.config import GatewaySettings  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Parse flags, resolve settings and serve until stopped; returns the exit code (2: invalid settings)."""
    parser = argparse.ArgumentParser(prog="service", description="adawidth search gateway")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--collection")
    parser.add_argument("--version", dest="index_version")
    parser.add_argument("--home")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in {"host": args.host, "port": args.port, "collection": args.collection,
                                   "version": args.index_version, "home": args.home}.items() if v is not None}
    try:
        settings = GatewaySettings(**overrides).resolved()
    except ValidationError as e:  # e.g. a placeholder API key outside local mode: refuse to start
        # messages only: pydantic's str(e) repeats the input, which would print the secret
        reasons = "; ".join((f"{_setting_name(err['loc'])}: " if err.get("loc") else "") + err["msg"]
                            for err in e.errors(include_input=False, include_url=False))
        print(f"service: refusing to start, invalid settings: {reasons}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    faiss.omp_set_num_threads(settings.faiss_threads)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning",
                access_log=False)
    return 0


def _setting_name(loc) -> str:
    """A validation error's location as the setting a user sets: ``ADAWIDTH_LEVEL_THREADS (level_threads)``."""
    field = str(loc[0])
    return f"ADAWIDTH_{field.upper()} ({'.'.join(str(p) for p in loc)})"


if __name__ == "__main__":
    sys.exit(main())
