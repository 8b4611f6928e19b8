#!/usr/bin/env bash
# Builds Horovod 0.28.1 with its PyTorch extension (and Gloo) into the Python
# environment of $PYTHON (default: the `python` on PATH, e.g. an active venv).
#
# Horovod 0.28.1 is its last release and does not build as shipped against
# torch >= 2.1: its CMake hard-codes C++14 for the torch extension, while
# torch's headers need C++17. A compiler wrapper rewrites every C++14 flag to
# C++17. The TensorFlow extension is left out: it does not build against
# TensorFlow 2.21 (see README, strategy table).
#
# Needs: torch already installed in that environment (the extension is built
# against it), a C++ compiler, and make. No root. About 6 minutes on 2 cores.
#
# Usage: tools/install_horovod.sh            # into the active environment
#        PYTHON=/path/to/python tools/install_horovod.sh
set -euo pipefail

PYTHON="${PYTHON:-python}"
HOROVOD_VERSION="${HOROVOD_VERSION:-0.28.1}"

if "$PYTHON" -c "import horovod.torch" 2>/dev/null; then
  echo "install_horovod: horovod.torch already importable; nothing to do"
  exit 0
fi
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  echo "install_horovod: error: torch is not installed for $PYTHON;" \
       "install it first (pip install '.[torch]')" >&2
  exit 1
fi

REAL_CXX="${CXX:-$(command -v g++ || command -v c++ || true)}"
if [[ -z "$REAL_CXX" ]]; then
  echo "install_horovod: error: no C++ compiler (g++ or c++) on PATH" >&2
  exit 1
fi

# Horovod's build needs CMake >= 3.13; the PyPI wheel needs no root.
if ! command -v cmake >/dev/null 2>&1; then
  "$PYTHON" -m pip install --quiet "cmake>=3.13,<4"
  # The wheel's cmake lands next to the environment's python.
  PATH="$(dirname "$("$PYTHON" -c 'import sys; print(sys.executable)')"):$PATH"
  export PATH
fi

WORK_DIR="$(mktemp -d)"
trap 'rm -rf "$WORK_DIR"' EXIT

# The wrapper: the same compiler, with C++14 requests raised to C++17.
cat >"$WORK_DIR/cxx17" <<WRAPPER
#!/usr/bin/env bash
args=()
for arg in "\$@"; do
  case "\$arg" in
    -std=c++14) args+=("-std=c++17") ;;
    -std=gnu++14) args+=("-std=gnu++17") ;;
    *) args+=("\$arg") ;;
  esac
done
exec "$REAL_CXX" "\${args[@]}"
WRAPPER
chmod +x "$WORK_DIR/cxx17"

# --no-build-isolation: the extension must compile against the torch that is
# installed here, not a fresh one pip would fetch into an isolated build env.
"$PYTHON" -m pip install --quiet setuptools wheel
CXX="$WORK_DIR/cxx17" \
HOROVOD_WITH_PYTORCH=1 \
HOROVOD_WITHOUT_TENSORFLOW=1 \
HOROVOD_WITHOUT_MXNET=1 \
HOROVOD_WITHOUT_MPI=1 \
HOROVOD_WITH_GLOO=1 \
HOROVOD_CPU_OPERATIONS=gloo \
"$PYTHON" -m pip install --no-build-isolation --no-cache-dir \
    "horovod==${HOROVOD_VERSION}"

"$PYTHON" -c "import horovod.torch as hvd; \
assert hvd.gloo_built(), 'Horovod was built without Gloo'; \
print('install_horovod: horovod', __import__('horovod').__version__, \
'with PyTorch and Gloo')"
