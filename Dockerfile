# The image the Kubernetes manifests in deploy/kubernetes run: docker build -t pareto-slo:0.1.0 .
FROM python:3.11-slim
WORKDIR /app
# torch from PyPI: the CUDA build on x86-64 Linux, so the same image times on the node's GPU
RUN pip install --no-cache-dir "torch>=2.4"
COPY . /app
RUN pip install --no-cache-dir "/app[postgres]"
ENV PARETO_CACHE_DIR=/tmp/pareto-cache
ENTRYPOINT []
