# The rollq image compose.yaml runs as worker, dashboard and sample producer; build your agent's image FROM it
# (see docs/operations.md, "Docker and compose").
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

# Dependencies first, from pyproject.toml alone: this layer is rebuilt only when they change, not on every edit.
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['dashboard']))" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt

# Then rollq itself: the whole package is one folder.
COPY README.md ./
COPY rollq rollq
RUN pip install --no-deps ".[dashboard]"
COPY examples examples

# Rollouts run user agents: no reason for them to run as root.
RUN useradd --create-home --uid 10001 rollq
USER rollq

# Healthy while this container reaches its Redis (ROLLQ_REDIS_URL) within the 5 s connect timeout.
HEALTHCHECK --interval=30s --timeout=15s --start-period=20s --retries=3 \
  CMD rollq status --json > /dev/null || exit 1

CMD ["rollq", "--help"]
