# One image for web, worker and beat (docker-compose.yml picks the command).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY scheduler_project ./scheduler_project
COPY ledger ./ledger
COPY payments ./payments
RUN pip install --no-cache-dir .
COPY . .
RUN useradd --create-home app && mkdir -p /app/var && chown app /app/var
USER app
EXPOSE 8000
CMD ["gunicorn", "scheduler_project.wsgi", "--bind", "0.0.0.0:8000", "--workers", "2"]
