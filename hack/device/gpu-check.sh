#!/usr/bin/env bash
# The remote GPU's CuPy and PyTorch backends on a real GPU (issue 31, item 5). From the
# repository root:
#
#   hack/device/gpu-check.sh [--wheelhouse DIR] [--backends cupy,torch] [-- GPU_CHECK_ARGS]
#   hack/device/gpu-check.sh --requirements     # what a wheelhouse must hold
#
# Refuses at once, before installing anything, on a machine without an NVIDIA GPU
# (nvidia-smi missing or listing none): a JSON line with "ok": false and exit 77.
# Otherwise it makes a virtual environment (.venv-gpu, seeing the packages of $PYTHON, by
# default python3, so a CuPy or PyTorch already installed counts), installs the project's dependencies and
# the GPU extras of pyproject.toml for the backends asked for (`gpu`: CuPy, `gpu-torch`:
# PyTorch; an extra whose library already imports is not installed again), then runs hack/device/gpu_check.py:
# a donor with --backend cupy, then torch, the matmul workload and the figures against
# it; its last line is JSON (products correct, GPU vs numpy speedup at 4096², host to
# device bytes/s). Exit 0: every backend ran with correct products; 1: one did not;
# 2: bad usage; 77: no GPU.
#
# Without network (the device machine has none), install from a wheelhouse: prepare it
# where pip reaches PyPI, for the target's Python and platform, e.g.
#   hack/device/gpu-check.sh --requirements > /tmp/gpu-reqs.txt
#   python3 -m pip download --only-binary=:all: --python-version 3.12 \
#     --platform manylinux2014_x86_64 -d wheelhouse -r /tmp/gpu-reqs.txt
# and pass --wheelhouse wheelhouse (pip then installs with --no-index from it alone).
# Leave the GPU libraries out of it (`--requirements --no-gpu-extras`) where the
# target has them already: their wheels are hundreds of MB.
set -euo pipefail

NO_GPU=77
USAGE=2
cd "$(dirname "$0")/../.."

python=${PYTHON:-python3}
wheelhouse=""
backends="cupy,torch"
print_requirements=false
gpu_extras=true
venv=${GPU_CHECK_VENV:-.venv-gpu}
passed=()  # after --: for gpu_check.py (--size, --reps)

usage() {
  echo "usage: $0 [--wheelhouse DIR] [--backends cupy,torch] | --requirements [--no-gpu-extras]" >&2
  exit "$USAGE"
}

while (($#)); do
  case $1 in
    --wheelhouse) [[ $# -ge 2 ]] || usage; wheelhouse=$2; shift 2 ;;
    --backends) [[ $# -ge 2 ]] || usage; backends=$2; shift 2 ;;
    --requirements) print_requirements=true; shift ;;
    --no-gpu-extras) gpu_extras=false; shift ;;
    --) shift; passed=("$@"); break ;;
    *) usage ;;
  esac
done

# The project's dependencies and extras, read from pyproject.toml (Python >= 3.11).
requirements() {
  "$python" - "$@" <<'PY'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
for req in project["dependencies"] + [r for e in sys.argv[1:] for r in project["optional-dependencies"][e]]:
    print(req)
PY
}

if $print_requirements; then
  extras=(remote)
  $gpu_extras && extras+=(gpu gpu-torch)
  requirements "${extras[@]}"
  exit 0
fi

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo '{"ok": false, "error": "no NVIDIA GPU here: nvidia-smi is missing or lists no GPU"}'
  echo "gpu-check: no NVIDIA GPU on this machine (nvidia-smi missing or lists none); run it where one is" >&2
  exit "$NO_GPU"
fi
if [[ -n $wheelhouse && ! -d $wheelhouse ]]; then
  echo "gpu-check: wheelhouse $wheelhouse is not a directory" >&2
  exit "$USAGE"
fi

# Ubuntu's python3 has no ensurepip without python3-venv (the GPU image's may not): the
# environment is then made without pip, and the pip of $python's packages (the .pth
# below) installs into it.
venv_args=(--system-site-packages)
"$python" -c 'import ensurepip' 2>/dev/null || venv_args+=(--without-pip)
"$python" -m venv "${venv_args[@]}" "$venv"
# Where $python is itself a virtual environment's (the GPU image's python3 is), the new
# one sees only its base's packages: a .pth adds $python's own, after the new ones.
purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
"$python" -c "$purelib" > "$("$venv/bin/python" -c "$purelib")/gpu-check-outer.pth"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
[[ -n $wheelhouse ]] && pip+=(--no-index --find-links "$wheelhouse")
# A backend's extra, for the backends asked for, unless its library imports already.
extras=(remote)
for b in ${backends//,/ }; do
  case $b in
    cupy) "$venv/bin/python" -c 'import cupy' 2>/dev/null || extras+=(gpu) ;;
    torch) "$venv/bin/python" -c 'import torch' 2>/dev/null || extras+=(gpu-torch) ;;
  esac
done
requirements "${extras[@]}" > "$venv/gpu-check-requirements.txt"
"${pip[@]}" -r "$venv/gpu-check-requirements.txt" >&2
PYTHONPATH=$PWD exec "$venv/bin/python" hack/device/gpu_check.py --backends "$backends" "${passed[@]}"
