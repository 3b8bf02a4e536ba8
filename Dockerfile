# The worker image the Helm chart runs (`foldline projector`, `foldline dispatcher`):
#   docker build -t foldline:$(python -c 'import tomllib;print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])') .
# One process per container; configuration comes from the environment (see helm/foldline/values.yaml).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md hatch_build.py ./
COPY services ./services
COPY schemas ./schemas
# the workers' image: every server backend, both projector runtimes and OpenTelemetry tracing (OTEL_* switches it on)
RUN pip install --no-cache-dir --prefix=/install '.[distributed,faust,otel]'

FROM python:3.11-slim
COPY --from=build /install /usr/local
RUN useradd --uid 10001 --no-create-home foldline
USER 10001
ENTRYPOINT ["foldline"]
