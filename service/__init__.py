"""The gateway process: FastAPI + uvicorn serving adaptive-width search over index versions."""
