"""The worker: claims accepted messages and runs their handlers or forwards them."""

from service.worker.runtime import run_worker
from service.worker.worker import Worker, WorkerCrashed, WorkerOptions

__all__ = ["Worker", "WorkerCrashed", "WorkerOptions", "run_worker"]
