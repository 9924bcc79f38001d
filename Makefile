# The project's gates. `make verify` is what CI runs (through .ci/run) and what to run before a commit.

CARGO ?= cargo

.PHONY: verify fmt-check clippy deny check-versions check-env-docs test e2e

verify: fmt-check clippy deny check-versions check-env-docs test e2e

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

# The advisory database is fetched from GitHub, which these machines cannot reach; the public
# workflow (.github/workflows/ci.yml) runs the advisories check too.
deny:
	scripts/install-cargo-deny
	$(CARGO) deny --locked check licenses bans sources

check-versions:
	$(CARGO) xtask check-versions

check-env-docs:
	$(CARGO) xtask check-env-docs

test:
	$(CARGO) test --workspace --locked

# The official `openai` Python client (PyPI, cached venv) against `mlxcel serve` on loopback.
# Skipped with MLXCEL_SKIP_MODEL_TESTS, like the other tests on the default model.
e2e:
	@if [ -n "$$MLXCEL_SKIP_MODEL_TESTS" ] && [ "$$MLXCEL_SKIP_MODEL_TESTS" != 0 ]; then \
		echo "e2e: skipped (MLXCEL_SKIP_MODEL_TESTS)"; \
	else \
		scripts/openai-client-check; \
	fi
