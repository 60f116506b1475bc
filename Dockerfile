# Parley: `docker run --rm -p 8000:8000 -e PARLEY_API_KEYS=alice:<key> -v parley-data:/data parley` serves
# the offline demo model to bearer keys. The image binds 0.0.0.0, so it refuses to start without keys unless
# PARLEY_ALLOW_OPEN=1 says to serve openly (a local try-out). Configuration is PARLEY_* environment
# variables (docs/configuration.md); real providers take their keys the same way.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH \
    PARLEY_DATABASE_URL=sqlite+aiosqlite:////data/parley.db

WORKDIR /app

# A venv keeps the install away from the distribution's Python (PEP 668) on any base image; the lock
# pins every package with its hashes, so the image gets exactly what the tests ran.
COPY requirements.lock ./
RUN python -m venv /opt/venv \
    && pip install --require-hashes --no-deps -r requirements.lock

RUN useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin parley \
    && mkdir /data && chown 10001:10001 /data

COPY alembic.ini ./
COPY migrations ./migrations
# app/ui/ holds the built page (/ui) and Swagger UI's assets (/docs), committed: the image needs no Node.
COPY app ./app
# Bytecode once, here: PYTHONDONTWRITEBYTECODE (and user 10001, who cannot write /app) keeps every start
# from writing it, so without this each start compiled app/ and the migrations from source again (~0.1 s
# of CPU before /healthz answered, measured).
RUN python -m compileall -q app migrations

USER 10001:10001
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]

# The launcher is PID 1: it checks the configuration, migrates the database to the latest schema (a no-op
# when it is current; PARLEY_MIGRATE=0 only checks), then runs uvicorn.
CMD ["python", "-m", "app", "--host", "0.0.0.0", "--port", "8000"]
