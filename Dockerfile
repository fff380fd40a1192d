# crowdtally: one image for both processes of the service (see docs/deploy.md).
#   api:    crowdtally serve --host 0.0.0.0 --port 8000 --no-engine   (the default command)
#   engine: crowdtally engine
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NUMBA_CACHE_DIR=/var/cache/crowdtally/numba

WORKDIR /srv/crowdtally

# The runtime dependencies first, read from pyproject.toml, in a layer of their own: a code
# change does not reinstall numpy, numba and the web stack.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# Editable install: app/store/sql.py finds alembic.ini and migrations/ beside app/ (the service
# runs "alembic upgrade head" on start), and a wheel install would not carry them.
COPY alembic.ini ./
COPY migrations ./migrations
COPY core ./core
COPY app ./app
RUN pip install --no-deps -e . \
    && useradd --system --uid 10001 --no-create-home --home-dir /srv/crowdtally crowdtally \
    && mkdir -p "$NUMBA_CACHE_DIR" && chown crowdtally "$NUMBA_CACHE_DIR"

USER crowdtally

# Compile the numba kernels once, into the image (else every container's first start compiles
# them, ~20 s of CPU, in the api's and the engine's containers alike): every kernel the service
# calls (the warm-up of its first start, done whole), then online and batch EM of `extract` on
# a four-answer file; then check that the service and the PostgreSQL driver import (a
# dependency missing from pyproject.toml fails the build, not the first start).
# tests/test_compose.py runs these lines too.
RUN python -c "from app.serving import warmup; warmup.everything()" \
    && printf 'item,worker,label\na,w1,0\na,w2,1\nb,w1,1\nb,w2,1\n' > /tmp/warm.csv \
    && crowdtally extract /tmp/warm.csv > /dev/null \
    && crowdtally extract /tmp/warm.csv --batch > /dev/null \
    && python -c "import app.api, app.engine.runtime, psycopg" \
    && rm /tmp/warm.csv

EXPOSE 8000
CMD ["crowdtally", "serve", "--host", "0.0.0.0", "--port", "8000", "--no-engine"]
