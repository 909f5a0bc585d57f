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
# Static files (admin CSS/JS, the API docs' Swagger UI bundle) are collected
# into the image and served by WhiteNoise from the web processes, under
# content-hashed names (settings: STORAGES). The settings refuse to load
# without a SECRET_KEY when DEBUG is off, so this one step gets a throwaway
# key (never used at runtime: docker-compose requires the real one), and an
# in-memory database and broker so that nothing else is written.
ENV STATIC_ROOT=/app/staticfiles
RUN SECRET_KEY=collectstatic-build-only DATABASE_URL=sqlite://:memory: CELERY_BROKER_URL=memory:// python manage.py collectstatic --noinput
RUN useradd --create-home app && mkdir -p /app/var/metrics && chown -R app /app/var
USER app
EXPOSE 8000
CMD ["gunicorn", "scheduler_project.wsgi", "--bind", "0.0.0.0:8000", "--workers", "2"]
