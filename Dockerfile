# webhook-inbox: the service image. Build: docker build -t webhook-inbox .
# Runs against DATABASE_URL (see docker-compose.yml); the embedded PostgreSQL is for laptops.
FROM python:3.12-slim AS build

ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
RUN pip install --no-cache-dir uv
WORKDIR /app
# Dependencies first, so a code change does not reinstall them.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --no-install-project
COPY service ./service
COPY alembic ./alembic
COPY alembic.ini ./
RUN uv sync --frozen --no-dev

FROM python:3.12-slim
RUN groupadd --system inbox && useradd --system --gid inbox --home-dir /app inbox
WORKDIR /app
COPY --from=build --chown=inbox:inbox /app /app
ENV PATH="/app/.venv/bin:$PATH" \
    PYTHONUNBUFFERED=1 \
    INBOX_HOST=0.0.0.0 \
    INBOX_PORT=8000 \
    INBOX_DATA_DIR=/app/data \
    INBOX_CONFIG=/app/config/inbox.toml
RUN mkdir -p /app/data /app/config && chown inbox:inbox /app/data /app/config
USER inbox
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
CMD ["webhook-inbox", "serve", "--host", "0.0.0.0"]
