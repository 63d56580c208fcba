FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY lanes ./lanes
COPY workers ./workers
COPY scheduler ./scheduler
COPY migrations ./migrations
COPY examples ./examples
COPY deploy/catalog.toml ./deploy/catalog.toml
RUN pip install --no-cache-dir .
RUN useradd --system lanes && mkdir -p /var/lib/lanes && chown lanes /var/lib/lanes
USER lanes
CMD ["lanes", "--help"]
