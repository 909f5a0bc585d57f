.PHONY: dev test lint format reconcile

dev:            ## web + worker + beat on the embedded default (SQLite, filesystem broker)
	./scripts/dev

test:           ## the whole suite on PostgreSQL + Redis
	./scripts/test

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

format:
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

reconcile:
	.venv/bin/python manage.py reconcile_ledger
