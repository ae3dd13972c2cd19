#!/usr/bin/env bash
# Seeds fuzz/corpus/onnx_import with small real models: the ONNX node test cases of the ops the
# importer lowers (from the onnx wheel the conformance test installs into target/onnx-venv) and
# the PyTorch exports under tests/data/torch. Run from the repository root; then
#   cd fuzz && cargo fuzz run -s none onnx_import -- -runs=10000000
set -euo pipefail
cd "$(dirname "$0")/.."
out=fuzz/corpus/onnx_import
mkdir -p "$out"
node=$(ls -d target/onnx-venv/lib/python3*/site-packages/onnx/backend/test/data/node 2>/dev/null | head -1)
if [ -z "$node" ]; then
  echo "no onnx wheel in target/onnx-venv: run 'cargo test --test onnx' once first" >&2
  exit 1
fi
for d in "$node"/test_*; do
  name=$(basename "$d")
  # Models with data over 64 KiB make slow fuzz inputs.
  if [ -f "$d/model.onnx" ] && [ "$(stat -c %s "$d/model.onnx")" -lt 65536 ]; then
    cp "$d/model.onnx" "$out/$name.onnx"
  fi
done
for f in $(find tests/data/torch -name model.onnx); do
  cp "$f" "$out/torch-$(basename "$(dirname "$f")").onnx"
done
echo "$(ls "$out" | wc -l) seeds in $out"
