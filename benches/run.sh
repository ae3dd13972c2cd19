#!/usr/bin/env bash
# Runs the CPU benchmarks with numpy as the peer, installing numpy into target/bench-venv.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x target/bench-venv/bin/python ]; then
  python3 -m venv target/bench-venv
  target/bench-venv/bin/pip install --quiet numpy
fi
target/bench-venv/bin/python -c "import numpy; print('numpy', numpy.__version__, 'with', numpy.show_config.__module__ and '')" 2>/dev/null || true
cargo bench --bench cpu
