# edge-core workspace. Two entry points, both usable on a fresh machine with only
# Python >= 3.11 and pip:
#   make demo   set up .venv if needed, then run the main job
#   make test   set up .venv if needed, then lint, type-check and run the whole suite

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# plugins/backends/* (backends), plugins/libraries/* (code backends share), plugins/apps/*
# (applications that add commands): every directory with a pyproject.toml is a distribution.
PLUGINS := $(sort $(patsubst %/pyproject.toml,%,$(wildcard plugins/*/*/pyproject.toml)))
DISTS := contracts core $(PLUGINS) tests/edge_echo examples/ocr[reference,bench]
STAMP := $(VENV)/.edge-installed
INPUTS := requirements-dev.txt $(foreach d,contracts core $(PLUGINS) tests/edge_echo examples/ocr,$(d)/pyproject.toml)

.PHONY: demo test lint typecheck pytest bench bench-ocr clean chromium fonts

$(STAMP): $(INPUTS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet $(foreach d,$(DISTS),-e '$(d)')
	@touch $@

# The main job: build the PP-OCRv4 page pipeline's bundles (shape sets with examples and
# expected outputs per entry) from the rapidocr-onnxruntime wheel, draw the demo page (13
# lines: a long one, a rotated one, an upside-down one), and read it with the three-stage
# detect -> classify -> recognise pipeline on the ort-cpu backend through edge-core.
# Then derive a static 4-row copy of the classifier (edge derive qnn-static) and read
# the page again with pipeline-auto.toml, whose classifier lists qnn (the HTP simulator
# here, its load and gate bounded) before ort-cpu: both pass, the faster on the page
# serves (measured, or the stored measurement reused); auto_report prints the figures.
OCR := build/ocr

demo: $(STAMP) fonts
	$(BIN)/edge --version
	$(BIN)/edge plugins
	$(BIN)/python -m edge_ocr_example.page_bundle $(OCR)
	$(BIN)/edge run $(OCR)/pipeline.toml --input $(OCR)/page.png --repeat 10 \
	  --profile $(OCR)/profile.json
	$(BIN)/edge derive qnn-static $(OCR)/classify --bucket 4x3x48x192 --out $(OCR)/classify-qnn
	$(BIN)/edge run $(OCR)/pipeline-auto.toml --input $(OCR)/page.png --json \
	  > $(OCR)/auto-run.json
	$(BIN)/python -m edge_ocr_example.auto_report $(OCR)/auto-run.json

# Layers: no import circles (deferred and TYPE_CHECKING imports count), no private names
# across modules, no mixins (tools/check_layers.py; --report lists each module's concept).
LAYERED := contracts core plugins tests/edge_echo examples

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python tools/check_layers.py $(LAYERED)

typecheck: $(STAMP)
	$(BIN)/mypy contracts/src core/src $(foreach p,$(PLUGINS),$(p)/src) tests/edge_echo/src \
	  examples/ocr/src

# The evidence report's HTML is checked in headless Chromium (Debian's package).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update -qq && \
	    $(SUDO) apt-get install -y -qq --no-install-recommends chromium; }

# Generated OCR pages (tests, demo, benchmarks/ocr_accuracy.py) are drawn with the DejaVu
# fonts of Debian's fonts-dejavu-core, installed the same way.
fonts:
	@dpkg -s fonts-dejavu-core >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update -qq && \
	    $(SUDO) apt-get install -y -qq --no-install-recommends fonts-dejavu-core; }

# The suite runs in one more pytest-xdist worker than the machine has cores, at most 4:
# its tests wait on worker processes, servers and engines much of the time (on 2 cores
# the whole run used about 1.3 of them with 2 workers; 3 finished sooner). Each test
# module is one group that one worker runs whole, so module fixtures are built once
# (conftest.py); session fixtures that build files build them once per run under a file
# lock. The slowest tests are listed at the end. Serially: make test PYTEST_ARGS=; one
# part: PYTEST_ARGS="core/tests".
PYTEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); n=$$((n + 1)); [ $$n -gt 4 ] && n=4; echo $$n)
PYTEST_ARGS ?= -n $(PYTEST_WORKERS) --dist loadgroup --durations=25

# pytest exits 5 when it collects no test; that is a failure here, and says so.
pytest: $(STAMP) chromium fonts
	@$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5)" >&2; fi; \
	  exit $$rc

test: lint typecheck pytest

# Start-up in fresh processes against RapidOCR and import onnxruntime (benchmarks/startup.py;
# it reads make demo's build/ocr, so run make demo first).
bench: $(STAMP)
	$(BIN)/python benchmarks/startup.py

# OCR accuracy on 40 generated pages against RapidOCR's own pipeline (slow: minutes).
bench-ocr: $(STAMP) fonts
	$(BIN)/python benchmarks/ocr_accuracy.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
