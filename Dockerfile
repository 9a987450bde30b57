# The rollq image compose.yaml runs as worker, dashboard and sample producer.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

COPY pyproject.toml README.md ./
# rollq/ holds links to the layer folders beside it; pip follows them when it builds the wheel.
COPY rollq rollq
COPY models models
COPY store store
COPY producer producer
COPY worker worker
COPY ops ops
RUN pip install ".[dashboard]"
COPY examples examples

# Rollouts run user agents: no reason for them to run as root.
RUN useradd --create-home --uid 10001 rollq
USER rollq

CMD ["rollq", "--help"]
