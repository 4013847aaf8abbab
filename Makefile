# labkernels — the course's commands. `make lab` to learn, `make test` for CI. See README.md.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
# Extra pip arguments for torch alone, e.g. PyTorch's CPU-only wheel index (see README). Given once .venv
# exists and different from what it was built with, .venv is rebuilt (pip keeps an installed torch otherwise).
TORCH_PIP_ARGS ?=
PORT ?= 8888
DIR ?= submissions
# make grade: e.g. GRADE_ARGS="-j 2 --export nbgrader --out grades" (see README's instructor guide).
GRADE_ARGS ?=
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
# nbval compares figures' text: plt.show() must leave one, whatever MPLBACKEND the caller's shell has (Agg leaves none).
INLINE := MPLBACKEND=module://matplotlib_inline.backend_inline
# ninja from the venv must be on PATH for cpp_extension builds; the extension cache stays in the project.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.torch_extensions
# Notebooks draw with the inline backend (a figure's text is '<Figure size ...>' in both lanes).
export MPLBACKEND ?= module://matplotlib_inline.backend_inline
# The venv is installed without bytecode (--no-compile): each module's is written the first time a process
# imports it, and every later process reads it. An environment that sets PYTHONDONTWRITEBYTECODE (some images
# do) would make every process compile torch again: `import labkernels` took 7.9 s instead of 3.5 s, in every
# test worker, notebook kernel and grading run.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: lab lab-settings test-browser venv test test-gpu test-gpu-unit test-gpu-notebooks gpu-present bench outputs exercises grade release lint clean test-newest

# The lane this machine's venv is for, and the torch it gets: each lane installs the torch and triton its own
# tests ran on (README, "Versions"). cpu: CI's `make test`. gpu: the H200's `make test-gpu` and every GPU
# figure. The default is gpu where an NVIDIA driver answers `nvidia-smi -L`, cpu elsewhere; LANE=cpu or
# LANE=gpu says it. The pins are pyproject.toml's cpu-lane and gpu-lane extras; torch's is read from there, since
# it is installed first and alone (TORCH_PIP_ARGS applies to it only).
LANE ?= $(if $(shell nvidia-smi -L 2>/dev/null),gpu,cpu)
ifeq ($(filter cpu gpu,$(LANE)),)
$(error LANE is "$(LANE)": it must be cpu or gpu)
endif
TORCH_PIN := $(shell sed -n 's/^$(LANE)-lane = \["\(torch==[^"]*\)".*/\1/p' pyproject.toml)
# A venv built for the other lane is rebuilt (pip would keep its torch). A venv without the file was built
# before lanes were told apart, with the cpu pins.
LANE_FILE := $(VENV)/.lane
LANE_CHANGED :=
ifneq ($(wildcard $(VENV)/.installed),)
BUILT_LANE := $(or $(strip $(file < $(LANE_FILE))),cpu)
ifneq ($(LANE),$(BUILT_LANE))
LANE_CHANGED := lane-changed
.PHONY: lane-changed
lane-changed:
	@echo "LANE=$(LANE) differs from the lane .venv was built for ($(BUILT_LANE)): rebuilding .venv"
	rm -rf $(VENV)
endif
endif

# The TORCH_PIP_ARGS .venv was built with. A different non-empty value makes the venv out of date (below), and
# its recipe starts from an empty venv; an empty value keeps the torch that is installed.
TORCH_ARGS_FILE := $(VENV)/.torch-pip-args
TORCH_ARGS_CHANGED :=
ifneq ($(strip $(TORCH_PIP_ARGS)),)
ifneq ($(wildcard $(VENV)/.installed),)
ifneq ($(strip $(TORCH_PIP_ARGS)),$(strip $(file < $(TORCH_ARGS_FILE))))
TORCH_ARGS_CHANGED := torch-pip-args-changed
.PHONY: torch-pip-args-changed
torch-pip-args-changed:
	@echo "TORCH_PIP_ARGS=\"$(TORCH_PIP_ARGS)\" differs from what .venv was built with (\"$(file < $(TORCH_ARGS_FILE))\"): rebuilding .venv"
	rm -rf $(VENV)
endif
endif
endif

$(VENV)/.installed: pyproject.toml $(TORCH_ARGS_CHANGED) $(LANE_CHANGED)
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	@# --no-compile: no bytecode for every module up front (20 s for torch alone on 2 cores); Python writes it
	@# for the modules a process imports, the first time it imports them.
	$(VPY) -m pip install -q --no-compile $(TORCH_PIP_ARGS) "$(TORCH_PIN)"
	$(VPY) -m pip install -q --no-compile -e ".[course,$(LANE)-lane]"
	@# jupyter-events pulls in rfc3987-syntax (jsonschema[format-nongpl]); when it is installed, jsonschema
	@# builds its IRI grammars on import, 3.5 s of every process that reads a notebook (nbformat imports
	@# jsonschema): each grading run, each nbval worker. Nothing in the course validates IRIs.
	$(VPY) -m pip uninstall -y -q rfc3987-syntax
	@printf '%s' "$(strip $(TORCH_PIP_ARGS))" > $(TORCH_ARGS_FILE)
	@printf '%s' "$(LANE)" > $(LANE_FILE)
	touch $@
	@# The venv as installed is grading's known-good state: a file a submission adds or rewrites in it later
	@# refuses grading (labkernels.grading.classroom.VenvManifest), not just after a first grading recorded it.
	$(VPY) -m labkernels grade --record-manifest

venv: $(VENV)/.installed

# The file browser hides JupyterLab's defaults and the install's metadata (labkernels.egg-info).
HIDE_GLOBS := ["__pycache__", "*.pyc", "*.pyo", ".DS_Store", "*~", "*.egg-info"]
# A taken PORT (another Jupyter?) is not silently replaced by Jupyter's next one: the URL printed is the one
# served (port_retries=0), a free port chosen here, and the notebooks are trusted (signed for this user: they
# open with their stored widgets and figures, as committed).
lab: lab-settings
	@token=$$($(VPY) -c 'import secrets; print(secrets.token_hex(16))'); \
	port=$$($(VPY) -c 'import socket, sys; s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); print(sys.argv[1])' $(PORT) 2>/dev/null) || { \
	  port=$$($(VPY) -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'); \
	  echo "Port $(PORT) is in use (another server?): serving on $$port instead (PORT=... picks another)"; }; \
	$(VENV)/bin/jupyter trust notebooks/*.ipynb notebooks/appendix/*.ipynb exercises/*.ipynb solutions/*.ipynb > /dev/null; \
	echo "Serving the course at http://127.0.0.1:$$port/lab/tree/README.md?token=$$token  (Ctrl-C stops it)"; \
	$(VENV)/bin/jupyter lab --no-browser --ip=127.0.0.1 \
	  --port=$$port --ServerApp.port_retries=0 --IdentityProvider.token=$$token --ServerApp.root_dir=$(CURDIR) \
	  --LabApp.default_url=/lab/tree/README.md --LabApp.news_url=None \
	  '--ContentsManager.hide_globs=$(HIDE_GLOBS)' \
	  --LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate \
	  $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

# Test processes at once (pytest-xdist). CI has 2 cores; each notebook stays in one process (--dist loadfile),
# its cells in order.
TEST_WORKERS ?= 2

# CPU lane: unit tests, nbval (strict) over the chapters and solutions, grading, exercises in sync.
test: venv
	MPLBACKEND=Agg $(VPY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) tests
	@# nbval, and the grading of the solutions (full marks expected) and the exercises (zero), run at the same
	@# time: each is one process per notebook at a time, and the cores one of them leaves idle (nbval's last
	@# notebooks, the graders' waits) the others fill. The two gradings write their own logs, shown at the end;
	@# any of the three failing fails the target.
	@echo "nbval over notebooks/ and solutions/; grading solutions (--expect full) and exercises (--expect zero) alongside"
	@$(VPY) -m labkernels grade solutions --expect full --json .grade-solutions.json --cell-timeout 600 \
	  > .grade-solutions.log 2>&1 & solutions=$$!; \
	$(VPY) -m labkernels grade exercises --expect zero --json .grade-exercises.json --cell-timeout 600 \
	  > .grade-exercises.log 2>&1 & exercises=$$!; \
	$(INLINE) $(VPY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile $(NBVAL) notebooks solutions; \
	nbval=$$?; \
	wait $$solutions; solutions=$$?; wait $$exercises; exercises=$$?; \
	cat .grade-solutions.log .grade-exercises.log; \
	echo "nbval: exit $$nbval; grade solutions: exit $$solutions; grade exercises: exit $$exercises"; \
	[ $$nbval = 0 ] && [ $$solutions = 0 ] && [ $$exercises = 0 ]
	$(VPY) -m labkernels exercises --check

# GPU lane, in the *current* Python environment (an instructor's GPU runner or a GPU image): no venv, no torch.
# The two halves run separately too (e.g. on two GPUs: CUDA_VISIBLE_DEVICES=1 make test-gpu-notebooks);
# NOTEBOOKS picks which notebooks nbval checks.
NOTEBOOKS ?= notebooks solutions
test-gpu: test-gpu-unit test-gpu-notebooks

gpu-present:
	@$(PYTHON) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu needs a CUDA device')"

test-gpu-unit: gpu-present
	MPLBACKEND=Agg $(PYTHON) -m pytest -q -p no:cacheprovider tests

test-gpu-notebooks: gpu-present
	$(INLINE) $(PYTHON) -m pytest -q -p no:cacheprovider $(NBVAL) $(NOTEBOOKS)

bench:
	$(PYTHON) -m labkernels bench

# Re-execute the chapters and solutions in place, in the current environment, to store this lane's outputs
# (the committed outputs come from the CPU lane, the H200's figures from the reference CSVs they read; on a GPU
# this stores that GPU's outputs instead, which nbval checks in both lanes alike). Then `make exercises`.
outputs:
	$(INLINE) $(PYTHON) -m labkernels execute notebooks/*.ipynb solutions/*.ipynb

exercises: venv
	$(VPY) -m labkernels exercises

grade: venv
	$(VPY) -m labkernels grade $(DIR) $(GRADE_ARGS)

# The bundle a class gets (dist/labkernels-student-<revision>.tar.gz): chapters, exercises, package, no solutions.
release: venv
	$(VPY) -m labkernels release --out dist

lint: venv
	$(VENV)/bin/ruff check labkernels tests notebooks solutions

# The CPU lane on the newest torch and triton releases (and the newest of every other package the course
# uses), in a venv of its own, for an instructor's scheduled CI (e.g. weekly): a release that breaks the course
# is seen the week it ships. Not in `make test` (the course's pins) nor `.ci/run`: it downloads torch afresh
# (~2 GB with CUDA; TORCH_PIP_ARGS as for `make lab`) and takes as long as `make test`'s unit tests and nbval.
NEWEST_VENV := .venv-newest
test-newest:
	rm -rf $(NEWEST_VENV)
	$(PYTHON) -m venv $(NEWEST_VENV)
	$(NEWEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(NEWEST_VENV)/bin/python -m pip install -q --no-compile --upgrade $(TORCH_PIP_ARGS) torch
	$(NEWEST_VENV)/bin/python -m pip install -q --no-compile --upgrade --upgrade-strategy eager -e . triton \
	  numpy ninja jupyterlab ipywidgets matplotlib nbval nbclient nbformat ipykernel pytest pytest-timeout \
	  pytest-xdist tqdm filelock
	$(NEWEST_VENV)/bin/python -c "import torch, triton; print('newest: torch', torch.__version__, '/ triton', triton.__version__)"
	PATH=$(CURDIR)/$(NEWEST_VENV)/bin:$$PATH TORCH_EXTENSIONS_DIR=$(CURDIR)/.torch_extensions-newest MPLBACKEND=Agg \
	  $(NEWEST_VENV)/bin/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) tests
	PATH=$(CURDIR)/$(NEWEST_VENV)/bin:$$PATH TORCH_EXTENSIONS_DIR=$(CURDIR)/.torch_extensions-newest $(INLINE) \
	  $(NEWEST_VENV)/bin/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile $(NBVAL) notebooks solutions

clean:
	rm -rf .torch_extensions .torch_extensions-newest .grade-*.json .grade-*.log grade-report.json results

# --- JupyterLab settings and the real-browser test ------------------------------------------------------
# The course's JupyterLab defaults (no news popup; Markdown opens rendered), read by a lab started from the venv.
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.d/labkernels.json
lab-settings: venv
	@mkdir -p $(dir $(LAB_OVERRIDES))
	cp labkernels/jupyter/overrides.json $(LAB_OVERRIDES)

# JupyterLab in Debian's Chromium (apt-get install chromium; no browser download), driven by Playwright.
# Screenshots: tests/browser/screenshots/. CHROMIUM=/path/to/chromium picks another build of Chromium.
PLAYWRIGHT_VERSION ?= 1.65.2
test-browser: lab-settings
	@test -x "$${CHROMIUM:-/usr/bin/chromium}" || { echo "make test-browser needs Chromium: apt-get install chromium" >&2; exit 1; }
	@# Installing Playwright changes the venv: its known-good record for grading is taken again (by you, now).
	@$(VPY) -c "import playwright" 2>/dev/null || { $(VPY) -m pip install -q "playwright==$(PLAYWRIGHT_VERSION)" \
	  && $(VPY) -m labkernels grade --record-manifest; }
	LABKERNELS_BROWSER=1 $(VPY) -m pytest -q -p no:cacheprovider -s tests/browser
