# webhook-inbox: the service image. Build: docker build -t webhook-inbox .
# Runs against DATABASE_URL (see docker-compose.yml): the embedded PostgreSQL (the `embedded`
# extra) is for laptops and is not installed here; the broker sources' clients are.
#
# Your handlers: the working directory /app is importable, so a package copied or mounted at
# /app/myapp is `handlers = ["myapp.orders:on_order"]`. Either build on this image:
#     FROM webhook-inbox
#     COPY --chown=10001:10001 myapp /app/myapp
# or mount it read-only (docker-compose.yml shows the line). docs/operating.md has both.
FROM python:3.12-slim AS build

ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
# uv pinned: the build gives the same environment from uv.lock every time.
RUN pip install --no-cache-dir uv==0.13.9
WORKDIR /app
# Dependencies first, so a code change does not reinstall them.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --no-install-project --extra rabbitmq --extra nats --extra redis
COPY service ./service
COPY alembic ./alembic
COPY alembic.ini ./
# UV_COMPILE_BYTECODE compiles site-packages only; the project is installed editable, so its
# own modules are compiled here too, and no process of the image compiles them when it starts.
RUN uv sync --frozen --no-dev --extra rabbitmq --extra nats --extra redis \
    && .venv/bin/python -m compileall -q service alembic

FROM python:3.12-slim
# A fixed numeric id, so that `USER` needs no passwd lookup and mounted files can be owned by it.
RUN groupadd --system --gid 10001 inbox \
    && useradd --system --uid 10001 --gid inbox --home-dir /app inbox
WORKDIR /app
COPY --from=build --chown=inbox:inbox /app /app
ENV PATH="/app/.venv/bin:$PATH" \
    PYTHONUNBUFFERED=1 \
    INBOX_HOST=0.0.0.0 \
    INBOX_PORT=8000 \
    INBOX_DATA_DIR=/app/data \
    INBOX_CONFIG=/app/config/inbox.toml
RUN mkdir -p /app/data /app/config && chown inbox:inbox /app/data /app/config
USER 10001:10001
EXPOSE 8000
# No curl in a slim image: Python asks /healthz, on INBOX_PORT (a `-e INBOX_PORT=9000` moves
# the server, so the check follows it). The start period covers the migrations `serve` applies.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('INBOX_PORT', '8000'), timeout=2)"]
CMD ["webhook-inbox", "serve", "--host", "0.0.0.0"]
