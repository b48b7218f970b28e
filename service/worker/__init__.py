"""The worker: claims accepted messages and runs their handlers or forwards them.

Import from the modules (`service.worker.runtime`, `service.worker.worker`): this package
imports none of them, so the HTTP process, which needs only `retention`, does not load the
worker, its HTTP client and the processing code at start.
"""
