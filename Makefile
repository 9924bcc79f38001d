# The project's gates. `make verify` is what CI runs (through .ci/run) and what to run before a commit.

CARGO ?= cargo

.PHONY: verify fmt-check clippy deny check-versions check-env-docs test

verify: fmt-check clippy deny check-versions check-env-docs test

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
