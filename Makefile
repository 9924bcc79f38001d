# The project's gates. `make verify` is what CI runs (through .ci/run) and what to run before a commit.

CARGO ?= cargo

.PHONY: verify fmt-check clippy deny check-versions check-env-docs check-layers check-compat check-dequant check-families check-chat-templates check-samplers check-ngram-proposers test test-mlx-only check-package e2e check-webui soak check-lora check-control-vectors

verify: fmt-check clippy deny check-versions check-env-docs check-layers check-compat check-dequant check-families check-chat-templates check-samplers check-ngram-proposers test test-mlx-only check-package e2e check-webui

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

# Workspace crates depend only on lower layers (xtask/src/layers.rs, docs/architecture.md).
check-layers:
	$(CARGO) xtask check-layers

# The llama-server compatibility manifest (compat/llama-server/, docs/server.md): curated, every
# flag mlxcel-server accepts listed, every supported entry exercised by a test.
check-compat:
	$(CARGO) xtask check-compat

# GGUF dequantization bit for bit against the `gguf` package (cached, pinned venv; docs/model.md).
check-dequant:
	scripts/check-dequant

# Every model family's forward pass on both backends against mlx-lm (pinned, cached venv) on
# tiny random checkpoints (docs/model.md).
check-families:
	scripts/check-families

# LoRA adapters (GGUF and PEFT forms) against llama.cpp's own adapter loader and graph, on the
# tiny random checkpoints of check-families (docs/model.md). Not part of verify, like
# scripts/check-families-gguf, whose cached libllama build it shares.
check-lora:
	scripts/check-lora

# Control vectors (--control-vector ...) against llama.cpp's own loader and graph on the default
# model written as F32 (docs/model.md). Not part of verify, like scripts/check-rope-overrides;
# it links the reference build of scripts/bench-references --build-llama.
check-control-vectors:
	scripts/check-control-vectors

# The chat-template corpus against jinja2 with Hugging Face's settings (pinned, cached venv); the
# mlxcel-model tests hold minijinja to the same expected files (docs/model.md).
check-chat-templates:
	scripts/check-chat-templates

# The sampler chain against llama.cpp's own samplers through llama-cpp-python's bindings (the
# reference build scripts/bench-references makes; skipped without it; docs/server.md).
check-samplers:
	scripts/check-samplers

# The hashed n-gram proposers' fixture against llama.cpp's own common_speculative (the reference
# build; skipped without it; docs/cli.md#speculative-decoding).
check-ngram-proposers:
	scripts/check-ngram-proposers

test:
	$(CARGO) test --workspace --locked

# The engine as an embedder who wants only MLX builds it: no CMake, libclang or IREE
# (docs/embedding.md); the OpenXLA backend answers with an error naming its feature.
test-mlx-only:
	$(CARGO) clippy -p mlxcel-engine --all-targets --locked --no-default-features --features mlx -- -D warnings
	$(CARGO) test -p mlxcel-engine --locked --no-default-features --features mlx

# mlxcel-engine and the crates under it build and generate text from their packaged form, in a
# project outside the repository (scripts/check-package, docs/embedding.md).
check-package:
	scripts/check-package

# The official `openai` and `anthropic` Python clients (PyPI, cached venv) against `mlxcel serve`
# on loopback, then the structured-output schema corpus on the MLX backend (the OpenXLA run,
# `scripts/check-structured` with both backends, compiles its buckets for minutes: by hand).
# Skipped with MLXCEL_SKIP_MODEL_TESTS, like the other tests on the default model.
e2e:
	@if [ -n "$$MLXCEL_SKIP_MODEL_TESTS" ] && [ "$$MLXCEL_SKIP_MODEL_TESTS" != 0 ]; then \
		echo "e2e: skipped (MLXCEL_SKIP_MODEL_TESTS)"; \
	else \
		scripts/openai-client-check && CHECK_STRUCTURED_BACKENDS=mlx scripts/check-structured; \
	fi

# The chat page at `GET /` in headless Chromium (Debian's `chromium`, installed by the script with
# apt-get when run as root; otherwise it names the package to install): a streamed answer, tok/s,
# the API key, markup kept as text, the stop button cancelling the request in the server
# (docs/server.md). About 7 s after the build. Skipped with MLXCEL_SKIP_MODEL_TESTS.
check-webui:
	@if [ -n "$$MLXCEL_SKIP_MODEL_TESTS" ] && [ "$$MLXCEL_SKIP_MODEL_TESTS" != 0 ]; then \
		echo "check-webui: skipped (MLXCEL_SKIP_MODEL_TESTS)"; \
	else \
		scripts/check-webui; \
	fi

# A bounded soak with faults against `mlxcel serve` on the default model (scripts/soak,
# docs/reliability.md): 16 clients for SOAK_MINUTES mixing plain, streamed, cancelled and slowly
# read generations with malformed and oversized requests; checks every answer, /health, memory,
# file descriptors, the engine's counters and a graceful SIGTERM. Not part of `verify`.
SOAK_MINUTES ?= 10
soak:
	SOAK_MINUTES=$(SOAK_MINUTES) scripts/soak
