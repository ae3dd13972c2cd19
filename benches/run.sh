#!/usr/bin/env bash
# Runs the benchmarks with their peers in the same run.
#   benches/run.sh         CPU backend against numpy (installs numpy into target/bench-venv)
#   benches/run.sh train   one train step against PyTorch on the CPU (installs torch into
#                          target/torch-venv; the PyPI wheel brings CUDA libraries, ~5 GB)
#   benches/run.sh onnx    torchvision CNNs, ViT-B/16 and a small transformer encoder through tcc
#                          against onnxruntime (see benches/onnx.rs)
#                          (installs torch, torchvision, onnx and onnxruntime into target/torch-venv)
#   benches/run.sh int8    resnet18 and mobilenet_v2 at batch 1 and 8: tcc float, tcc int8 (its own
#                          `tcc quantize` and onnxruntime's QDQ model) and onnxruntime float and
#                          int8 (see benches/int8.py; the same venv as onnx); `int8 avx2`: tcc
#                          with --target host,-avx512f,-avxvnni, its model --reduce-range;
#                          `int8 vnni`: tcc with --target host,-amx
# Per layer, one model against onnxruntime's own profiler (after `run.sh onnx` wrote the models):
#   target/torch-venv/bin/python benches/layers.py target/onnx-bench/MODEL.onnx
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-cpu}" in
  cpu)
    if [ ! -x target/bench-venv/bin/python ]; then
      python3 -m venv target/bench-venv
      target/bench-venv/bin/pip install --quiet numpy
    fi
    export TCC_PYTHON=target/bench-venv/bin/python
    cargo bench --bench cpu
    ;;
  train)
    if ! target/torch-venv/bin/python -c "import torch" 2>/dev/null; then
      python3 -m venv target/torch-venv
      target/torch-venv/bin/pip install --quiet --upgrade pip
      target/torch-venv/bin/pip install --quiet torch numpy
    fi
    target/torch-venv/bin/python -c "import torch; print('torch', torch.__version__)"
    TCC_TORCH_PYTHON=target/torch-venv/bin/python cargo bench --bench train
    ;;
  onnx)
    if ! target/torch-venv/bin/python -c "import torch, torchvision, onnx, onnxruntime" 2>/dev/null; then
      python3 -m venv target/torch-venv
      target/torch-venv/bin/pip install --quiet --upgrade pip
      target/torch-venv/bin/pip install --quiet torch torchvision numpy onnx==1.22.0 onnxruntime
    fi
    TCC_TORCH_PYTHON=target/torch-venv/bin/python cargo bench --bench onnx
    ;;
  int8)
    if ! target/torch-venv/bin/python -c "import torch, torchvision, onnx, onnxruntime" 2>/dev/null; then
      python3 -m venv target/torch-venv
      target/torch-venv/bin/pip install --quiet --upgrade pip
      target/torch-venv/bin/pip install --quiet torch torchvision numpy onnx==1.22.0 onnxruntime
    fi
    cargo build --release --bin tcc
    target/torch-venv/bin/python benches/int8.py target/release/tcc target/onnx-bench 2 30 ${2:-}
    ;;
  *)
    echo "usage: benches/run.sh [cpu|train|onnx|int8 [avx2|vnni]]" >&2
    exit 2
    ;;
esac
