# Parley: the demo model works offline; real providers take their keys from the environment.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH \
    PARLEY_DATABASE_URL=sqlite+aiosqlite:////data/parley.db

WORKDIR /app

# A venv keeps the install away from the distribution's Python (PEP 668) on any base image.
COPY requirements.lock ./
RUN python -m venv /opt/venv \
    && pip install --require-hashes --no-deps -r requirements.lock

RUN useradd --system --uid 10001 --no-create-home --home-dir /app parley \
    && mkdir -p /data && chown parley /data

COPY alembic.ini ./
COPY migrations ./migrations
COPY app ./app

USER parley
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]

CMD ["sh", "-c", "alembic upgrade head && exec uvicorn app.main:app --host 0.0.0.0 --port 8000"]
